"""Run a user's training script (tests/user_scripts/) as users do, beside the real watchdog.

The script is launched through a shell with its output appended to RUN_DIR/train.log; the
watchdog (scripts/watchdog.py) finds the process from the start record, as it does for users.
Faults come from the script itself (NaN weights) or from real signals (SIGKILL, SIGSTOP).
"""
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from conftest import ROOT, WATCHDOG, anomaly_line, end_group, launch_line, records, shell, wait_for

USER_SCRIPTS = ROOT / "tests" / "user_scripts"


def env() -> dict:
    """The users' environment (the quiet variables, the bundle importable), read when a process
    starts: it carries the test's SUPERVISE_STATE_DIR, so the watchdog never touches the real registry."""
    return {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT)}


# Short polls; generous grace and stall limits so that a busy machine never looks like a hang.
WATCH = ("--poll", "0.5", "--startup-grace", "180", "--max-stall", "25")
LONG = ("--steps", "100000", "--sleep", "0.05")  # alive until a signal ends it


@dataclass
class Fault:
    name: str
    args: tuple = ()
    signal: int | None = None
    kind: str | None = None  # the anomaly kind the engine gives; None: a healthy run (exit 0, "OK done")


FAULTS = [
    Fault("healthy"),
    Fault("nan", ("--nan-at", "30"), kind="nan"),            # the integration's FATAL record names the NaN
    Fault("sigkill", LONG, signal.SIGKILL, kind="dead"),     # its rank-0 heartbeat's process is gone
    Fault("sigstop", LONG, signal.SIGSTOP, kind="stall"),    # one process: stall names the stopped pid
]


def supervised_lines(script: Path) -> list[str]:
    """The integration: the script's lines marked '# supervise'."""
    return [x for x in script.read_text().splitlines() if x.rstrip().endswith("# supervise")]


def launch(script: Path, run: Path, *args, variables: dict | None = None, runner: tuple = ()) -> subprocess.Popen:
    """mkdir -p RUN && ENV python -u [RUNNER] SCRIPT --out RUN ARGS >> RUN/train.log 2>&1, through a
    shell; RUNNER: e.g. ("-m", "torch.distributed.run", "--nproc_per_node", "2") for torchrun."""
    line = launch_line([sys.executable, "-u", *runner, script, "--out", run, *args], run, env=variables)
    return shell(line, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def log_tail(run: Path) -> str:
    log = run / "train.log"
    return "train.log tail:\n" + (log.read_text()[-3000:] if log.exists() else "(no log)")


def run_supervised(script_name: str, fault: Fault, tmp_path: Path, **how):
    """Launch the script (``how``: launch's variables and runner) and the watchdog, inject the fault;
    (watchdog rc, its stdout, its stderr, records)."""
    run = tmp_path / "run"
    sh = launch(USER_SCRIPTS / script_name, run, *fault.args, **how)
    wd = subprocess.Popen([sys.executable, str(WATCHDOG), str(run), *WATCH],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
    pid = None
    try:
        if fault.signal is not None:
            recs = wait_for(lambda: (rs := records(run)) and sum("loss" in r for r in rs) >= 3 and rs,
                            "3 step records", timeout=240, tick=0.2, proc=sh, why=lambda: log_tail(run))
            pid = recs[0]["pid"]
            os.kill(pid, fault.signal)
        out, err = wd.communicate(timeout=300)
        return wd.returncode, out, err, records(run)
    finally:
        if wd.poll() is None:
            wd.kill()
            wd.wait()
        if pid is not None:  # a stopped trainer: resume it only to end it
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        end_group(sh)


def check_verdict(fault: Fault, rc: int, out: str, err: str, recs: list[dict], run: Path):
    """The assertions every integration shares, per fault: exit 0 and OK done for a healthy run,
    else exit 7 and one anomaly line of the kind the engine gives for this fault and script."""
    start = recs[0]
    assert start["event"] == "start" and len(start["run_id"]) == 32 and start["attempt"] == 1
    if fault.kind is None:
        assert rc == 0 and out.startswith("OK done: "), out + err
        final = json.loads((run / "final_val_metrics.json").read_text())
        assert final["run_id"] == start["run_id"]
        return
    assert rc == 7, out + err
    assert anomaly_line(out)["kind"] == fault.kind, out + err
    assert not (run / "final_val_metrics.json").exists()
    if fault.name == "nan":
        fatal = [r for r in recs if "FATAL" in r]
        assert len(fatal) == 1 and 30 < fatal[0]["step"] <= 40 and "non-finite" in fatal[0]["FATAL"], fatal
