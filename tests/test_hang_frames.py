"""A hang named from the frames, not only from the clock (issue 35): a silent run's stacks are
sampled every poll once the silence passes max(the median step gap, 10 s); frames that stay the
same in a wait for --hang-window are a stall long before the clock's limit, frames that move hold
the clock off, a checkpoint save keeps the slow-save rule, and a run that cannot be sampled keeps
the clock. The figures per step rhythm come from ``benchmarks/stall_limit.py --real``.

The real-process cases assert outcomes and their order (which rule named it, that a run ended
healthy), never how fast this machine is: every margin is many seconds wide."""
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, anomaly_line, need, run_script, wait_for_lines
from supervise.judge.table import frames_hang, judge
from supervise.observe.observation import Observation, Proc, Records
from supervise.observe.records import SAMPLE_MIN, StallClock
from supervise.observe.stacks import FrameFacts, find_py_spy
from supervise.thresholds import Thresholds

TH = Thresholds()
LOOP = ROOT / "benchmarks" / "rhythm_loop.py"
HANG = ROOT / "tests" / "hang_loop.py"


# --- the judge: pure, over the frozen facts --------------------------------------------------------

def facts(**kw):
    base = dict(every=5.0, first=1010.0, last=1040.0, samples=7, complete=True, still_since=1015.0, waiting=True,
                where="pid 1 in wait (threading.py:327)")
    return FrameFacts(**{**base, **kw})


def obs(**kw):
    base = dict(now=1040.0, watch_started=0.0, records=Records(n_steps=30, last_step=300),
                processes=(Proc(1, "sleeping"),), quiet_since=1000.0, stall_after=300.0, sample_after=10.0)
    return Observation(**{**base, **kw})


def test_frames_still_in_a_wait_are_a_stall_before_the_clock():
    v = judge(obs(frames=facts()), TH)
    assert v.kind == "stall" and "main-thread frames unchanged in a wait = 25s >= 20s" in v.line, v.line
    assert "metrics age 40s" in v.line and anomaly_line(v.line)["step"] == "300"
    assert judge(obs(frames=facts(still_since=1025.0)), TH).state == "watching"      # 15 s: not yet


@pytest.mark.parametrize("why, change", [
    ("not a wait", dict(waiting=False)),                   # a C call that spins, a GPU sync: the clock decides
    ("a checkpoint save", dict(saving=True)),              # the slow-save rule decides
    ("not every process sampled", dict(complete=False, why_not="pid 1: py-spy is not installed")),
    ("frames moving", dict(still_since=None)),
])
def test_no_hang_from_the_frames_unless_every_fact_holds(why, change):
    o = obs(frames=facts(**change))
    assert not frames_hang(o, TH) and judge(o, TH).state == "watching", why
    assert judge(obs(frames=facts(**change)), Thresholds(hang_window=0)).state == "watching"
    if not change.get("saving") and "still_since" not in change:   # the clock stays the floor
        assert judge(obs(frames=facts(**change), now=1301.0), TH).kind == "stall"


def test_frames_that_move_push_the_clocks_limit_out():
    moving = facts(still_since=None, moved_at=1290.0, last=1301.0)
    assert judge(obs(frames=moving, now=1301.0), TH).state == "watching"            # past 300 s, but it works
    v = judge(obs(frames=moving, now=1591.0), TH)                                  # 300 s since it last moved
    assert v.kind == "stall" and "frames last moved 301s ago" in v.line, v.line
    assert judge(obs(frames=facts(still_since=None, moved_at=4000.0), now=4100.0), TH).kind == "stall"  # > 3 x --max-stall


def test_the_watchdog_wakes_to_sample_and_at_the_windows_end():
    assert judge(obs(now=1004.0), TH).recheck_in == pytest.approx(6.05)             # sampling begins at 10 s
    assert judge(obs(frames=facts(last=1040.0, still_since=None)), TH).recheck_in == pytest.approx(5.0)
    assert judge(obs(now=1033.0, frames=facts(last=1032.0, still_since=1015.0)), TH).recheck_in == pytest.approx(2.05)
    assert judge(obs(sample_after=0.0, now=1004.0), TH).recheck_in > 100            # not sampled: the clock's deadline


def test_sampling_begins_at_the_median_step_gap_never_under_ten_seconds():
    clock = StallClock(TH)
    assert clock.sample_after() == SAMPLE_MIN
    for i in range(10):
        clock.update({"step": 10 * i, "t": 30.0 * i}, "step")
    assert clock.sample_after() == 30.0
    fast = StallClock(TH)
    for i in range(10):
        fast.update({"step": 10 * i, "t": 1.0 * i}, "step")
    assert fast.sample_after() == SAMPLE_MIN


# --- real processes -------------------------------------------------------------------------------

@pytest.fixture
def trainer(trainer):
    """conftest's trainer, running this file's rhythm loop unless another script is named."""
    return lambda run_dir, *args, script=LOOP: trainer(run_dir, *args, script=script)


def watch(run_dir, *flags, env=None, timeout=240):
    rc, out, err = run_script("watchdog.py", run_dir, "--poll", "1", *flags, timeout=timeout,
                              env={**os.environ, **(env or {})})
    return rc, out.strip(), err


@pytest.mark.parametrize("where, frame, bare", [
    ("step", "fetch_batch", False), ("eval", "next_eval_batch", False), ("step", "fetch_batch", True)],
    ids=["between-steps", "inside-an-eval", "py-spy"])
def test_a_hang_in_a_wait_is_named_from_the_frames_before_the_clock(tmp_path, trainer, where, frame, bare):
    """A 2 s rhythm whose clock has learned a limit of 45 s (--min-stall): the frames, sampled
    from 10 s of silence and still for --hang-window 6 s, name the hang first."""
    if bare and find_py_spy() is None:
        from conftest import missing
        missing("py-spy is not installed: pip install -e '.[hang]'")
    t = trainer(tmp_path, "--every", 2, "--hang", where, *(["--bare"] if bare else []))
    wait_for_lines(tmp_path / "metrics.jsonl", 20)
    rc, line, err = watch(tmp_path, "--hang-window", 6)
    m = anomaly_line(line)
    assert rc == 7 and m["kind"] == "stall", line + err
    assert m["what"].startswith("main-thread frames unchanged in a wait = "), line   # the frames' rule, not the clock's
    age = float(re.search(r"metrics age ([\d.]+)s", line)[1])
    assert age < TH.min_stall, line                                                 # before the clock's limit
    assert f"Stacks: pid {t.proc.pid} is in {frame} (rhythm_loop.py:" in line, line
    assert t.proc.poll() is None


def test_frames_that_move_hold_the_clock_off_and_the_clock_alone_fires(tmp_path, trainer):
    """A forward pass of 30 s in Python (frames moving) past a clock limit of 16 s: no stall with
    the frames' evidence (the run ends done); with --hang-window 0 (the clock alone) a stall."""
    clock = ("--stall-factor", "0", "--max-stall", "16")
    trainer(tmp_path / "frames", "--every", 2, "--only", "forward", "--pause", 30, "--steps", 2)
    trainer(tmp_path / "clock", "--every", 2, "--only", "forward", "--pause", 30, "--steps", 2)
    for d in ("frames", "clock"):
        wait_for_lines(tmp_path / d / "metrics.jsonl", 20)
    both = {d: subprocess.Popen([sys.executable, str(ROOT / "scripts" / "watchdog.py"), str(tmp_path / d), "--poll", "1",
                                 *clock, *(["--hang-window", "0"] if d == "clock" else [])],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for d in ("frames", "clock")}
    said = {d: (p.communicate(timeout=240)[0].strip(), p.returncode) for d, p in both.items()}
    line, rc = said["clock"]
    assert rc == 7 and anomaly_line(line)["kind"] == "stall" and "metrics age = " in line, line
    line, rc = said["frames"]
    assert rc == 0 and line.startswith("OK done: "), line


def test_a_save_keeps_the_slow_save_rule_however_still_its_frames(tmp_path, trainer):
    """A torch.save that never ends (tests/hang_loop.py --mode save): its frames stay still in a
    wait for far longer than --hang-window 3 s, but a save is no hang by the frames: the clock
    holds it to --max-stall (15 s) and the line says the save may just be slow."""
    need("torch")
    trainer(tmp_path, "--mode", "save", "--hang-at", 30, script=HANG)
    wait_for_lines(tmp_path / "metrics.jsonl", 3, timeout=120)
    rc, line, err = watch(tmp_path, "--min-stall", "5", "--max-stall", "15", "--hang-window", "3")
    m = anomaly_line(line)
    assert rc == 7 and m["kind"] == "stall" and "> 15s (the stacks showed a checkpoint save) at step 29" in line, line
    assert "frames unchanged" not in line and "is saving a checkpoint in save_checkpoint" in line, line


def test_an_unannounced_save_longer_than_the_window_is_no_hang(tmp_path, trainer):
    """A save of 25 s (still frames, asleep in a slow write) under a clock limit of 40 s: the
    frames would name it at ~16 s were it not a save; the run ends done."""
    need("torch")
    trainer(tmp_path, "--every", 2, "--only", "save", "--pause", 25, "--steps", 2)
    wait_for_lines(tmp_path / "metrics.jsonl", 20)
    rc, line, err = watch(tmp_path, "--stall-factor", "0", "--max-stall", "40", "--hang-window", "6")
    assert rc == 0 and line.startswith("OK done: "), line + err


def test_a_run_that_cannot_be_sampled_keeps_the_clock(tmp_path, trainer):
    """No integration and no py-spy: nothing to sample; the clock (--max-stall 14 s here) names it."""
    trainer(tmp_path, "--every", 2, "--hang", "step", "--bare")
    wait_for_lines(tmp_path / "metrics.jsonl", 20)
    rc, line, err = watch(tmp_path, "--stall-factor", "0", "--max-stall", "14", "--hang-window", "3",
                          env={"SUPERVISE_PY_SPY": "off"})
    m = anomaly_line(line)
    assert rc == 7 and m["what"].startswith("metrics age = ") and "No stack: " in line, line + err


def test_torchrun_ranks_waiting_for_a_peer_are_named_from_the_frames(tmp_path):
    """Two gloo ranks: rank 1 blocks in load_shard, rank 0 waits in the all_reduce for it. With a
    clock limit of 60 s (--min-stall), the frames name both, and which never reached it, first."""
    import json
    from conftest import end_group, launch_line, missing, shell, wait_for
    need("torch")
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        missing(f"torchrun is not installed next to this Python ({torchrun})")
    run = tmp_path / "run"
    job = shell(launch_line([torchrun, "--nproc_per_node", 2, ROOT / "tests" / "ddp_loop.py", "--out", run,
                             "--hang-rank", 1, "--hang-step", 40, "--step-time", 0.3], run))
    try:
        wait_for(lambda: len(list((run / "ranks").glob("rank-*.jsonl"))) == 2 and wait_for_lines(run / "metrics.jsonl", 3),
                 "both ranks' heartbeats", timeout=180, tick=0.2, proc=job)
        rc, line, err = watch(run, "--min-stall", "60", "--hang-window", "6")
        m = anomaly_line(line)
        assert rc == 7 and m["kind"] == "stall" and m["what"].startswith("main-thread frames unchanged in a wait"), line
        assert re.search(r"Stacks: rank 0 waits in all_reduce \(ddp_loop\.py:\d+\); rank 1 is in load_shard "
                         r"\(ddp_loop\.py:\d+\), never reached it; ", line), line
        assert float(re.search(r"metrics age ([\d.]+)s", line)[1]) < 60, line
    finally:
        for p in (run / "ranks").glob("rank-*.jsonl"):
            try:
                os.kill(json.loads(p.read_text().splitlines()[-1]).get("pid"), signal.SIGKILL)
            except (ProcessLookupError, TypeError, ValueError, IndexError):
                pass
        end_group(job)
