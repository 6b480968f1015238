"""``RUN_DIR/watchdog.json``: what a watchdog writes each poll (atomically) and what check-in and
the observer read back: its pid and start time (so that a recycled pid is not taken for it), its
last poll, its flags, and its verdict once it ends. The file is input, not trusted: every field
is typed on reading. Standard library only: this is on the hot path.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

from .contract import is_number

FINAL = ("done", "anomaly", "stopped")   # states a watchdog ends in


def _typed(value, kind, default=None):
    """``value`` when it is a ``kind`` (bool never counts as a number), else ``default``."""
    if kind in (int, float):
        return value if is_number(value) and (kind is float or float(value).is_integer()) else default
    return value if isinstance(value, kind) else default


@dataclass
class WatchState:
    """What ``watchdog.json`` holds: written atomically each poll, read by check-in."""

    run_dir: str = ""
    watchdog_pid: Optional[int] = None
    started: Optional[float] = None
    last_poll: Optional[float] = None
    polls: int = 0
    poll_interval: Optional[float] = None
    state: str = "watching"
    kind: Optional[str] = None
    message: Optional[str] = None
    step: int = 0
    total_steps: Optional[int] = None
    run_id: Optional[str] = None
    attempt: Optional[int] = None
    records: dict = field(default_factory=dict)
    pids: list = field(default_factory=list)
    gpu: object = None
    warnings: list = field(default_factory=list)
    slurm_job: Optional[str] = None
    slurm_state: Optional[str] = None
    thresholds: dict = field(default_factory=dict)
    argv: list = field(default_factory=list)   # the watchdog's flags after RUN_DIR
    watchdog_create_time: Optional[float] = None  # the watchdog process's start time
    launch_pid: Optional[int] = None           # launch.json's pid when it judged: the attempt it is about
    headline: Optional[str] = None             # the verdict's headline (ANOMALY <kind>, DONE, STOPPED, ...)
    ended_by: Optional[str] = None             # the signal that ended the watchdog itself (no verdict on the run)

    @property
    def verdict_on_run(self) -> bool:
        """It ended on a verdict about the run (done, an anomaly, a stop by stop.py), not on a
        signal to the watchdog itself."""
        return self.state in FINAL and not self.ended_by and bool(self.message)

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_json(cls, obj) -> Optional["WatchState"]:
        """A watchdog.json as read from disk; None when it is not an object. Wrong-typed
        fields take their defaults: the file is input, not trusted."""
        if not isinstance(obj, dict):
            return None
        types = {"run_dir": str, "watchdog_pid": int, "started": float, "last_poll": float, "polls": int,
                 "poll_interval": float, "state": str, "kind": str, "message": str, "step": int,
                 "total_steps": int, "run_id": str, "attempt": int, "records": dict, "pids": list,
                 "warnings": list, "thresholds": dict, "slurm_job": str, "slurm_state": str, "argv": list,
                 "watchdog_create_time": float, "launch_pid": int, "headline": str, "ended_by": str}
        out = cls()
        for name, kind in types.items():
            default = getattr(out, name)
            setattr(out, name, _typed(obj.get(name), kind, default))
        out.gpu = obj.get("gpu") if isinstance(obj.get("gpu"), (str, list)) else None
        out.pids = [p for p in out.pids if isinstance(p, dict)]
        out.warnings = [w for w in out.warnings if isinstance(w, str)]
        out.argv = [a for a in out.argv if isinstance(a, str)]
        return out
