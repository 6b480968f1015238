"""The registry of runs that a watchdog watches or the launcher started, so that tools find the
current run with no arguments. One small JSON file per run directory under ``SUPERVISE_STATE_DIR`` (default
``~/.local/state/supervising-training-runs/``): concurrent watchdogs never write one file."""
from __future__ import annotations

import os
import time
from pathlib import Path

from supervise.contract import atomic_write_json, read_json

KEEP = 100


def state_dir() -> Path:
    env = os.environ.get("SUPERVISE_STATE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "supervising-training-runs"


def _entry(run_dir: Path) -> Path:
    import hashlib  # here: OpenSSL's load is a check-in's cost otherwise (check-in rarely needs the registry)
    digest = hashlib.sha1(str(run_dir).encode()).hexdigest()[:16]
    return state_dir() / "runs" / f"{digest}.json"


def _update(run_dir, fields: dict) -> None:
    """Merge ``fields`` into the run's entry (atomic write; an unreadable entry starts afresh),
    then keep the newest KEEP entries. Failures to write are not fatal."""
    run_dir = Path(run_dir).resolve()
    try:
        path = _entry(run_dir)
        path.parent.mkdir(parents=True, exist_ok=True)
        prev = read_json(path)
        entry = prev if isinstance(prev, dict) and prev.get("run_dir") == str(run_dir) else {}
        atomic_write_json(path, {**entry, "run_dir": str(run_dir), **fields, "registered": time.time()})
        entries = sorted(path.parent.glob("*.json"), key=lambda p: p.stat().st_mtime)
        for old in entries[:-KEEP]:
            old.unlink(missing_ok=True)
    except OSError:
        pass


def register(run_dir, watchdog_pid: int, pids=()) -> None:
    """Record that a watchdog now watches ``run_dir`` (the entry's launch record, if any, stays)."""
    _update(run_dir, {"watchdog_pid": watchdog_pid, "pids": list(pids)})


def record_launch(run_dir, launch: dict) -> None:
    """Record what the launcher started in ``run_dir`` (the entry's ``launch``; the last
    watchdog's fields stay): check-in finds a launched run before any watchdog watches it."""
    _update(run_dir, {"launch": launch})


def runs() -> list[dict]:
    """Registered runs, newest first."""
    out = []
    for p in (state_dir() / "runs").glob("*.json"):
        rec = read_json(p)
        if isinstance(rec, dict) and isinstance(rec.get("run_dir"), str) and rec["run_dir"]:
            if not isinstance(rec.get("registered"), (int, float)) or isinstance(rec.get("registered"), bool):
                rec["registered"] = 0
            out.append(rec)
    return sorted(out, key=lambda r: r["registered"], reverse=True)


def latest():
    """The newest registered run directory that still exists, or None."""
    for rec in runs():
        if os.path.isdir(rec["run_dir"]):
            return rec
    return None
