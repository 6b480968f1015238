"""Real torchrun --nproc_per_node 2 (gloo, CPU) runs of tests/ddp_loop.py, launched through a shell
with output appended to RUN_DIR/train.log; rank 1 is stopped, killed or raises, and the rank APIs,
polled as the watchdog will poll them, name rank 1 and its root cause."""
import os
import re
import signal
import subprocess
import time

from conftest import WATCHDOG, assert_checkin_agrees, kind_of, missing, need, start_script, wait_for, wait_for_polls

need("torch")

from supervise.observe import probes  # noqa: E402
from supervise.observe.logs import (cgroup_dir, is_environment, kernel_oom_lines, killed_reason, last_error,  # noqa: E402
                                    log_tail, oom_kills, root_cause)
from supervise.observe.ranks import local_pids, rank_dead, rank_hang, rank_lines, root_cause_anomaly, straggler  # noqa: E402
from torchrun_job import TORCHRUN, job  # noqa: E402,F401  (job: the fixture)

if not TORCHRUN.exists():
    missing(f"torchrun is not installed next to this Python ({TORCHRUN}): torch's install puts it there")


def poll(job, until, what, timeout):
    """Poll like the watchdog (heartbeats, local process states, then the rank rules) until
    ``until(ranks, procs)`` names something: (it, ranks, procs)."""
    def look():
        ranks = job.files.poll()
        procs = {pid: probes.process(pid).state for pid in local_pids(ranks)}
        got = until(ranks, procs)
        return got and (got, ranks, procs)

    def lines():
        ranks = job.files.poll()
        procs = {pid: probes.process(pid).state for pid in local_pids(ranks)}
        return "\n".join(rank_lines(ranks, time.time(), procs)) + "\n" + job.log.read_text()[-3000:]
    return wait_for(look, what, timeout, tick=0.25, why=lines)


def test_sigstop_of_rank_1_is_named_within_45s(job):
    j = job()
    ranks = j.wait_for_steps()
    pid1 = ranks[1].pid
    os.kill(pid1, signal.SIGSTOP)
    t0 = time.time()
    found, ranks, procs = poll(j, lambda r, p: rank_dead(r, p) or rank_hang(r, time.time(), p, stall_s=300),
                               "a rule naming rank 1", 45)
    took = time.time() - t0
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

    (dead, cause), ranks, _ = poll(j, named, "rank 1's death and torchrun's root cause", 20)
    took = time.time() - t0
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
    # torchrun lists rank 1 with its pid and exitcode; under load it can see rank 0's abort first and
    # stop rank 1 unlisted, and then rank 1's own traceback names the cause without them
    assert re.fullmatch(r"rank 1 \(local_rank 1(, pid \d+)? on \S+\)( exitcode 1)?: "
                        r"RuntimeError: injected failure on rank 1 at step 10", err), err
    a = root_cause_anomaly(root_cause(tail), step=10)
    assert a.kind == "crash" and "injected failure on rank 1" in a.message


def test_healthy_two_rank_run_names_nothing_and_finishes(job):
    j = job("--steps", 60)
    j.wait_for_steps()
    hits = []

    def ended():  # every 0.2 s while the run lives: what the rank rules say
        ranks = j.files.poll()
        procs = {pid: probes.process(pid).state for pid in local_pids(ranks)}
        now = time.time()
        hits.extend(a for a in (rank_hang(ranks, now, procs, stall_s=60), straggler(ranks, now, window_s=5)) if a)
        return j.proc.poll() is not None
    wait_for(ended, "the two-rank run to end", timeout=240, tick=0.2)
    assert j.proc.returncode == 0, j.log.read_text()[-3000:]
    assert hits == []
    assert (j.run_dir / "final_val_metrics.json").exists()
    ranks = j.files.poll()
    assert sorted(ranks) == [0, 1] and all(s.step == 60 for s in ranks.values())


# The same faults through scripts/watchdog.py, as the agent runs it: no --pid, max-stall 300 s;
# the watchdog finds torchrun through train.log and the ranks through their heartbeats.
def watchdog(run_dir):
    return start_script(WATCHDOG.name, run_dir, "--poll", "0.5", "--max-stall", "300")


def test_watchdog_names_a_stopped_rank_within_45s(job):
    j = job()
    ranks = j.wait_for_steps()
    wd = watchdog(j.run_dir)
    wait_for_polls(j.run_dir, 2, wd)  # it follows torchrun and both ranks
    pid1 = ranks[1].pid
    os.kill(pid1, signal.SIGSTOP)
    t0 = time.time()
    out, err = wd.communicate(timeout=90)
    assert wd.returncode == 7 and kind_of(out) == "rank_hang" and out.startswith(f"ANOMALY rank_hang: rank 1 (pid {pid1} on "), out + err
    assert time.time() - t0 < 45
    assert_checkin_agrees(j.run_dir, out.strip())


def test_watchdog_names_a_killed_rank_with_its_root_cause_within_20s(job):
    j = job()
    ranks = j.wait_for_steps()
    wd = watchdog(j.run_dir)
    wait_for_polls(j.run_dir, 2, wd)  # it follows torchrun and both ranks
    pid1 = ranks[1].pid
    os.kill(pid1, signal.SIGKILL)
    t0 = time.time()
    out, err = wd.communicate(timeout=90)
    if "Failed to parse reply file" in j.log.read_text():   # torch's race (below): torchrun died before its report
        assert wd.returncode == 7 and "crash: last error line = 'torchrun failed reading local rank" in out, out + err
    else:
        assert wd.returncode == 7 and kind_of(out) == "crash" and out.startswith("ANOMALY crash: root cause = "), out + err
        assert f"rank 1 (local_rank 1, pid {pid1} on " in out and "killed by SIGKILL (not shown to be OOM)" in out
    assert "=====" not in out and "PID" not in out
    assert time.time() - t0 < 20
    assert_checkin_agrees(j.run_dir, out.strip())


HALF_WRITTEN = """import os, signal, time
import torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 0:
    open(os.environ["TORCHELASTIC_ERROR_FILE"], "w").close()   # its error report begun, not written
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(60)
"""


def test_torchrun_dying_on_a_half_written_error_file_is_its_own_failure_not_the_scripts(tmp_path):
    """torch writes a rank's error file in place; torchrun reading it half-written (a rank stopped
    mid-report, or under load) dies of a JSONDecodeError before its failure report. Seen once in CI
    beside a SIGKILLed rank; made here on purpose."""
    script = tmp_path / "half.py"
    script.write_text(HALF_WRITTEN)
    p = subprocess.run([str(TORCHRUN), "--nproc-per-node", "2", str(script)], capture_output=True, text=True,
                       timeout=240, cwd=tmp_path)
    text = p.stdout + p.stderr
    assert p.returncode == 1 and "Failed to parse reply file" in text, text[-3000:]
    err = last_error(text.splitlines())
    assert err.startswith("torchrun failed reading local rank 0's error file before its failure report "
                          "(json.decoder.JSONDecodeError: Expecting value"), err
    assert err.endswith("the ranks' own error: none printed (a rank killed by SIGKILL or another signal prints none)")
    assert is_environment(err)   # not the script's bug: the relaunch line is the same command


def test_watchdog_says_ok_done_for_a_healthy_two_rank_run(job):
    j = job("--steps", 60)
    wd = watchdog(j.run_dir)
    out, err = wd.communicate(timeout=240)
    assert wd.returncode == 0 and out.startswith("OK done: final_val_metrics.json written at step 60"), out + err
