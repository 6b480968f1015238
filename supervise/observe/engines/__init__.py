"""The engine seam: every scheduler a run can be submitted to is one module behind one small
interface, and one registration in ``ENGINES``. The local launcher and Slurm are the first two.

    eng = engine("slurm")                      # the module, imported on first use
    job = eng.state("123456")                  # a Job: engine-neutral facts; never raises
    job_id = eng.submit(run, argv, cwd=..., env=..., log=..., options=[...])   # act/launch.py only
    line = eng.cancel(job_id)                  # act/stop.py and --replace only

An engine module defines:

- ``NAME``; ``LAUNCH_FLAG`` and ``OPTION_FLAG`` (launch.py's switch and its repeatable option,
  e.g. ``--slurm`` / ``--sbatch``; the local engine has none); ``WATCH_FLAG`` and ``job_id(text)``
  (the watchdog's ``--slurm-job ID`` and its check: the id, or ValueError saying what is wrong).
- ``state(job_id, runner=None) -> Job``: what the engine says of the job now, and when it ended
  what that end means for the run (``Job.end``). Any reading it needs (the scheduler, the job's
  output file) happens here, in observe: the judge's one engine rule (``judge.table.rule_engine``)
  only reads the Job.
- ``check(argv, cwd, env)``: UsageError (one line) when nothing could be submitted from here;
  ``submit(run, argv, *, cwd, env, log, options, runner=None) -> dict``: start the job, the launch
  record's fields that name it (``pid``... for the local engine, ``job_id`` for a scheduler);
  ``held(rec) -> bool``: the recorded job still queued or running; ``cancel(rec, grace_s, clock)
  -> Cancelled``: end it (act/ records the stop around the call).
- ``job_of(start) -> str | None``: the job id a start record says its attempt ran in (its writer
  read the engine's variables); ``resubmit(start, options) -> (launch.py words, note)``: how the
  relaunch line resubmits such an attempt; ``FRESH``: what to say when a run of it must start over.

Standard library only: the watchdog imports this on its hot path, and an engine module only when
a run uses it.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Optional

# name -> module: adding an engine is a module beside these and one line here
ENGINES = {
    "local": "supervise.observe.engines.local",
    "slurm": "supervise.observe.engines.slurm",
    "k8s": "supervise.observe.engines.k8s",
    "ray": "supervise.observe.engines.ray",
}
LOCAL = "local"

WAITING, RUNNING, ENDED, UNKNOWN = "waiting", "running", "ended", "unknown"


@dataclass(frozen=True)
class End:
    """What a job's end means for the run when no sentinel completes it: an anomaly's kind, its
    ``what`` (``<what> = <value>``) and its fix; the judge adds the step."""

    kind: str
    what: str
    fix: str


@dataclass(frozen=True)
class Job:
    """What an engine says of one job, in the same words for every engine.

    ``phase``: waiting (queued, held, requeued: no process is expected, so no stall), running (its
    start-up grace starts now), ended, or unknown (``error`` says why: the engine could not be
    asked; shown, never a verdict). ``state`` and ``reason`` are the engine's own words
    (``PENDING`` / ``Resources``). The observer adds its clocks: ``waiting_since``, when it first
    saw the job wait this time; ``running_since``, when it first saw it run (kept through an
    unknown reading; a wait or another job starts it over). ``note``: what the engine says that
    is worth a line but no verdict (a restart within the run's failure budget, with its count and
    the failed worker's node); the judge's notes show it."""

    engine: str
    job_id: str
    phase: str = UNKNOWN
    state: str = ""
    reason: str = ""
    nodes: str = ""
    exit_code: Optional[int] = None
    logs: Optional[str] = None
    end: Optional[End] = None
    error: Optional[str] = None
    note: str = ""
    waiting_since: Optional[float] = None
    running_since: Optional[float] = None

    @property
    def waiting(self) -> bool:
        return self.phase == WAITING

    @property
    def running(self) -> bool:
        return self.phase == RUNNING

    @property
    def ended(self) -> bool:
        return self.phase == ENDED

    def line(self) -> str:
        """``job 8 RUNNING on vm``, or the error: check-in's ``<engine>:`` line."""
        if self.error:
            return self.error
        return f"job {self.job_id} {self.state}" + (f" on {self.nodes}" if self.nodes else "")


@dataclass(frozen=True)
class Cancelled:
    """What ending a job did: ``how`` in words (the signals sent, ``scancel``), whether it is gone,
    the seconds it took to go (None: still there)."""

    how: list
    gone: bool
    took: Optional[float] = None
    line: str = ""


def engine(name: str) -> ModuleType:
    """The engine module registered as ``name``; KeyError naming the known ones."""
    if name not in ENGINES:
        raise KeyError(f"no engine {name!r}: known ones are {', '.join(ENGINES)}")
    return importlib.import_module(ENGINES[name])


def scheduled() -> list:
    """The engine modules that submit to a scheduler (every one but the local launcher)."""
    return [engine(name) for name in ENGINES if name != LOCAL]


def follow_flags() -> list:
    """(the watchdog's flag, its help) of every scheduler: references/thresholds.md's rows."""
    return [(eng.WATCH_FLAG, eng.WATCH_HELP) for eng in scheduled()]


def of_launch(rec: Optional[dict]) -> Optional[tuple]:
    """(engine name, job id) of a launch record's scheduled job, None for a local launch."""
    if rec and rec.get("engine") and rec["engine"] != LOCAL and rec.get("job_id"):
        return rec["engine"], rec["job_id"]
    return None


def of_start(start) -> Optional[tuple]:
    """(engine module, job id) of the scheduler a start record's attempt ran in, else None."""
    for eng in scheduled():
        job_id = eng.job_of(start or {})
        if job_id:
            return eng, job_id
    return None


__all__ = ["ENGINES", "LOCAL", "WAITING", "RUNNING", "ENDED", "UNKNOWN", "End", "Job", "Cancelled",
           "engine", "scheduled", "follow_flags", "of_launch", "of_start"]
