"""The run folder's state files, as records typed on reading (the files are input, not trusted):

- ``RUN_DIR/watchdog.json`` (``WatchState``): what a watchdog writes each poll (atomically) and
  what check-in and the observer read back: its pid and start time (so that a recycled pid is
  not taken for it), its last poll, its flags, and its verdict once it ends;
- ``RUN_DIR/launch.json`` (``read_launch``, ``update_launch``, ``launch_alive``): the launcher's
  record of the folder's launches (scripts/launch.py writes it, scripts/stop.py adds the stop).

Standard library (+psutil through probes): this is on the hot path.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

from pathlib import Path

from supervise.cli import UsageError
from supervise.contract import atomic_write_json, is_number, read_json
from supervise.observe.probes import runs_where, same_process
from supervise.vocabulary import FINAL, LAUNCH, WATCHING



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
    state: str = WATCHING
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
    engine: Optional[str] = None     # the engine of the job followed (--slurm-job, launch.json's), when one is
    job_id: Optional[str] = None
    job_state: Optional[str] = None  # the engine's word for it at the last poll
    thresholds: dict = field(default_factory=dict)
    argv: list = field(default_factory=list)   # the watchdog's flags after RUN_DIR
    checkpoint_dirs: list = field(default_factory=list)   # its --checkpoint-dir folders
    watchdog_create_time: Optional[float] = None  # the watchdog process's start time
    launch_pid: Optional[int] = None           # launch.json's pid when it judged: the attempt it is about
    headline: Optional[str] = None             # the verdict's headline (ANOMALY <kind>, DONE, STOPPED, ...)
    ended_by: Optional[str] = None             # the signal that ended the watchdog itself (no verdict on the run)
    stacks: Optional[dict] = None              # the hang's capture (stacks.Capture.to_json): folder, files, where

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
                 "warnings": list, "thresholds": dict, "engine": str, "job_id": str, "job_state": str, "argv": list, "checkpoint_dirs": list,
                 "watchdog_create_time": float, "launch_pid": int, "headline": str, "ended_by": str,
                 "stacks": dict}
        out = cls()
        for name, kind in types.items():
            default = getattr(out, name)
            setattr(out, name, _typed(obj.get(name), kind, default))
        out.gpu = obj.get("gpu") if isinstance(obj.get("gpu"), (str, list)) else None
        out.pids = [p for p in out.pids if isinstance(p, dict)]
        out.warnings = [w for w in out.warnings if isinstance(w, str)]
        out.argv = [a for a in out.argv if isinstance(a, str)]
        out.checkpoint_dirs = [d for d in out.checkpoint_dirs if isinstance(d, str)]
        return out


# field -> type read_launch accepts (float: any number but a bool); a field of another type
# reads as None. pid, launched_at and argv are required: without them the record is None.
FIELDS = {"pid": int, "pgid": int, "sid": int, "host": str, "create_time": float, "launched_at": float,
          "argv": list, "cwd": str, "window_s": float, "session_id": str, "log": str, "run_dir": str,
          "stop": dict, "stopped_at": float, "earlier": list, "env": dict, "replaced": list, "on_exit": list,
          "engine": str, "job_id": str, "options": list, "pid_ns": int, "boot_id": str}
# what records written before the engine seam called them (a Slurm job's id and sbatch options)
LEGACY = {"slurm_job_id": ("job_id", "slurm"), "sbatch": ("options", "slurm")}


def _field(value, kind):
    if kind is float:
        return float(value) if is_number(value) else None
    if kind is int:
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
    return value if isinstance(value, kind) else None


def typed_launch(obj) -> Optional[dict]:
    """A launch record as read from disk, every field of FIELDS present and typed (None when
    absent or of another type); None when it is not an object or lacks launched_at, a non-empty
    argv of strings, or both a pid and a job id (a job submitted to a scheduler, ``--slurm``, has
    no local pid). ``engine`` is the engine that started it (``local`` when the record names none).
    The file is input, not trusted."""
    if not isinstance(obj, dict):
        return None
    obj = dict(obj)
    for old, (new, eng) in LEGACY.items():
        if old in obj and new not in obj:
            obj[new] = obj.pop(old)
            obj.setdefault("engine", eng)
    rec = {name: _field(obj.get(name), kind) for name, kind in FIELDS.items()}
    rec["engine"] = rec["engine"] or "local"
    if rec["argv"] is not None and not (rec["argv"] and all(isinstance(a, str) for a in rec["argv"])):
        rec["argv"] = None
    if rec["pid"] is None and rec["job_id"] is None or rec["launched_at"] is None or rec["argv"] is None:
        return None
    return rec


def read_launch(run_dir) -> Optional[dict]:
    """``RUN_DIR/launch.json``, typed; None when it is missing, unreadable or not a record."""
    return typed_launch(read_json(Path(run_dir) / LAUNCH))


def launched(rec: dict) -> str:
    """What a launch record started, in words: ``pid 123`` or ``Slurm job 456``."""
    if rec.get("job_id"):
        return f"{rec['engine'].capitalize()} job {rec['job_id']}"
    return f"pid {rec['pid']}"


def where_launched(rec: dict) -> str:
    """'' when the record's process can be probed and signalled from here: its host, PID
    namespace and boot are this process's (``probes.locality``; what the record lacks, an older
    launcher's, is not compared). Otherwise where it runs, in words (``on host node-b, this is
    node-a``, ``in another PID namespace on vm (...)``)."""
    return runs_where(rec)


def on_this_host(rec: dict) -> bool:
    """Whether the record's process can be seen from here (``where_launched`` is ''); a record
    without a host, namespace or boot is assumed so."""
    return not where_launched(rec)


def launch_alive(rec: Optional[dict]) -> bool:
    """The launched process still runs: on this host, its pid alive (not a zombie) and its start
    time within probes.SAME_PROCESS_S of the recorded one (a recycled pid is another process). A record
    or a reading without a start time is judged by the pid alone. False on another host: it
    cannot be seen from here (``on_this_host`` tells that case apart)."""
    if not rec or not rec.get("pid") or not on_this_host(rec):
        return False
    return same_process(rec["pid"], rec.get("create_time"))


def update_launch(run_dir, **fields) -> dict:
    """Merge ``fields`` into ``RUN_DIR/launch.json`` (atomically) and return the new record.
    OSError when it cannot be written; UsageError when there is no record to update (the
    caller's front door turns it into one line)."""
    run = Path(run_dir)
    old = read_json(run / LAUNCH)
    if not isinstance(old, dict):
        raise UsageError(f"{run / LAUNCH} is missing or unreadable")
    new = {**old, **fields}
    atomic_write_json(run / LAUNCH, new)
    return new
