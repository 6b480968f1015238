"""One verdict whatever the timing and wherever it is asked (issue 19), each case with real
processes launched the ways users launch them: no train.log, a trainer "on another host", NaN
then a sentinel under the seed's --poll 30, a relaunch beside an old sentinel or an old nan, a
null in the middle of a 12 MB file, a crash before the watchdog starts, a child rank's death,
a sentinel written while the script still works. Latency bounds are generous: the machine may
be busy."""
import json
import os
import re
import signal
import sys
import time

import pytest

from conftest import ROOT, fake_line, kind_of, launch_line, procs_with, read_json, run_script, start_script, \
    step_of, wait_for, wait_for_lines, wait_for_polls, watchdog_state

FAST = ("--poll", "0.2")


@pytest.mark.parametrize("how", ["nohup_other_log", "start_record_on_another_host"])
def test_a_healthy_run_not_visible_here_is_not_dead(how, tmp_path, shells):
    """Case 1: the records keep arriving; no process writes train.log (or the start record names
    another host). The watchdog judges by the records and ends OK done, never dead."""
    run = tmp_path / "run"
    if how == "nohup_other_log":
        shells(fake_line(run, "--records", 150, "--dt", 0.05, "--no-start", out=tmp_path / "out.log"))  # the seed's format
    else:
        shells(fake_line(run, "--records", 150, "--dt", 0.05, "--host", "node-b", out=tmp_path / "out.log"))
    wd = start_script("watchdog.py", run, *FAST)
    wait_for_lines(run / "metrics.jsonl", 20)
    rc, out, _ = run_script("checkin.py", run)
    assert out.startswith("RUNNING healthy"), out
    assert "note: process not visible here:" in out, out
    if how == "start_record_on_another_host":
        assert "runs on host node-b" in out, out
    out, err = wd.communicate(timeout=120)
    assert wd.returncode == 0 and out.startswith("OK done: final_val_metrics.json written at step 1500"), out + err


def test_nan_then_a_sentinel_never_ends_ok_done_even_with_poll_30(tmp_path, shells):
    """Case 2: NaN from step 60, the run goes on and writes its sentinel between two polls of
    --poll 30: the verdict is nan, as it is for a watchdog attached after the end."""
    run = tmp_path / "run"
    run.mkdir()
    wd = start_script("watchdog.py", run, "--poll", "30")
    wait_for_polls(run, 1, wd)   # its first poll found nothing; the next is 30 s later
    p = shells(fake_line(run, "--records", 20, "--dt", 0.02, "--nan-at", 60))
    assert p.wait(timeout=60) == 0 and (run / "final_val_metrics.json").exists()
    out, err = wd.communicate(timeout=90)
    assert wd.returncode == 7 and kind_of(out) == "nan" and step_of(out) == 60, out + err
    rc, late, err = run_script("watchdog.py", run, "--poll", "30", timeout=60)  # attached after the end
    assert rc == 7 and late.split(" at step")[0] == out.split(" at step")[0], late + err


@pytest.mark.parametrize("history", ["old_sentinel", "old_nan"])
def test_a_watchdog_beside_a_relaunch_judges_the_new_attempt(history, tmp_path, shells):
    """Case 3: relaunched into a folder whose last attempt finished (or ended in nan), the new
    trainer loading for 3 s before its start record: neither the old sentinel nor the old nan
    decides; the new attempt ends OK done."""
    run = tmp_path / "run"
    old = ("--run-id", "old") + (("--nan-at", 50, "--no-sentinel") if history == "old_nan" else ())
    p = shells(fake_line(run, "--records", 10, "--dt", 0.01, *old))
    assert p.wait(timeout=60) == 0
    time.sleep(2.5)  # a process start time is known to about a second (the kernel's boot time is whole seconds)
    shells(fake_line(run, "--silent-start", 3, "--records", 30, "--dt", 0.03, "--run-id", "new"))
    rc, out, err = run_script("watchdog.py", run, *FAST, timeout=90)
    assert rc == 0 and out.startswith("OK done: final_val_metrics.json written at step 300/300"), out + err


def test_a_null_loss_in_the_middle_of_a_12_mb_file_is_found_on_reattach(tmp_path):
    """Case 4: the re-attach skim skipped a chunk whose only bad record was a null loss."""
    run = tmp_path / "run"
    run.mkdir()
    step = '{"step":%d,"t":%d.5,"loss":0.31,"lr":0.0001,"grad_norm":1.1,"sps":812.0}\n'
    n = 160_000
    with open(run / "metrics.jsonl", "w") as f:
        f.write(json.dumps({"event": "start", "t": 0, "run_id": "a"}) + "\n")
        f.write("".join(step % (i, i) for i in range(1, n // 2)))
        f.write('{"step":%d,"t":1.5,"loss":null,"lr":0.0001,"grad_norm":1.1,"sps":812.0}\n' % (n // 2))
        f.write("".join(step % (i, i) for i in range(n // 2 + 1, n)))
    assert (run / "metrics.jsonl").stat().st_size > 12e6
    rc, out, err = run_script("watchdog.py", run, *FAST, timeout=60)
    assert rc == 7 and out.startswith(f"ANOMALY nan: loss = null is not finite at step {n // 2}."), out + err
    rc, out, err = run_script("checkin.py", run)
    assert out.startswith("ANOMALY nan  "), out


def test_a_crash_before_the_watchdog_starts_is_named_at_once(tmp_path, shells):
    """Case 5: the traceback is in train.log, newer than any start record, and no process lives:
    a verdict at the first poll (plus the 2 s relaunch grace), not after a 10 s orphan grace."""
    run = tmp_path / "run"
    bad = tmp_path / "train.py"
    bad.write_text("import sys\nsys.argv.append('x')\nraise FileNotFoundError('data/train.jsonl')\n")
    run.mkdir()
    p = shells(launch_line([sys.executable, "-u", bad], run))
    p.wait(timeout=60)
    t0 = time.time()
    rc, out, err = run_script("watchdog.py", run, "--poll", "30", timeout=60)
    took = time.time() - t0
    assert rc == 7 and kind_of(out) == "crash", out + err
    assert "FileNotFoundError: data/train.jsonl" in out
    assert took < 20, took  # the relaunch grace is 2 s; the rest is interpreter start-up on a busy machine


CHILD_RANK = """
import multiprocessing as mp, sys, time
sys.path.insert(0, {root!r})
from tests.fake_trainer import MetricsWriter

def rank1(q):
    while True:
        q.put(1)          # its share of each step, as a collective would
        time.sleep(0.05)

if __name__ == "__main__":
    mp.set_start_method("fork")
    q = mp.Queue()
    child = mp.Process(target=rank1, args=(q,))
    child.start()
    print("rank 1 is pid", child.pid, flush=True)
    w = MetricsWriter({metrics!r})
    for step in range(1, 100000):
        q.get()           # blocks for ever once rank 1 is gone
        w.step(step, 0.5, 1e-4, 1.0, 20.0)
"""


def test_a_child_ranks_death_is_named_as_its_death_not_a_late_stall(tmp_path, shells):
    """Case 6: a hand-rolled spawn, no heartbeats; rank 1 (a child of rank 0) is killed and rank 0
    waits for it for ever. The child is named, well before --max-stall."""
    run = tmp_path / "run"
    run.mkdir()
    script = tmp_path / "spawn.py"
    script.write_text(CHILD_RANK.format(root=str(ROOT), metrics=str(run / "metrics.jsonl")))
    shells(launch_line([sys.executable, "-u", script], run))
    wait_for_lines(run / "metrics.jsonl", 10)
    child = int(re.search(r"rank 1 is pid (\d+)", (run / "train.log").read_text()).group(1))
    wd = start_script("watchdog.py", run, *FAST, "--max-stall", "60")
    wait_for_polls(run, 1, wd)
    # the watchdog has scanned /proc and follows both processes
    wait_for(lambda: child in {p["pid"] for p in watchdog_state(run)["pids"]}, f"the watchdog to follow rank 1 (pid {child})",
             proc=wd)
    os.kill(child, signal.SIGKILL)
    t0 = time.time()
    out, err = wd.communicate(timeout=120)
    assert wd.returncode == 7 and kind_of(out) == "dead", out + err
    assert f"pid {child} (child of " in out, out
    assert time.time() - t0 < 50  # 60 s / 4 of silence after its death, not the 60 s stall


def test_checkin_of_an_empty_path_is_a_usage_error():
    """Case 7."""
    rc, out, err = run_script("checkin.py", "")
    assert rc == 2 and out == "" and "empty path" in err and len(err.strip().splitlines()) == 1, err


def test_done_waits_for_the_trainer_to_exit_after_its_sentinel(tmp_path, shells):
    """Case 8: the HF callback writes the sentinel at on_train_end, before the script's own final
    save and eval: while the process lives the verdict is FINISHING; done comes with its exit."""
    run = tmp_path / "run"
    shells(fake_line(run, "--records", 10, "--dt", 0.02, "--linger", 4))
    wd = start_script("watchdog.py", run, *FAST)
    wait_for(lambda: (run / "final_val_metrics.json").exists(), "the sentinel")
    rc, out, _ = run_script("checkin.py", run)
    assert out.startswith("FINISHING") and "is finishing" in out, out
    out, err = wd.communicate(timeout=60)
    written = (run / "final_val_metrics.json").stat().st_mtime
    assert wd.returncode == 0 and out.startswith("OK done"), out + err
    assert read_json(run / "watchdog.json")["last_poll"] >= written + 3.5  # it waited for the exit


def test_a_relaunch_that_dies_before_its_start_record_is_named_within_a_poll(tmp_path, shells):
    """A rejected flag: the new process's own error, not the old attempt's death."""
    run = tmp_path / "run"
    p = shells(fake_line(run, "--records", 10, "--dt", 0.01, "--run-id", "old", "--exit-at", 50))
    assert p.wait(timeout=60) == 0
    time.sleep(2.5)  # a process start time is known to about a second (the kernel's boot time is whole seconds)
    bad = tmp_path / "train.py"
    bad.write_text("import argparse, time\ntime.sleep(2)\np = argparse.ArgumentParser()\n"
                   "p.add_argument('--lr')\np.parse_args()\n")
    shells(launch_line([sys.executable, "-u", bad, "--resume"], run))
    # the documented order: the relaunch line (its process started), then the watchdog beside it
    wait_for(lambda: procs_with(str(bad)), "the relaunch's process")
    wd = start_script("watchdog.py", run, *FAST)
    out, err = wd.communicate(timeout=60)
    assert wd.returncode == 7 and kind_of(out) == "crash", out + err
    assert "unrecognized arguments: --resume" in out and "the relaunch (pid " in out, out


def _eight_hour_run(run, total=28800):
    """A run 3 h in (record time) at 1 step/s with total_steps 28800: its plan is 8 h."""
    run.mkdir()
    t0 = time.time()
    start = {"event": "start", "t": 0, "pid": os.getpid(), "host": __import__("socket").gethostname(),
             "time": t0, "run_id": "long", **({"total_steps": total} if total else {})}
    step = '{"step": %d, "t": %d, "loss": 0.3, "lr": 0.0001, "grad_norm": 1.0, "sps": 8.0}\n'
    (run / "metrics.jsonl").write_text(json.dumps(start) + "\n" + "".join(step % (s, s) for s in range(10, 10801, 10)))
    return t0


@pytest.mark.parametrize("hours,total,kind", [(3, 28800, None), (11.9, 28800, None), (12.2, 28800, "timeout"),
                                              (100, None, None)])
def test_the_time_limit_comes_from_the_plan(hours, total, kind, tmp_path):
    """A healthy run projected at 8 h is not timed out at 3 h (v0.2's fixed 3 h limit); past
    1.5 x its projection + the startup grace it is; with no plan there is no limit."""
    from supervise.observe.observer import Observer
    from supervise.judge.table import RECORD_RULES, judge
    from supervise.thresholds import Thresholds
    run = tmp_path / "run"
    t0 = _eight_hour_run(run, total)
    th = Thresholds(max_stall=1e9)
    clock = iter([t0, t0 + hours * 3600])
    obs = Observer(run, th, RECORD_RULES, clock=lambda: next(clock)).observe()
    v = judge(obs, th)
    assert v.kind == kind, v.line
    if total:
        assert obs.time_limit == pytest.approx(1.5 * 28800 + 300) and "28800 steps at 1 steps/s" in obs.time_limit_why
    else:
        assert obs.time_limit is None
