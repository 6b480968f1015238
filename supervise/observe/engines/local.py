"""The local engine: the command started detached on this machine (its own session, stdin
/dev/null, output appended to the run's log), ended by signals to its process group.

Its job is a process: the launch record's pid, process group and start time (a recycled pid is
another process). The observer probes the run's processes itself (``probes``), so ``state`` is
for a caller that holds only a launch record. Standard library (+psutil through probes).
"""
from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Optional

from supervise.cli import UsageError
from supervise.observe.engines import ENDED, RUNNING, Cancelled, Job
from supervise.observe.probes import group_members, here_fields, process, same_process
from supervise.observe.state import launch_alive

NAME = "local"
LAUNCH_FLAG = OPTION_FLAG = WATCH_FLAG = None   # the default: no switch, no option, followed by its pid
FRESH = ""
KILL_WAIT_S = 10.0   # after SIGKILL: only a process stuck in the kernel (state D) takes longer
TICK_S = 0.05


def state(job: dict, runner=None) -> Job:
    """The launched process, running or ended (no end kind: the process rules judge it)."""
    return Job(NAME, str(job.get("pid")), RUNNING if launch_alive(job) else ENDED, logs=job.get("log"))


def find_command(name: str, cwd: Path, path: Optional[str]) -> str:
    """The executable ``name`` runs (as execvp finds it), or UsageError saying why none."""
    if not name:
        raise UsageError("the command is an empty word; put the training command after --")
    if "/" in name:
        p = Path(name) if os.path.isabs(name) else cwd / name
        if not p.exists():
            raise UsageError(f"{name}: no such file (from {cwd}); fix the path")
        if p.is_dir():
            raise UsageError(f"{name} is a folder, not a command; give the program to run")
        if not os.access(p, os.X_OK):
            raise UsageError(f"{name} is not executable: chmod +x {shlex.quote(name)}, or launch it through its "
                             f"interpreter (python -u {shlex.quote(name)}, bash {shlex.quote(name)})")
        return str(p)
    found = shutil.which(name, path=path)
    if not found:
        raise UsageError(f"{name}: command not found on PATH; give its full path or fix the name")
    return found


def check(argv: list, cwd, env: dict) -> dict:
    """The executable the command runs (``find_command``), for ``submit``; UsageError when none."""
    return {"executable": find_command(argv[0], cwd, env.get("PATH", os.defpath))}


def submit(run, argv: list, *, cwd, env: dict, variables: dict, log, options=(), executable=None) -> dict:
    """Start ``argv`` in its own session, stdin /dev/null, stdout and stderr appended to ``log``,
    in ``env`` with ``variables`` set; the launch record's fields that name it."""
    out = open(log, "ab")
    try:
        child = subprocess.Popen(argv, executable=executable, stdin=subprocess.DEVNULL, stdout=out,
                                 stderr=subprocess.STDOUT, cwd=cwd, env={**env, **variables}, start_new_session=True,
                                 close_fds=True)
    except OSError as e:
        raise UsageError(f"{argv[0]}: cannot run it ({e.strerror or e}); nothing was started")
    finally:
        out.close()
    info = process(child.pid)
    try:
        pgid, sid = os.getpgid(child.pid), os.getsid(child.pid)
    except OSError:  # it already ended: its own session all the same (setsid ran before exec)
        pgid = sid = child.pid
    return {"pid": child.pid, "pgid": pgid, "sid": sid, "host": socket.gethostname(), **here_fields(),
            "create_time": info.create_time}


def held(rec: dict) -> bool:
    """The launched process group still has a live member (a leader pid recycled by another
    process is not the launch's)."""
    pid, pgid = rec["pid"], rec.get("pgid") or rec["pid"]
    recycled = pgid == pid and process(pid).alive and not same_process(pid, rec.get("create_time"))
    return not recycled and bool(group_members(pgid))


def _wait_gone(pgid: int, seconds: float, clock) -> bool:
    end = clock() + seconds
    while True:
        if not group_members(pgid):
            return True
        if clock() >= end:
            return False
        time.sleep(TICK_S)


def cancel(rec: dict, grace_s: float, clock=time.monotonic, runner=None) -> Cancelled:
    """SIGTERM to the launched process group, up to ``grace_s`` for it to end, then SIGKILL.
    UsageError when this user may not signal it."""
    pgid = rec.get("pgid") or rec["pid"]
    t0, signals = clock(), []
    try:
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, KILL_WAIT_S)):
            os.killpg(pgid, sig)
            signals.append(sig.name)
            if _wait_gone(pgid, wait, clock):
                break
    except ProcessLookupError:
        pass  # gone between the check and the signal
    except PermissionError:
        raise UsageError(f"not allowed to signal pid {rec['pid']} (group {pgid}) (another user's process): "
                         "run stop.py as its owner")
    gone = not group_members(pgid)
    return Cancelled(signals, gone, clock() - t0)


def job_of(start) -> Optional[str]:
    return None


def resubmit(start: dict, recorded: Optional[list] = None) -> tuple[list, str]:
    return [], ""
