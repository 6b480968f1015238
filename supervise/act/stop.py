"""End a run that the launcher started: SIGTERM to its process group, a grace period, then SIGKILL.

    python3 scripts/stop.py RUN_DIR [--grace 30s]

Prints one line saying what it did; exit 0 when the run is stopped or was already gone, 2 when
RUN_DIR holds no launch record (or the process cannot be signalled from here), 7 when the group
outlives SIGKILL. The stop is recorded in ``RUN_DIR/launch.json`` (atomically): ``stop`` with
``requested_at`` before the first signal, then ``signals``, ``exited_after_s`` and
``stopped_at`` once it is gone; a later verdict reads "stopped by the user" from it, not a death.
"""
from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from supervise.cli import Parser, UsageError, duration, front_door, run_dir_arg
from supervise.observe import engines
from supervise.observe.probes import process
from supervise.observe.engines.local import KILL_WAIT_S, TICK_S
from supervise.observe.state import launched, read_launch, update_launch, where_launched
from supervise.vocabulary import EXIT_ANOMALY, EXIT_OK, LAUNCH

GRACE_S = 30.0


@dataclass
class Stopped:
    code: int
    line: str


def stop(run_dir, grace_s: float = GRACE_S, *, by: str = "stop.py", clock=time.monotonic) -> Stopped:
    """Stop the run launched in ``run_dir`` through its engine (the local one: SIGTERM to its
    process group, up to ``grace_s`` for it to end, then SIGKILL; Slurm: scancel); ``by`` is
    recorded as who stopped it, before the first signal. UsageError when there is no launch
    record, when it was launched on another host, or when this user may not signal it."""
    run = Path(run_dir)
    rec = read_launch(run)
    if rec is None:
        raise UsageError(f"{run} has no readable {LAUNCH}: only a run started by launch.py can be stopped by "
                         "stop.py; end another process with kill")
    eng = engines.engine(rec["engine"])
    scheduled = rec["engine"] != engines.LOCAL
    pgid = rec["pgid"] or rec["pid"]
    who = launched(rec) if scheduled else f"pid {rec['pid']} (group {pgid})"
    away = where_launched(rec)
    if away:
        raise UsageError(f"{who} was launched {away}: run stop.py there")
    if not eng.held(rec):   # the engine says whether there is anything to end
        return Stopped(EXIT_OK, f"{who} has already ended; nothing to stop" if scheduled else
                       f"{who} is already gone; nothing to stop")
    stop_rec = {"requested_at": time.time(), "by": by, "grace_s": grace_s}
    note = _record(run, stop=stop_rec)
    out = eng.cancel(rec, grace_s, clock)
    if scheduled:
        return Stopped(EXIT_OK, out.line)
    if not out.how:
        return Stopped(EXIT_OK, f"{who} is already gone; nothing to stop")
    steps = "SIGTERM" if len(out.how) == 1 else f"SIGTERM, still running after {grace_s:g}s; SIGKILL"
    if not note:
        took = round(out.took, 2) if out.gone else None
        note = _record(run, stop={**stop_rec, "signals": out.how, "exited_after_s": took},
                       **({"stopped_at": time.time()} if out.gone else {}))
    if not out.gone:
        return Stopped(EXIT_ANOMALY, f"{who}: {steps}, still running {out.took:.1f}s later (a process stuck in the "
                                     f"kernel?); see ps -g {pgid}{note}")
    return Stopped(EXIT_OK, f"stopped {who}: {steps}, exited after {out.took:.1f}s{note}")


def _record(run: Path, **fields) -> str:
    """Merge ``fields`` into launch.json; '' when written, else the note saying why not."""
    try:
        update_launch(run, **fields)
        return ""
    except (OSError, UsageError) as e:
        return f" (not recorded in {LAUNCH}: {getattr(e, 'strerror', None) or e})"


def stop_pids(pids: list[int], grace_s: float = GRACE_S, *, clock=time.monotonic) -> list[int]:
    """SIGTERM each of ``pids`` (processes not started by the launcher: no group of their own to
    signal), up to ``grace_s`` for them to end, then SIGKILL; the pids still alive after that."""
    def alive():
        return [p for p in pids if process(p).alive]
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, KILL_WAIT_S)):
        for p in alive():
            try:
                os.kill(p, sig)
            except (ProcessLookupError, PermissionError):
                pass
        end = clock() + wait
        while alive() and clock() < end:
            time.sleep(TICK_S)
        if not alive():
            return []
    return alive()


def build_parser() -> Parser:
    p = Parser(prog="stop.py", description=(
        "End a run that launch.py started: SIGTERM to its process group, wait the grace, then SIGKILL; one "
        "line says what it did. Exit 0 when stopped or already gone, 2 when RUN_DIR has no launch.json. "
        "The stop is recorded in RUN_DIR/launch.json, so the watchdog tells it from a death."))
    p.add_argument("run_dir", metavar="RUN_DIR", type=run_dir_arg, help="the run folder that holds launch.json")
    p.add_argument("--grace", type=duration, default=GRACE_S, metavar="DURATION",
                   help=f"how long SIGTERM has before SIGKILL (90s, 2m) [default: {GRACE_S:g}s]")
    return p


def main(argv=None) -> int:
    def body(args) -> int:
        out = stop(args.run_dir, args.grace)
        print(out.line, flush=True)
        return out.code
    return front_door(build_parser(), body, argv)
