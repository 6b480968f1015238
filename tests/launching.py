"""What the launcher's tests share: a real trainer to launch (tests/fake_trainer.py writing the
contract for minutes), waits on conditions instead of fixed sleeps, and the clean-up that ends
every trainer a test launched (they are detached: nothing else would)."""
from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path

from conftest import FAKE, ROOT
from supervise.state import launch_alive, read_launch
from supervise.vocabulary import LAUNCH

LAUNCHER = ROOT / "scripts" / "launch.py"
STOPPER = ROOT / "scripts" / "stop.py"
BOUND = 60.0  # seconds: a hang, never a slow machine


def trainer_argv(run_dir, *extra, records: int = 3000, dt: float = 0.1) -> list[str]:
    """A trainer that writes one step record every ``dt`` s for ``records`` records (5 min)."""
    return [sys.executable, "-u", str(FAKE), str(run_dir), "--records", str(records), "--dt", str(dt),
            "--no-sentinel", *map(str, extra)]


def as_run(line: str, python: str) -> str:
    """A SKILL.md (or references/) line as the agent runs it here: ${CLAUDE_SKILL_DIR} is the bundle, and the
    interpreter is ``python`` (CI has no bare ``python`` on PATH)."""
    line = line.replace("${CLAUDE_SKILL_DIR}", str(ROOT))
    return re.sub(r"(^|(?<=\s))python3?(?=\s)", python, line)


def lines(path) -> int:
    try:
        return Path(path).read_bytes().count(b"\n")
    except OSError:
        return 0


def wait_for(cond, what: str, timeout: float = BOUND, tick: float = 0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        time.sleep(tick)
    raise AssertionError(f"{what}: not within {timeout:.0f}s")


def keeps_writing(path, more: int = 5, timeout: float = BOUND) -> None:
    """``path`` gains ``more`` lines from now on: the writer lives and works."""
    start = lines(path)
    wait_for(lambda: lines(path) >= start + more, f"{path} to grow by {more} lines from {start}", timeout)


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def procs_with(marker: str) -> list[int]:
    """The live processes whose command line holds ``marker``."""
    out = []
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in open(f"/proc/{d}/cmdline", "rb").read() and pid_alive(int(d)):
                out.append(int(d))
        except OSError:
            pass
    return out


def end_launched(root: Path) -> None:
    """SIGKILL the process group of every live launch recorded under ``root``."""
    for rec_path in Path(root).rglob(LAUNCH):
        rec = read_launch(rec_path.parent)
        if rec and launch_alive(rec):
            try:
                os.killpg(rec["pgid"] or rec["pid"], signal.SIGKILL)
            except OSError:
                pass


def run_relaunch(line: str, run, *, env=None, timeout: float = 400) -> dict:
    """A relaunch line as the agent runs it: verbatim, through a shell, which returns at once (the
    launcher detaches the trainer); then the launched trainer followed to its end. Its record."""
    import subprocess
    before = read_launch(run)
    p = subprocess.run(["bash", "-c", line], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.startswith("launched pid "), p.stdout + p.stderr
    rec = read_launch(run)
    assert rec is not None and (before is None or rec["pid"] != before["pid"]), rec
    wait_for(lambda: not launch_alive(rec), f"the relaunched trainer (pid {rec['pid']}) to end", timeout=timeout)
    return rec
