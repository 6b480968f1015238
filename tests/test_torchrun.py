"""Real torchrun --nproc_per_node 2 (gloo, CPU) runs of tests/ddp_loop.py, launched through a shell
with output appended to RUN_DIR/train.log; rank 1 is stopped, killed or raises, and the rank APIs,
polled as the watchdog will poll them, name rank 1 and its root cause."""
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import assert_checkin_agrees

pytest.importorskip("torch")

from supervise import probes  # noqa: E402
from supervise.logs import cgroup_dir, kernel_oom_lines, killed_reason, last_error, log_tail, oom_kills, root_cause  # noqa: E402
from supervise.ranks import RankFiles, local_pids, rank_dead, rank_hang, rank_lines, root_cause_anomaly, straggler  # noqa: E402

LOOP = Path(__file__).parent / "ddp_loop.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")
if not TORCHRUN.exists():
    pytest.skip("torchrun is not installed next to this Python", allow_module_level=True)


class Job:
    def __init__(self, run_dir: Path, *args):
        run_dir.mkdir(parents=True, exist_ok=True)
        self.run_dir, self.log = run_dir, run_dir / "train.log"
        cmd = (f"exec '{TORCHRUN}' --nproc_per_node 2 '{LOOP}' --out '{run_dir}' "
               + " ".join(map(str, args)) + f" >> '{self.log}' 2>&1")
        self.proc = subprocess.Popen(["bash", "-c", cmd], start_new_session=True)
        self.files = RankFiles(run_dir)

    def worker_pids(self) -> list[int]:
        found = re.findall(r"^rank \d+/\d+ pid (\d+) started", self.log.read_text() if self.log.exists() else "", re.M)
        return sorted({int(p) for p in found} | {s.pid for s in self.files.poll().values() if s.pid})

    def wait_for_steps(self, n=2, timeout=180):
        end = time.time() + timeout
        while time.time() < end:
            ranks = self.files.poll()
            if len(ranks) == 2 and all(s.records >= n for s in ranks.values()):
                return ranks
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            time.sleep(0.2)
        raise AssertionError("the two ranks never wrote heartbeats:\n" + self.log.read_text()[-3000:])

    def close(self):
        pids = self.worker_pids()   # torchrun starts each worker in a session of its own
        for pid in pids:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=60)


@pytest.fixture
def job(tmp_path):
    made = []

    def start(*args):
        j = Job(tmp_path / f"run{len(made)}", *args)
        made.append(j)
        return j

    yield start
    for j in made:
        j.close()


def poll(job, stall_s, until, timeout):
    """Poll like the watchdog: heartbeats, local process states, then the rank rules."""
    end = time.time() + timeout
    while time.time() < end:
        ranks = job.files.poll()
        procs = {pid: probes.process(pid).state for pid in local_pids(ranks)}
        got = until(ranks, procs)
        if got:
            return got, ranks, procs
        time.sleep(0.25)
    return None, job.files.poll(), {}


def test_sigstop_of_rank_1_is_named_within_45s(job):
    j = job()
    ranks = j.wait_for_steps()
    pid1 = ranks[1].pid
    os.kill(pid1, signal.SIGSTOP)
    t0 = time.time()
    found, ranks, procs = poll(j, 300, lambda r, p: rank_dead(r, p) or rank_hang(r, time.time(), p, stall_s=300), 45)
    took = time.time() - t0
    assert found is not None, f"nothing named rank 1 within 45 s: {rank_lines(ranks, time.time(), procs)}"
    assert found.kind == "rank_hang" and took < 45
    assert found.message.startswith(f"ANOMALY rank_hang: rank 1 (pid {pid1} on ")
    assert f"kill -CONT {pid1}" in found.message and "PID" not in found.message
    lines = rank_lines(ranks, time.time(), procs)
    assert len(lines) == 2 and "stopped" in lines[1] and lines[1].startswith("rank 1: step ")


def test_sigkill_of_rank_1_is_named_with_its_root_cause_within_20s(job):
    j = job()
    ranks = j.wait_for_steps()
    pid1 = ranks[1].pid
    cg = cgroup_dir(pid1)
    before = oom_kills(cg)
    os.kill(pid1, signal.SIGKILL)
    t0 = time.time()

    def named(ranks, procs):
        cause = root_cause(log_tail(j.log))
        dead = rank_dead(ranks, procs, cause)  # torchrun has SIGTERMed rank 0 by now: the cause says who was first
        return (dead, cause) if dead and cause else None

    found, ranks, _ = poll(j, 300, named, 20)
    took = time.time() - t0
    assert found is not None, "rank 1's death or torchrun's root cause missing after 20 s:\n" + j.log.read_text()[-3000:]
    dead, cause = found
    assert took < 20
    assert dead.kind == "dead" and dead.message.startswith(f"ANOMALY dead: rank 1 (pid {pid1} on ")
    assert (cause.rank, cause.pid, cause.exitcode, cause.signal) == (1, pid1, -9, "SIGKILL")
    killed = killed_reason(pid1, before, oom_kills(cg), kernel_oom_lines(pid1))
    assert killed.oom is False
    a = root_cause_anomaly(cause, step=ranks[1].step, killed=killed.text)
    assert a.kind == "crash"
    assert f"rank 1 (local_rank 1, pid {pid1} on " in a.message
    assert "exitcode -9 (SIGKILL): killed by SIGKILL (not shown to be OOM)" in a.message
    assert "rank 0" not in a.message and "SIGTERM" not in a.message   # rank 0 is fallout
    assert "=====" not in last_error(log_tail(j.log))


def test_rank_1_raising_is_reported_with_its_own_error(job):
    j = job("--raise-rank", 1, "--raise-step", 10)
    assert j.proc.wait(timeout=240) != 0
    tail = log_tail(j.log)
    assert any("Connection closed by peer" in ln for ln in tail)      # rank 0's fallout is in the log
    err = last_error(tail)
    assert re.fullmatch(r"rank 1 \(local_rank 1, pid \d+ on \S+\) exitcode 1: "
                        r"RuntimeError: injected failure on rank 1 at step 10", err), err
    a = root_cause_anomaly(root_cause(tail), step=10)
    assert a.kind == "crash" and "injected failure on rank 1" in a.message


def test_healthy_two_rank_run_names_nothing_and_finishes(job):
    j = job("--steps", 60)
    j.wait_for_steps()
    hits = []
    while j.proc.poll() is None:
        ranks = j.files.poll()
        procs = {pid: probes.process(pid).state for pid in local_pids(ranks)}
        now = time.time()
        hits += [a for a in (rank_hang(ranks, now, procs, stall_s=60), straggler(ranks, now, window_s=5)) if a]
        time.sleep(0.2)
    assert j.proc.returncode == 0, j.log.read_text()[-3000:]
    assert hits == []
    assert (j.run_dir / "final_val_metrics.json").exists()
    ranks = j.files.poll()
    assert sorted(ranks) == [0, 1] and all(s.step == 60 for s in ranks.values())


# The same faults through scripts/watchdog.py, as the agent runs it: no --pid, max-stall 300 s;
# the watchdog finds torchrun through train.log and the ranks through their heartbeats.
def watchdog(run_dir):
    return subprocess.Popen([sys.executable, str(Path(__file__).parents[1] / "scripts" / "watchdog.py"), str(run_dir),
                             "--poll", "0.5", "--max-stall", "300"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def test_watchdog_names_a_stopped_rank_within_45s(job):
    j = job()
    ranks = j.wait_for_steps()
    wd = watchdog(j.run_dir)
    time.sleep(2)
    pid1 = ranks[1].pid
    os.kill(pid1, signal.SIGSTOP)
    t0 = time.time()
    out, err = wd.communicate(timeout=90)
    assert wd.returncode == 7 and out.startswith(f"ANOMALY rank_hang: rank 1 (pid {pid1} on "), out + err
    assert time.time() - t0 < 45
    assert_checkin_agrees(j.run_dir, out.strip())


def test_watchdog_names_a_killed_rank_with_its_root_cause_within_20s(job):
    j = job()
    ranks = j.wait_for_steps()
    wd = watchdog(j.run_dir)
    time.sleep(2)
    pid1 = ranks[1].pid
    os.kill(pid1, signal.SIGKILL)
    t0 = time.time()
    out, err = wd.communicate(timeout=90)
    assert wd.returncode == 7 and out.startswith("ANOMALY crash: root cause = "), out + err
    assert f"rank 1 (local_rank 1, pid {pid1} on " in out and "killed by SIGKILL (not shown to be OOM)" in out
    assert "=====" not in out and "PID" not in out
    assert time.time() - t0 < 20
    assert_checkin_agrees(j.run_dir, out.strip())


def test_watchdog_says_ok_done_for_a_healthy_two_rank_run(job):
    j = job("--steps", 60)
    wd = watchdog(j.run_dir)
    out, err = wd.communicate(timeout=240)
    assert wd.returncode == 0 and out.startswith("OK done: final_val_metrics.json written at step 60"), out + err
