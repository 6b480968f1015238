"""Run a user's training script (tests/user_scripts/) as users do, beside the real watchdog.

The script is launched through a shell with its output appended to RUN_DIR/train.log; the
watchdog (scripts/watchdog.py) finds the process from the start record, as it does for users.
Faults come from the script itself (NaN weights) or from real signals (SIGKILL, SIGSTOP).
"""
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from conftest import ROOT

USER_SCRIPTS = ROOT / "tests" / "user_scripts"
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
       "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT)}
# Short polls; generous grace and stall limits so that a busy machine never looks like a hang.
WATCH = ("--poll", "0.5", "--startup-grace", "180", "--max-stall", "25")
LINE = re.compile(r"^ANOMALY (?P<kind>[a-z_]+): .+ at step (?P<step>\d+)\. .+\.$", re.M)
LONG = ("--steps", "100000", "--sleep", "0.05")  # alive until a signal ends it


@dataclass
class Fault:
    name: str
    args: tuple = ()
    signal: int | None = None
    kinds: tuple = ()  # anomaly kinds accepted; () means a healthy run: exit 0, "OK done"


FAULTS = [
    Fault("healthy"),
    Fault("nan", ("--nan-at", "30"), kinds=("nan", "fatal")),
    Fault("sigkill", LONG, signal.SIGKILL, kinds=("dead", "crash")),
    # ENGINE: the watchdog names a suspended process `stall`, or `rank_hang` once it reads the per-rank
    # heartbeat files (even for world_size 1); either catches the SIGSTOP, the kind is the engine's call.
    Fault("sigstop", LONG, signal.SIGSTOP, kinds=("stall", "rank_hang")),
]


def supervised_lines(script: Path) -> list[str]:
    """The integration: the script's lines marked '# supervise'."""
    return [x for x in script.read_text().splitlines() if x.rstrip().endswith("# supervise")]


def records(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass  # a torn last line while the writer is busy
    return out


def attempts(run: Path) -> list[list[dict]]:
    """[[start, rec, ...], ...]: one list per start record (a run is the records after its last)."""
    out = []
    for r in records(run):
        if r.get("event") == "start":
            out.append([r])
        elif out:
            out[-1].append(r)
    return out


def wait_for(run: Path, pred, timeout: float, what: str) -> list[dict]:
    end = time.time() + timeout
    while time.time() < end:
        recs = records(run)
        if pred(recs):
            return recs
        time.sleep(0.2)
    log = (run / "train.log").read_text()[-3000:] if (run / "train.log").exists() else "(no log)"
    raise AssertionError(f"{what} never happened in {timeout}s; train.log tail:\n{log}")


def launch(script: Path, run: Path, *args, env: str = "", runner: tuple = ()) -> subprocess.Popen:
    """mkdir -p RUN && ENV python -u [RUNNER] SCRIPT --out RUN ARGS >> RUN/train.log 2>&1, through a
    shell; RUNNER: e.g. ("-m", "torch.distributed.run", "--nproc_per_node", "2") for torchrun."""
    q = shlex.quote
    r = q(str(run))
    line = (f"mkdir -p {r} && {env} {q(sys.executable)} -u {' '.join(map(q, runner))} {q(str(script))} "
            f"--out {r} {' '.join(map(q, args))} >> {r}/train.log 2>&1")
    return subprocess.Popen(["bash", "-c", line], env=ENV, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def run_supervised(script_name: str, fault: Fault, tmp_path: Path, **how):
    """Launch the script (``how``: launch's env and runner) and the watchdog, inject the fault;
    (watchdog rc, its stdout, records)."""
    run = tmp_path / "run"
    shell = launch(USER_SCRIPTS / script_name, run, *fault.args, **how)
    wd = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "watchdog.py"), str(run), *WATCH],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    pid = None
    try:
        if fault.signal is not None:
            recs = wait_for(run, lambda rs: sum("loss" in r for r in rs) >= 3, 240, "3 step records")
            pid = recs[0]["pid"]
            os.kill(pid, fault.signal)
        out, err = wd.communicate(timeout=300)
        return wd.returncode, out + err, records(run)
    finally:
        for p in (wd, shell):
            if p.poll() is None:
                p.kill()
                p.wait()
        if pid is not None:  # a stopped trainer: resume it only to end it
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        try:
            os.killpg(shell.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def check_verdict(fault: Fault, rc: int, out: str, recs: list[dict], run: Path):
    """The assertions every integration shares, per fault."""
    start = recs[0]
    assert start["event"] == "start" and len(start["run_id"]) == 32 and start["attempt"] == 1
    if not fault.kinds:
        assert rc == 0 and "OK done" in out, out
        final = json.loads((run / "final_val_metrics.json").read_text())
        assert final["run_id"] == start["run_id"]
        return
    assert rc == 7, out
    m = LINE.search(out)
    assert m and m["kind"] in fault.kinds, out
    assert not (run / "final_val_metrics.json").exists()
    if fault.name == "nan":
        fatal = [r for r in recs if "FATAL" in r]
        assert len(fatal) == 1 and 30 < fatal[0]["step"] <= 40 and "non-finite" in fatal[0]["FATAL"], fatal
