"""Slurm: the state mapping on recorded squeue/scontrol/sacct outputs (tests/data/slurm/), the
watchdog's --slurm-job path over those recordings replayed as a job's life (PENDING, RUNNING, its
end) on a fake clock, and a live single-node Slurm (Debian's slurm-wlm + munge) when it can run here."""
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, assert_checkin_agrees, kind_of, missing, need, read_json, step_of, wait_for
from supervise.thresholds import Thresholds
from supervise.observe.engines.slurm import SlurmJob, query, slurm_anomaly
from supervise.tools.watch import Watchdog
from supervise.tools.watch import run as run_watch

DATA = Path(__file__).parent / "data"
REC = DATA / "slurm"


def recorded(path: Path, **subst):
    text = path.read_text()
    for k, v in subst.items():
        text = text.replace("{" + k + "}", v)
    body, _, rc = text.rstrip("\n").rpartition("\n")
    return int(rc.split("=")[1]), body + "\n"


def replay(squeue=None, scontrol=None, sacct=None, **subst):
    """A runner with subprocess.run's signature that answers each Slurm command with its
    recorded output; a command without a recording is 'not installed'."""
    files = {"squeue": squeue, "scontrol": scontrol, "sacct": sacct}
    calls = []

    def run(argv, capture_output=True, text=True, timeout=None):
        calls.append(argv[0])
        name = files.get(argv[0])
        if name is None:
            raise FileNotFoundError(argv[0])
        rc, out = recorded(REC / name, **subst)
        return subprocess.CompletedProcess(argv, rc, out if rc == 0 else "", out if rc else "")

    run.calls = calls
    return run


GONE = "unknown.squeue"   # squeue: "slurm_load_jobs error: Invalid job id specified"


@pytest.mark.parametrize("job_id, sources, state, running, kind, words", [
    ("3", ("pending.squeue", None, None), "PENDING", False, None, []),
    ("8", ("running.squeue", None, None), "RUNNING", True, None, []),
    ("1", ("completed.squeue", "completed.scontrol", None), "COMPLETED", False, "dead",
     ["slurm job 1 state = COMPLETED exit code 0 without final_val_metrics.json", "/tmp/sl/ok-1.out"]),
    ("4", ("cancelled.squeue", "cancelled.scontrol", "no_accounting.sacct"), "CANCELLED", False, "dead",
     ["slurm job 4 state = CANCELLED (canceller unknown without accounting)"]),
    ("8", ("node_fail.squeue", "node_fail.scontrol", None), "NODE_FAIL", False, "node_fail",
     ["slurm job 8 state = NODE_FAIL on vm", "sbatch --exclude=vm", "scontrol requeue 8"]),
    ("9", ("timeout.squeue", "timeout.scontrol", None), "TIMEOUT", False, "timeout",
     ["slurm job 9 state = TIMEOUT (time limit reached) on vm", "--time"]),
    ("27", ("preempted.squeue", "preempted.scontrol", None), "PREEMPTED", False, "preempted",
     ["slurm job 27 state = PREEMPTED on vm", "scontrol requeue 27"]),
    # squeue forgot the job (past MinJobAge): sacct
    ("123456", (GONE, None, "oom_cgroup.sacct"), "OUT_OF_MEMORY", False, "oom",
     ["slurm job 123456 state = OUT_OF_MEMORY on gpu-a01", "--mem"]),
    ("22", (GONE, None, "timeout.sacct"), "TIMEOUT", False, "timeout", ["slurm job 22 state = TIMEOUT (time limit reached) on vm"]),
    ("27", (GONE, None, "preempted.sacct"), "PREEMPTED", False, "preempted", ["scontrol requeue 27"]),
    ("25", (GONE, None, "cancelled.sacct"), "CANCELLED", False, "dead", ["slurm job 25 state = CANCELLED by root (uid 0) at"]),
    ("30", (GONE, None, "cancelled_running.sacct"), "CANCELLED", False, "dead", ["CANCELLED by root (uid 0)"]),
    ("23", (GONE, None, "completed.sacct"), "COMPLETED", False, "dead", ["without final_val_metrics.json"]),
    ("29", (GONE, None, "node_fail.sacct"), "NODE_FAIL", False, "node_fail", ["sbatch --exclude=vm"]),
])
def test_state_mapping_on_recorded_outputs(job_id, sources, state, running, kind, words):
    run = replay(*sources)
    job = query(job_id, runner=run)
    assert job.error is None and job.state == state and job.running is running
    a = slurm_anomaly(job, sentinel_present=False, step=120)
    assert (a.kind if a else None) == kind
    for w in words:
        assert w in a.message
    if a:
        assert a.message.startswith(f"ANOMALY {kind}: slurm job {job_id} state = ") and " at step 120. " in a.message
        assert slurm_anomaly(job, sentinel_present=True, step=120) is None   # the run finished: no alarm


def test_running_job_has_its_output_path_expanded():
    job = query("8", runner=replay("running.squeue", "running.scontrol"))
    assert job.stdout == "/tmp/sl/nf-8.out" and job.nodes == "vm" and job.source == "squeue"
    alone = query("8", runner=replay("running.squeue"))       # no scontrol: squeue's %j expanded here
    assert alone.stdout == "/tmp/sl/nf-8.out" and alone.running


def test_failed_job_reports_the_first_failing_ranks_error_from_its_output(tmp_path):
    """FAILED (sacct, squeue forgot the job): the output file slurm-ID.out in WorkDir holds
    torchrun's failure block (a real torchrun job under Slurm, rank 1 raising); the crash names
    rank 1's own error, not rank 0's fallout."""
    (tmp_path / "slurm-24.out").write_bytes((REC / "failed-job.out").read_bytes())
    job = query("24", runner=replay(GONE, None, "failed.sacct", workdir=str(tmp_path)))
    assert (job.state, job.exit_code, job.signal) == ("FAILED", 1, 0)
    assert job.stdout == str(tmp_path / "slurm-24.out")
    a = slurm_anomaly(job, sentinel_present=False, step=6)
    assert a.kind == "crash"
    assert "slurm job 24 state = FAILED exit code 1 on vm: 'rank 1 (local_rank 1, pid 29676 on localhost) " \
           "exitcode 1: RuntimeError: injected failure on rank 1 at step 6'" in a.message
    assert "Connection closed" not in a.message


def test_memory_limit_kill_without_cgroups_is_an_oom(tmp_path):
    """Without task/cgroup Slurm kills a job over --mem with SIGKILL: FAILED 0:9, and slurmstepd
    says why in the job's output."""
    (tmp_path / "slurm-26.out").write_bytes((REC / "oom-job.out").read_bytes())
    job = query("26", runner=replay(GONE, None, "oom.sacct", workdir=str(tmp_path)))
    assert (job.state, job.exit_code, job.signal) == ("FAILED", 0, 9)
    a = slurm_anomaly(job, sentinel_present=False, step=3)
    assert a.kind == "oom" and "exit code 0 signal 9 on vm" in a.message and "Exceeded job memory limit" in a.message
    assert "--mem" in a.message


def test_failed_job_with_a_plain_traceback_and_with_an_oom():
    job = query("2", runner=replay("failed.squeue", "failed.scontrol"))
    assert (job.state, job.exit_code, job.stdout) == ("FAILED", 3, "/tmp/sl/fail-2.out")
    crash = slurm_anomaly(job, False, 7, log_lines=["start", "Traceback (most recent call last):",
                                                    '  File "<string>", line 1, in <module>', "ValueError: boom"])
    assert crash.kind == "crash" and "exit code 3 on vm: 'ValueError: boom'" in crash.message
    oom = slurm_anomaly(job, False, 7, log_lines=["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"])
    assert oom.kind == "oom"
    bare = slurm_anomaly(job, False, 7, log_lines=[])
    assert bare.kind == "crash" and "(no traceback in /tmp/sl/fail-2.out)" in bare.message


@pytest.mark.parametrize("runner, words", [
    (replay(), "squeue not found: Slurm's client commands are not on PATH"),
    (replay(GONE, None, "no_accounting.sacct"),
     "job 999 unknown to squeue (slurm_load_jobs error: Invalid job id specified) and to sacct (Slurm accounting storage is disabled)"),
    (replay(GONE, None, "dbd_down.sacct"), "Problem talking to the database"),
])
def test_unknown_state_is_an_error_value_not_an_exception(runner, words):
    job = query("999", runner=runner)
    assert job.state is None and words in job.error
    assert slurm_anomaly(job, False, 0) is None


def test_slow_scheduler_and_bad_id():
    def slow(argv, **kw):
        raise subprocess.TimeoutExpired(argv, kw.get("timeout"))
    job = query("5", runner=slow)
    assert job.state is None and "squeue did not answer within 10s" in job.error
    bad = query("12; rm -rf /", runner=replay())
    assert bad.error.startswith("bad Slurm job id '12; rm -rf /'")


def test_requeue_hold_and_cancelled_by_a_user():
    job = SlurmJob("77", state="REQUEUE_HOLD", nodes="gpu-a01")
    assert "scontrol release 77" in slurm_anomaly(job, False, 3).message
    job = SlurmJob("78", state="CANCELLED", cancelled_by="alice (uid 1000)", command="/home/alice/train.sbatch",
                   workdir="/home/alice")
    msg = slurm_anomaly(job, False, 3).message
    assert "CANCELLED by alice (uid 1000)" in msg and "cd /home/alice && sbatch /home/alice/train.sbatch" in msg


# --- the watchdog's --slurm-job path: the observer over a replayed scheduler ------------------

PENDING = ("pending.squeue", "pending.scontrol", None)   # recorded for job 3: squeue --jobs prints the one job asked
RUNNING = ("running.squeue", "running.scontrol", None)
LIMITS = Thresholds(poll=0.01, startup_grace=60, max_stall=120)   # seconds of the fake clock


class Scheduler:
    """squeue/scontrol/sacct whose answers change over time: each squeue call (the observer makes
    one per poll) answers with the next phase's recordings, the last phase for ever after."""

    def __init__(self, *phases):
        self.phases, self.at = [replay(*p) for p in phases], -1

    def __call__(self, argv, **kw):
        if argv[0] == "squeue":
            self.at = min(self.at + 1, len(self.phases) - 1)
        return self.phases[max(self.at, 0)](argv, **kw)


class Clock:
    """The watchdog's clock, moved by the test: no real waiting."""

    def __init__(self):
        self.now = time.time()

    def __call__(self):
        return self.now


def write(run: Path, clock: Clock, *recs) -> None:
    """The job's trainer (on a compute node) appends records at the clock's time."""
    with open(run / "metrics.jsonl", "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in recs)
    os.utime(run / "metrics.jsonl", (clock.now, clock.now))


def start_record(clock: Clock) -> dict:
    return {"event": "start", "t": 0, "run_id": "job", "attempt": 1, "time": clock.now, "pid": 4242,
            "host": "compute-node-7"}


def step(n: int) -> dict:
    return {"step": n, "t": n, "loss": 0.5, "lr": 1e-4, "grad_norm": 1.0, "sps": 10.0}


def watchdog(run: Path, job_id: str, scheduler: Scheduler, clock: Clock) -> Watchdog:
    """The watchdog of ``watchdog.py RUN --slurm-job ID``, its scheduler and clock replaced."""
    run.mkdir(exist_ok=True)
    return Watchdog(run, LIMITS, job=("slurm", job_id), runner=scheduler, clock=clock)


def fake_slurm(tmp_path: Path, squeue: str, scontrol: str) -> dict:
    """An environment whose squeue and scontrol answer with these recordings (for check-in)."""
    bin_dir = tmp_path / "slurm-bin"
    bin_dir.mkdir()
    for name, rec in (("squeue", squeue), ("scontrol", scontrol)):
        rc, body = recorded(REC / rec)
        (bin_dir / f"{name}.out").write_text(body)
        (bin_dir / name).write_text(f"#!/bin/sh\ncat {bin_dir / name}.out\nexit {rc}\n")
        (bin_dir / name).chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


@pytest.mark.parametrize("job_id, end, kind, said", [
    ("8", ("node_fail.squeue", "node_fail.scontrol", None), "node_fail", "slurm job 8 state = NODE_FAIL on vm"),
    ("9", ("timeout.squeue", "timeout.scontrol", None), "timeout", "slurm job 9 state = TIMEOUT (time limit reached) on vm"),
    ("27", ("preempted.squeue", "preempted.scontrol", None), "preempted", "slurm job 27 state = PREEMPTED on vm"),
], ids=["node_fail", "timeout", "preempted"])
def test_the_watchdog_follows_a_job_from_the_queue_to_its_end(job_id, end, kind, said, tmp_path):
    """``--slurm-job ID``: ten minutes PENDING (past the 60 s start-up grace and the 120 s stall
    limit) is no alarm; the grace starts when the job runs; records while RUNNING are healthy; the
    scheduler's end state is the verdict, and check-in says the same."""
    run, clock = tmp_path / "run", Clock()
    w = watchdog(run, job_id, Scheduler(*[PENDING] * 6, RUNNING, *[RUNNING] * 4, end), clock)
    for _ in range(6):
        clock.now += 100
        v = w.poll()
        assert (v.state, v.headline, v.line) == ("watching", "STARTING", ""), v   # queued, not failed
        assert any(n.startswith(f"Slurm job {job_id} is PENDING") for n in v.notes), v
        assert read_json(run / "watchdog.json")["job_state"] == "PENDING"
    clock.now += 50  # running 50 s, no record yet: within the grace, which began when it ran
    v = w.poll()
    assert (v.state, v.line) == ("watching", ""), v
    assert read_json(run / "watchdog.json")["job_state"] == "RUNNING"
    for n in range(1, 5):
        clock.now += 30
        write(run, clock, *([start_record(clock)] if n == 1 else []), step(10 * n))
        v = w.poll()
        assert (v.state, v.headline, v.line) == ("watching", "RUNNING healthy", ""), v
    clock.now += 30
    out = io.StringIO()
    assert run_watch(w, out=out) == 7
    line = out.getvalue().strip()
    assert kind_of(line) == kind and step_of(line) == 40 and line.startswith(f"ANOMALY {kind}: {said}"), line
    state = read_json(run / "watchdog.json")
    assert (state["state"], state["kind"], state["job_id"], state["job_state"]) == \
        ("anomaly", kind, job_id, end[0].split(".")[0].upper())
    assert_checkin_agrees(run, line, env=fake_slurm(tmp_path, end[0], end[1]))


@pytest.mark.parametrize("quiet, kind", [("no_record", "no_telemetry"), ("records_stop", "stall")])
def test_once_the_job_runs_the_grace_and_the_stall_limit_count(quiet, kind, tmp_path):
    """The control: the same limits that PENDING holds off do fire while the job RUNs: no step
    record 61 s after it began to run, or none for 121 s after the last."""
    run, clock = tmp_path / "run", Clock()
    w = watchdog(run, "8", Scheduler(PENDING, RUNNING), clock)
    clock.now += 1000
    assert w.poll().state == "watching"  # ~17 minutes PENDING
    clock.now += 1
    if quiet == "records_stop":
        write(run, clock, start_record(clock), step(10))
    assert w.poll().state == "watching"  # RUNNING from here
    clock.now += 59
    assert w.poll().state == "watching", w.verdict
    clock.now += 2 if quiet == "no_record" else 62
    v = w.poll()
    assert v.state == "anomaly" and kind_of(v.line) == kind, v


def test_a_job_requeued_to_pending_after_it_ran_is_no_stall(tmp_path):
    """PENDING is no stall (watchdog.py --help) also after a requeue: the records stop while the job
    waits; once it runs again its start-up grace comes first, then the stall limit counts."""
    run, clock = tmp_path / "run", Clock()
    w = watchdog(run, "8", Scheduler(RUNNING, RUNNING, *[PENDING] * 5, RUNNING), clock)
    for n in (1, 2):
        clock.now += 10
        write(run, clock, *([start_record(clock)] if n == 1 else []), step(10 * n))
        assert w.poll().state == "watching"
    for _ in range(5):  # requeued: 500 s in the queue, no record
        clock.now += 100
        v = w.poll()
        assert (v.state, v.line) == ("watching", ""), v
    clock.now += 1
    assert w.poll().state == "watching"   # running again from here, its records 501 s old
    clock.now += 55
    assert w.poll().state == "watching", w.verdict   # loading again: within the 60 s start-up grace
    clock.now += 10
    v = w.poll()  # 65 s running, no new record, the last 566 s old: past the grace, a stall
    assert v.state == "anomaly" and kind_of(v.line) == "stall", v


# --- a live single-node Slurm -----------------------------------------------------------------

def _node_up() -> bool:
    try:
        p = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return p.returncode == 0 and any(s.strip("*~#") in ("idle", "mixed", "allocated") for s in p.stdout.split())


def _pid(path):
    try:
        return int(Path(path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


@pytest.fixture(scope="session")
def slurm():
    """A running single-node Slurm: the one already up, or one started by .ci/slurm-setup.sh
    (and stopped again at the end of the session: only the daemons it started)."""
    absent = [c for c in ("sbatch", "squeue", "scontrol", "slurmctld", "slurmd", "munged") if not shutil.which(c)]
    if absent:
        missing(f"Slurm is not installed ({', '.join(absent)} missing): run .ci/slurm-setup.sh as root "
                "(apt-get install slurm-wlm munge)")
    started = []
    if not _node_up():
        if os.geteuid() != 0:
            missing("Slurm is installed but not running, and starting slurmctld/slurmd needs root")
        daemons = (("slurmd", "/run/slurmd.pid"), ("slurmctld", "/run/slurmctld.pid"), ("slurmdbd", "/run/slurmdbd.pid"),
                   ("mariadbd", "/run/mysqld/mysqld.pid"), ("munged", "/run/munge/munged.pid"))
        before = {n: _pid(f) for n, f in daemons}
        subprocess.run(["bash", str(ROOT / ".ci" / "slurm-setup.sh"), "--start"], capture_output=True, timeout=120)
        try:
            wait_for(_node_up, "slurmctld/slurmd to bring the node up", timeout=60, tick=1)
        except AssertionError:
            missing("slurmctld/slurmd did not bring the node up within 60 s (see /var/log/slurm/)")
        started = [p for n, f in daemons if (p := _pid(f)) and p != before[n]]
    yield
    for pid in started:  # only the daemons this session started, slurmd first
        try:
            os.kill(pid, 15)
        except ProcessLookupError:
            continue
        with contextlib.suppress(AssertionError):
            wait_for(lambda: not Path(f"/proc/{pid}").exists(), f"daemon pid {pid} to end", timeout=15, tick=0.2)


def sbatch(*args) -> str:
    p = subprocess.run(["sbatch", "--parsable", *map(str, args)], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip().split(";")[0]


def wait_state(job_id, done, timeout=120):
    return wait_for(lambda: (job := query(job_id)) and done(job) and job, f"job {job_id} to reach the state asked",
                    timeout, tick=0.5, why=lambda: f"it stayed {query(job_id)}")


def test_live_pending_then_cancelled(slurm, tmp_path):
    jid = sbatch("--begin=now+1hour", "-o", tmp_path / "train.log", "--wrap", "sleep 1")
    job = wait_state(jid, lambda j: j.state is not None)
    assert job.state == "PENDING" and not job.running and job.waiting
    assert slurm_anomaly(job, sentinel_present=False, step=0) is None      # queued is not a stall
    subprocess.run(["scancel", jid], timeout=30, check=True)
    job = wait_state(jid, lambda j: j.finished)
    a = slurm_anomaly(job, sentinel_present=False, step=0)
    assert a.kind == "dead" and f"slurm job {jid} state = CANCELLED" in a.message


def test_live_running_then_completed_without_sentinel(slurm, tmp_path):
    jid = sbatch("-o", tmp_path / "train-%j.out", "--wrap", "echo training; sleep 3")
    job = wait_state(jid, lambda j: j.running or j.finished)
    job = wait_state(jid, lambda j: j.finished)
    assert job.state == "COMPLETED" and job.stdout == str(tmp_path / f"train-{jid}.out")
    assert slurm_anomaly(job, sentinel_present=False, step=0).kind == "dead"
    assert slurm_anomaly(job, sentinel_present=True, step=0) is None


def test_live_torchrun_job_failing_on_rank_1_is_a_crash_with_its_root_cause(slurm, tmp_path):
    need("torch")
    run = tmp_path / "run"
    run.mkdir()
    torchrun = Path(sys.executable).with_name("torchrun")
    jid = sbatch("-o", run / "train.log", "--chdir", tmp_path, "--wrap",
                 f"exec {torchrun} --nproc_per_node 2 {ROOT / 'tests' / 'ddp_loop.py'} --out {run} "
                 "--raise-rank 1 --raise-step 6")
    job = wait_state(jid, lambda j: j.finished, timeout=240)
    assert (job.state, job.exit_code) == ("FAILED", 1), (run / "train.log").read_text()[-2000:]
    assert job.stdout == str(run / "train.log")
    a = slurm_anomaly(job, sentinel_present=False, step=6)
    assert a.kind == "crash"
    assert "exitcode 1: RuntimeError: injected failure on rank 1 at step 6" in a.message and "rank 1 (local_rank 1" in a.message


def test_live_preempted_by_a_higher_priority_partition(slurm, tmp_path):
    cpus = str(os.cpu_count())
    low = sbatch("-p", "debug", "-c", cpus, "-o", tmp_path / "low.out", "--wrap", "sleep 300")
    wait_state(low, lambda j: j.running or j.finished)
    high = sbatch("-p", "urgent", "-c", cpus, "-o", tmp_path / "high.out", "--wrap", "sleep 1")
    job = wait_state(low, lambda j: j.finished)
    a = slurm_anomaly(job, sentinel_present=False, step=50)
    assert job.state == "PREEMPTED" and a.kind == "preempted"
    assert f"scontrol requeue {low}" in a.message
    wait_state(high, lambda j: j.finished)


def test_live_memory_limit_kill_is_an_oom(slurm, tmp_path):
    grow = "import time\nx = []\nfor i in range(40):\n    x.append(bytearray(50 << 20)); time.sleep(0.1)\n"
    (tmp_path / "grow.py").write_text(grow)
    jid = sbatch("--mem=100M", "-o", tmp_path / "train.log", "--wrap", f"{sys.executable} {tmp_path / 'grow.py'}")
    job = wait_state(jid, lambda j: j.finished)
    assert (job.state, job.signal) == ("FAILED", 9), (tmp_path / "train.log").read_text()
    a = slurm_anomaly(job, sentinel_present=False, step=0)
    assert a.kind == "oom" and "exceeded" in a.message.lower()


def test_live_sacct_once_squeue_forgot_the_job(slurm, tmp_path):
    probe = subprocess.run(["sacct", "-X", "-n", "-j", "1"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        missing(f"sacct needs Slurm accounting (slurmdbd): {probe.stderr.strip()[:120]} "
                "(.ci/slurm-setup.sh --accounting sets it up)")
    jid = sbatch("--chdir", tmp_path, "--wrap", "echo start; python3 -c 'raise KeyError(\"label\")'")
    wait_state(jid, lambda j: j.finished)

    def forgotten(argv, **kw):  # squeue past MinJobAge; sacct and scontrol are real
        if argv[0] == "squeue":
            return subprocess.CompletedProcess(argv, 1, "", "slurm_load_jobs error: Invalid job id specified\n")
        return subprocess.run(argv, **kw)

    # slurmdbd completes its record (WorkDir, JobName) a moment after the end
    job = wait_for(lambda: (j := query(jid, runner=forgotten)) and j.finished and j.workdir and j,
                   "sacct's complete record", timeout=60, tick=1, why=lambda: str(query(jid, runner=forgotten)))
    assert (job.source, job.state, job.exit_code) == ("sacct", "FAILED", 1), job
    assert job.stdout == str(tmp_path / f"slurm-{jid}.out")
    a = slurm_anomaly(job, sentinel_present=False, step=0)
    assert a.kind == "crash" and "KeyError: 'label'" in a.message


def test_live_preemption_resubmission_queue_wait_then_ok_done(slurm, tmp_path):
    """The loop closed on Slurm: a job submitted through the launcher (--slurm) is preempted by the
    urgent partition; check-in's next: lines, run as they are, resubmit it through the launcher
    and start a watchdog without --slurm-job, which follows the new job from launch.json: silent
    while the urgent job holds the node longer than the start-up grace (the old job's records and
    its preemption line are never judged again), then OK done, resumed from the last checkpoint."""
    import shlex
    from conftest import attempts, launch, run_script
    from supervise.observe.state import read_launch
    cpus = str(os.cpu_count())
    run = tmp_path / "run"
    loop = ROOT / "tests" / "resumable_loop.py"
    p = launch(tmp_path, run, sys.executable, "-u", loop, "--out", run, "--steps", "400", "--dt", "0.05",
               extra=["--slurm", "--sbatch=--partition=debug", f"--sbatch=--cpus-per-task={cpus}"])
    assert p.returncode == 0 and p.stdout.startswith("submitted Slurm job "), p.stdout + p.stderr
    first = read_launch(run)["job_id"]
    wd = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "watchdog.py"), str(run), "--poll", "0.5",
                           "--startup-grace", "6s"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: any(r.get("step", 0) >= 60 for r in (attempts(run) or [[]])[0]), "step 60 of the first job",
                 timeout=180, tick=0.5)
        urgent = sbatch("-p", "urgent", "-c", cpus, "-o", tmp_path / "urgent.out", "--wrap", "sleep 20")
        out, err = wd.communicate(timeout=120)
    finally:
        if wd.poll() is None:
            wd.kill()
            wd.wait()
    assert wd.returncode == 7 and kind_of(out) == "preempted" and f"slurm job {first}" in out, out + err
    rc, text, err = run_script("checkin.py", run)
    nxt = [ln[len("next: "):] for ln in text.splitlines() if ln.startswith("next: ")]
    assert len(nxt) == 2 and " --replace --slurm --sbatch=--partition=debug " in nxt[0], text
    assert shlex.split(nxt[0])[-2:] == ["--resume", str(run / "checkpoints" / "step-50.pt")], text
    assert "--slurm-job" not in nxt[1] and nxt[1].endswith("--poll 0.5 --startup-grace 6s"), text
    p = subprocess.run(["bash", "-c", nxt[0]], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.startswith("submitted Slurm job "), p.stdout + p.stderr
    second = read_launch(run)["job_id"]
    assert second != first and read_launch(run)["earlier"][0]["job_id"] == first
    assert query(second).waiting, query(second)   # the urgent job holds the node
    rc, text, err = run_script("checkin.py", run)
    assert text.startswith("STARTING ") and f"note: Slurm job {second} is PENDING" in text, text
    t0 = time.monotonic()
    p = subprocess.run(["bash", "-c", nxt[1]], capture_output=True, text=True, timeout=240)
    waited = time.monotonic() - t0
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.startswith("OK done: final_val_metrics.json written at step 400/400 (attempt 2)"), p.stdout + p.stderr
    a1, a2 = attempts(run)
    assert a2[0]["slurm_job_id"] == second and next(r["step"] for r in a2 if "loss" in r) == 60
    assert waited > 6, waited   # it sat through the queue wait, past the start-up grace, silent
    wait_state(urgent, lambda j: j.finished)


def test_live_stop_cancels_a_job_the_launcher_submitted(slurm, tmp_path):
    from conftest import launch, run_script
    run = tmp_path / "run"
    p = launch(tmp_path, run, "sleep", "300", extra=["--slurm"])
    assert p.returncode == 0 and p.stdout.startswith("submitted Slurm job "), p.stdout + p.stderr
    jid = p.stdout.split()[3].rstrip(",")
    wait_state(jid, lambda j: j.running or j.waiting)
    rc, out, err = run_script("stop.py", run)
    assert rc == 0 and out.strip() == f"cancelled Slurm job {jid} (scancel)", out + err
    assert wait_state(jid, lambda j: j.finished).state == "CANCELLED"
    rc, out, err = run_script("stop.py", run)
    assert rc == 0 and out.strip() == f"Slurm job {jid} has already ended; nothing to stop", out + err
