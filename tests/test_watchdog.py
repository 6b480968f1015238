"""scripts/watchdog.py as the agent runs it: a subprocess beside a real process that writes the
contract, faults made by the process itself or by real signals."""
import os
import signal
import sys
import threading
import time
from pathlib import Path
from dataclasses import dataclass

import pytest

from conftest import anomaly_line, assert_checkin_agrees, kind_of, read_json, run_script, start_script, wait_for_lines, \
    wait_for_polls
from supervise.observe import registry
from supervise.judge.table import KINDS
from supervise.observe.probes import GpuReading, GpuReport
from supervise.thresholds import Thresholds
from supervise.tools.watch import Watchdog, run

FAST = ("--poll", "0.2", "--startup-grace", "5", "--max-stall", "30")
ALIVE = ("--no-sentinel", "--linger", "60")  # the trainer stays alive: only the anomaly can end the watch


@dataclass
class Case:
    name: str
    trainer: tuple
    watchdog: tuple = ()
    kind: str | None = None      # None: healthy, expect exit 0 and OK done
    step: int | None = None


CASES = [
    # healthy variants never wake the agent
    Case("healthy", ("--records", 30, "--dt", 0.02)),
    Case("single_grad_spike", ("--records", 30, "--dt", 0.02, "--grad-spike-at", 100)),
    Case("silent_start_3s", ("--records", 20, "--dt", 0.02, "--silent-start", 3), ("--max-stall", 2)),
    Case("garbage_and_torn_lines", ("--records", 30, "--dt", 0.04, "--garbage")),
    Case("sentinel_then_exit", ("--records", 20, "--dt", 0.02)),
    Case("no_start_record", ("--records", 20, "--dt", 0.02, "--no-start")),
    # every kind the process can cause by itself
    Case("nan", ("--records", 40, "--nan-at", 120, *ALIVE), kind="nan", step=120),
    Case("null_grad_norm", ("--records", 40, "--null-grad-at", 80, *ALIVE), kind="nan", step=80),
    Case("fatal", ("--records", 40, "--fatal-at", 100), kind="fatal", step=100),
    Case("exit_without_sentinel", ("--records", 40, "--exit-at", 150), kind="dead", step=140),
    Case("oom", ("--records", 40, "--oom-at", 100), kind="oom", step=90),
    Case("crash", ("--records", 40, "--crash-at", 100), kind="crash", step=90),
    Case("hang", ("--records", 40, "--hang-at", 100), ("--max-stall", 1.5), kind="stall", step=90),
    Case("no_telemetry", ("--silent-start", 60), ("--startup-grace", 1.5), kind="no_telemetry", step=0),
    Case("chance_loss", ("--records", 60, "--loss", 0.69, *ALIVE), kind="chance_loss", step=400),
    Case("chance_loss_3_labels", ("--records", 60, "--num-labels", 3, "--loss", 1.1, *ALIVE),
         kind="chance_loss", step=400),
    Case("inverted_labels", ("--records", 60, "--auroc", 0.12, *ALIVE), kind="inverted_labels", step=50),
    Case("stuck_auroc", ("--records", 80, "--auroc", 0.55, *ALIVE), kind="stuck_auroc", step=500),
    Case("grad_explode", ("--records", 60, "--grad-from", 200, "--grad-value", 120, *ALIVE),
         kind="grad_explode", step=240),
    Case("grad_collapse", ("--records", 60, "--grad-from", 200, "--grad-value", 1e-5, *ALIVE),
         kind="grad_collapse", step=240),
    # throughput: a drop must hold for --throughput-window of record time (10 s per record here):
    # the median of 5 falls below the floor at step 320, and has held 100 s at step 420
    Case("throughput", ("--records", 80, "--virtual-dt", 10, "--sps-from", 300, "--sps-value", 60, *ALIVE),
         ("--throughput-window", "100"), kind="throughput", step=420),
    Case("throughput_blip_is_not_an_alarm", ("--records", 60, "--virtual-dt", 10, "--sps-from", 500,
                                             "--sps-value", 60)),  # 100 s slow < the 300 s window
    # divergence: finite, far above the best median (LR=1000 took the loss to 2e4)
    Case("diverged", ("--records", 60, "--loss-from", 200, "--loss-value", 2e4, *ALIVE), kind="diverged", step=220),
    Case("sustained_loss_spike", ("--records", 60, "--loss-from", 300, "--loss-value", 1.5, *ALIVE),
         kind="loss_spike", step=340),
    Case("single_loss_spike", ("--records", 40, "--loss-from", 300, "--loss-until", 300, "--loss-value", 5.0)),
    Case("lm_at_chance", ("--records", 60, "--task", "lm", "--vocab-size", 1000, "--loss", 6.9, *ALIVE),
         kind="chance_loss", step=400),
    Case("learned_stall", ("--records", 40, "--hang-at", 300), ("--max-stall", 300, "--min-stall", 1),
         kind="stall", step=290),  # 5 x the longest gap, long before max-stall
    Case("announced_pause", ("--records", 30, "--expect-at", 100, "--pause", 3), ("--max-stall", 1.5)),
    Case("timeout", ("--records", 1000, *ALIVE), ("--hard-timeout", 1.5), kind="timeout"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_scenario(case, tmp_path, trainer):
    run_dir = tmp_path / "run"
    t = trainer(run_dir, "--dt", 0.03, *case.trainer)
    pid = ("--pid", t.pid) if case.name in ("no_telemetry", "sentinel_then_exit") else ()
    rc, out, err = run_script("watchdog.py", run_dir, *FAST, *pid, *case.watchdog, timeout=60)
    lines = out.strip().splitlines()
    assert len(lines) == 1, out + err  # nothing but the verdict on stdout
    state = read_json(run_dir / "watchdog.json")
    assert_checkin_agrees(run_dir, lines[0])  # one verdict everywhere
    if case.kind is None:
        assert rc == 0, out + err
        assert lines[0].startswith("OK done: final_val_metrics.json written"), lines[0]
        assert state["state"] == "done"
        if case.name == "garbage_and_torn_lines":
            assert state["records"]["bad_lines"] >= 5
            assert state["records"]["steps"] >= 30  # torn lines were completed, not lost
        return
    assert rc == 7, out + err
    m = anomaly_line(lines[0])
    assert m["kind"] == case.kind, lines[0]
    if case.step is not None:
        assert int(m["step"]) == case.step, lines[0]
    assert state["state"] == "anomaly" and state["kind"] == case.kind


def test_crash_names_the_exception(tmp_path, trainer):
    trainer(tmp_path, "--records", 40, "--crash-at", 100)
    rc, out, _ = run_script("watchdog.py", tmp_path, *FAST)
    assert rc == 7 and kind_of(out) == "crash" and "ValueError: bad batch at step 100" in out, out


def test_oom_names_the_log_line(tmp_path, trainer):
    trainer(tmp_path, "--records", 40, "--oom-at", 50)
    rc, out, _ = run_script("watchdog.py", tmp_path, *FAST)
    assert rc == 7 and kind_of(out) == "oom" and "CUDA out of memory" in out and "batch size" in out, out


@pytest.mark.parametrize("sig,kind", [(signal.SIGKILL, "dead"), (signal.SIGSTOP, "stall")])
def test_real_signal_is_caught_within_one_poll(sig, kind, tmp_path, trainer):
    """max-stall is 30 s: only the process probe can catch these in a few polls."""
    t = trainer(tmp_path, "--records", 2000, "--dt", 0.03, *ALIVE)
    t.wait_for_line(tmp_path / "metrics.jsonl", 5)
    wd = start_script("watchdog.py", tmp_path, "--poll", "0.5", "--max-stall", "30")
    wait_for_polls(tmp_path, 2, wd)  # it has seen the trainer alive
    fault = time.time()
    os.kill(t.pid, sig)
    try:
        out, err = wd.communicate(timeout=20)
    finally:
        if sig == signal.SIGSTOP:
            os.kill(t.pid, signal.SIGCONT)
    latency = time.time() - fault
    assert wd.returncode == 7, out + err
    assert kind_of(out) == kind, out
    assert f"pid {t.pid}" in out
    assert latency < 5, f"{latency:.1f}s from {sig.name} to exit (poll 0.5s)"
    assert_checkin_agrees(tmp_path, out.strip())


def test_sigterm_ends_cleanly_with_state_saved(tmp_path, trainer):
    trainer(tmp_path, "--records", 2000, *ALIVE)
    wait_for_lines(tmp_path / "metrics.jsonl", 3)
    wd = start_script("watchdog.py", tmp_path, "--poll", "0.3")
    wait_for_polls(tmp_path, 2, wd)
    wd.send_signal(signal.SIGTERM)
    out, err = wd.communicate(timeout=10)
    assert wd.returncode == 0, out + err
    assert out.startswith("STOPPED: watchdog ended by SIGTERM") and not err
    state = read_json(tmp_path / "watchdog.json")
    assert state["state"] == "stopped" and state["polls"] >= 2 and state["step"] > 0


def test_no_gpu_is_said_once_in_state(tmp_path, trainer):
    trainer(tmp_path, "--records", 10, "--dt", 0.02)
    rc, out, _ = run_script("watchdog.py", tmp_path, *FAST)
    assert rc == 0
    gpu = read_json(tmp_path / "watchdog.json")["gpu"]
    if isinstance(gpu, str):  # this machine has no GPU: the note says so and gpu_idle is off
        assert gpu.startswith("no GPU") and gpu.endswith("gpu_idle is off")


def test_registry_records_the_run(tmp_path, trainer):
    trainer(tmp_path / "r", "--records", 10, "--dt", 0.02)
    rc, _, _ = run_script("watchdog.py", tmp_path / "r", *FAST)
    assert rc == 0
    assert registry.latest()["run_dir"] == str((tmp_path / "r").resolve())


class FakeGpu:
    def __init__(self, util):
        self.util = util

    def read(self):
        return GpuReport([GpuReading(0, "H100", self.util, 1 << 30, 80 << 30, 50.0, 100.0, ())])


@pytest.mark.parametrize("util,kind", [(0.0, "gpu_idle"), (3.0, "gpu_idle"), (85.0, None)])
def test_gpu_idle_through_injected_probe(util, kind, tmp_path, trainer, capsys):
    records = 60 if kind is None else 2000
    t = trainer(tmp_path, "--records", records, "--dt", 0.03, *(ALIVE if kind else ()))
    t.wait_for_line(tmp_path / "metrics.jsonl", 3)  # the first step record is there: no speed race
    th = Thresholds(poll=0.1, startup_grace=0.3, gpu_idle=0.5, max_stall=30)
    w = Watchdog(tmp_path, th, pids=[t.pid], gpu=FakeGpu(util))
    timer = threading.Timer(20, lambda: os.kill(os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        code = run(w, out=sys.stdout)
    finally:
        timer.cancel()
    line = capsys.readouterr().out.strip()
    if kind is None:
        assert code == 0 and line.startswith("OK done"), line
    else:
        assert code == 7 and kind_of(line) == "gpu_idle", line
        assert f"GPU utilization = {util:.0f}% < 5%" in line
        assert_checkin_agrees(tmp_path, line)  # this machine's check-in has no GPU: the watchdog's verdict stands


BAD_USAGE = [
    (("{file}",), "is a file, not a run directory"),
    (("{dir}", "--poll", "-5"), "must be more than 0"),
    (("{dir}", "--poll", "soon"), "is not a duration"),
    (("{dir}", "--bogus"), "unrecognized arguments: --bogus"),
    (("{dir}", "--grad-low", "100"), "must be below --grad-high"),
    (("{dir}", "--throughput-drop", "1.5"), "fraction below 1"),
    (("{dir}", "--pid", "abc"), "not an integer"),
    ((), "required: RUN_DIR"),
]


@pytest.mark.parametrize("args,needle", BAD_USAGE, ids=[n for _, n in BAD_USAGE])
def test_bad_usage_is_one_line_exit_2(args, needle, tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("x")
    args = [a.format(file=f, dir=tmp_path) for a in args]
    rc, out, err = run_script("watchdog.py", *args)
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err, err


def test_durations_accept_units(tmp_path, trainer):
    trainer(tmp_path, "--records", 1000, *ALIVE)
    rc, out, _ = run_script("watchdog.py", tmp_path, "--poll", "0.2s", "--hard-timeout", "0.02m")
    assert rc == 7 and out.startswith("ANOMALY timeout: wall time = ") and "> 1.2s (--hard-timeout) at step" in out


# kinds whose scenario lives in another test: kind -> "file::test" (the test that proves it)
ELSEWHERE = {"dead": "test_watchdog.py::test_real_signal_is_caught_within_one_poll",
             "stall": "test_watchdog.py::test_real_signal_is_caught_within_one_poll",
             "gpu_idle": "test_watchdog.py::test_gpu_idle_through_injected_probe",
             "blind": "test_verdict_traps.py::test_blind_watchdog_says_so",
             "overfit": "test_rules.py::test_overfit_is_a_warning_unless_its_flag_is_set",
             "rank_hang": "test_ranks.py::test_rank_hang",
             "straggler": "test_ranks.py::test_straggler_sustained_over_the_window",
             "node_fail": "test_slurm.py::test_the_watchdog_follows_a_job_from_the_queue_to_its_end",
             "preempted": "test_slurm.py::test_the_watchdog_follows_a_job_from_the_queue_to_its_end",
             "no_progress": "test_verdict_traps.py::test_three_relaunches_from_the_same_checkpoint_are_no_progress",
             "disk": "test_checkpoints.py::test_a_disk_filling_up_is_caught_before_any_save_fails"}


def test_every_kind_has_a_scenario():
    """Every kind is proven here (CASES) or by the named test, which exists and names the kind
    (in its parameters or its body): a renamed or rewritten test fails this, not a dict."""
    covered = {c.kind for c in CASES} | set(ELSEWHERE)
    assert covered >= set(KINDS), set(KINDS) - covered
    for kind, where in ELSEWHERE.items():
        file, _, name = where.partition("::")
        text = (Path(__file__).parent / file).read_text()
        at = text.find(f"\ndef {name}(")
        assert at >= 0, f"{where}: no such test for {kind}"
        head, tail = text.rfind("\n\n\n", 0, at), text.find("\n\n\n", at + 1)  # its decorators and body
        assert kind in text[head:tail if tail > 0 else None], f"{where} never names {kind}"
