"""What one look at a run found, as frozen values: the input of ``judge`` and of every renderer.

``engine.Observer.observe()`` builds one ``Observation`` per poll from the files, processes,
ranks, scheduler and GPU; ``judge.judge(observation, thresholds)`` turns it into one
``Verdict``. Nothing here reads a file or a clock, so rules and tests build observations by
hand. Standard library only: this is on the hot path.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping, Optional

from supervise.vocabulary import ANOMALY, EXIT_ANOMALY, EXIT_OK, GONE

EMPTY: Mapping = MappingProxyType({})


@dataclass(frozen=True)
class Proc:
    """One process of the run as seen this poll.

    ``seen_alive``: this watchdog saw it alive, or a start/launch record written on this host (in
    this PID namespace and boot, where the record names them) says it ran here: only such a
    process can be *dead*. A process that cannot be seen from here (another host, another PID
    namespace: a sidecar container) is not listed at all (``Observation.visibility`` says why)."""

    pid: int
    state: str                       # running|sleeping|stopped|zombie|dead|gone|alive
    why: str = ""                    # "--pid", "launch record", "start record", "writes train.log", "child of N"
    child: bool = False              # a child of a run process: a hand-spawned rank, or a dataloader worker
    create_time: Optional[float] = None
    seen_alive: bool = True
    gone_for: float = 0.0            # s since this watchdog first saw it gone
    quiet_after_exit: float = 0.0    # child: s the metrics file has been silent since it went
    cpu_percent: Optional[float] = None   # a one-shot look samples the first live root's CPU
    rss: Optional[int] = None        # bytes

    @property
    def alive(self) -> bool:
        return self.state not in GONE


@dataclass(frozen=True)
class Records:
    """What the current attempt's records (after its last start record) said."""

    start: Mapping = field(default_factory=lambda: EMPTY)
    last_step: int = 0
    n_steps: int = 0
    n_evals: int = 0
    hits: Mapping = field(default_factory=lambda: EMPTY)            # kind -> the record rule's first hit (alarms and warnings)
    fatal: Optional[Mapping] = None
    steps: tuple = ()                # the last step records, oldest first
    evals: tuple = ()                # the last eval records
    best_eval: Optional[Mapping] = None
    attempts: tuple = ()             # (start record, its first logged step or None) per attempt, oldest first
    steps_per_s: Optional[float] = None   # measured over the attempt's records (record time t)
    elapsed: Optional[float] = None  # record time t of the last record
    unknown: int = 0                 # records of no known kind

    @property
    def eta_s(self) -> Optional[float]:
        """Seconds to total_steps at the recent pace: the median sps of the last five step
        records over the samples per step (batch_size x world_size), else the attempt's
        steps per second; None without a total or a pace."""
        total = self.start.get("total_steps")
        if not total or total <= self.last_step:
            return None
        per_step = (self.start.get("batch_size") or 0) * (self.start.get("world_size") or 1)
        sps = sorted(r["sps"] for r in self.steps[-5:] if isinstance(r.get("sps"), (int, float))
                     and not isinstance(r.get("sps"), bool) and r["sps"] > 0 and r["sps"] != float("inf"))
        if sps and per_step:
            return (total - self.last_step) / (sps[len(sps) // 2] / per_step)
        return (total - self.last_step) / self.steps_per_s if self.steps_per_s else None


@dataclass(frozen=True)
class WatchdogSeen:
    """The run's watchdog as its watchdog.json says, seen by a one-shot look (check-in, plot).

    ``alive``: that process still runs (its pid, and its start time when recorded). ``ended``:
    it ended on a verdict (done, an anomaly, a stop by stop.py; ``judge.table.watchdog_ended``
    says whether it is about the run), not on a signal to
    itself; ``same_attempt``: that verdict is about the attempt the records show now (run_id,
    attempt and launch pid agree), so it is the verdict."""

    pid: Optional[int]
    alive: bool
    state: str                       # watching | finishing | done | anomaly | stopped
    last_poll: Optional[float] = None
    argv: tuple = ()                 # its flags after RUN_DIR (check-in offers them again)
    ended: bool = False
    same_attempt: bool = False
    ended_by: str = ""               # the signal that ended the watchdog itself
    kind: Optional[str] = None
    step: int = 0
    message: str = ""
    headline: str = ""               # its verdict's headline (ANOMALY <kind>, DONE, STOPPED)
    bad_lines: Optional[int] = None
    stacks: Optional[Mapping] = None # its capture of a hang (watchdog.json's stacks): folder, files, where


@dataclass(frozen=True)
class Observation:
    """One frozen look at a run. Clocks are wall-clock seconds (time.time())."""

    now: float
    watch_started: float
    judged_from: float = 0.0         # wall clock: nothing before it is judged (a --from-now watchdog's start), 0: all
    records: Records = field(default_factory=Records)
    processes: tuple = ()            # Proc, the current attempt's (and its children)
    visibility: str = ""             # '' when a run process is visible here, else why none is
    relaunch: Optional[Proc] = None  # a process newer than the records' attempt that has not written its start record
    started: float = 0.0             # when the attempt began: its oldest process, else its start record, else watching
    metrics_mtime: Optional[float] = None
    quiet_since: Optional[float] = None   # the latest of the last metrics write and the newest process's birth
    stall_after: float = 360.0       # s of silence that are a stall now
    stall_why: str = ""              # how stall_after was set (learned, announced)
    stall_soonest: float = 360.0     # s: the shortest stall the clock may learn before the next look
    sentinel: Optional[Mapping] = None    # the current run's completion sentinel, when written
    sentinel_name: str = "final_val_metrics.json"
    sentinel_mtime: Optional[float] = None
    log_tail: tuple = ()             # filtered last lines of train.log (read when something ended, or one-shot)
    log_mtime: Optional[float] = None
    root_cause: Any = None           # logs.RootCause of torchrun's failure block, when the log has one
    killed: Any = None               # logs.Killed: whether the root cause's SIGKILL was the OOM killer's
    ranks: Mapping = field(default_factory=lambda: EMPTY)           # rank -> ranks.RankState
    rank_procs: Mapping = field(default_factory=lambda: EMPTY)      # pid -> state of the local ranks' processes
    rank_where: Mapping = field(default_factory=lambda: EMPTY)      # rank -> why its pid is not probed here (probes.locality:
                                                                    # "host", "pid_ns", "boot"); judged by its heartbeats
    job: Any = None                  # engines.Job: the scheduled job followed (launch.json's, --slurm-job), when one is
    gpu_util: Optional[float] = None # max utilization of the run's GPUs, %; None: no GPU reading
    gpu_idle_for: float = 0.0
    gpu_lines: tuple = ()            # one line per GPU, or the reason there is no reading
    checkpoint_dirs: tuple = ()      # the run's checkpoint folders, resolved once (--checkpoint-dir, the start record's, RUN/checkpoints)
    disk: Any = None                 # checkpoints.DiskState of the run's checkpoint folders; None when none is known
    resume: Any = None               # checkpoints.Checkpoint a relaunch resumes from (choose_resume), or None
    resume_skipped: tuple = ()       # (Checkpoint, why) newer ones it skips: torn, or written after the first NaN
    volume_free: Optional[tuple] = None   # (free, total) bytes of the file system holding RUN_DIR
    volumes: tuple = ()              # volumes.VolumeState of each volume of the run (run folder, log, checkpoints)
    last_error: Optional[str] = None # the log tail's OOM line, else its last error line
    blind: str = ""                  # why the run cannot be seen, '' when it can
    hold_for: float = 0.0            # s left of the relaunch grace: history alone, no process yet
    time_limit: Optional[float] = None    # s from `started` after which the run is over its plan
    time_limit_why: str = ""
    failed_launches: int = 0         # launches after the last start record that died before writing one
    stopped: str = ""                # who stopped the launched trainer on purpose (scripts/stop.py), '' if nobody
    watchdog: Optional[WatchdogSeen] = None   # the run's watchdog (a one-shot look reads watchdog.json)
    launch: Optional[Mapping] = None # launch.json, typed (state.read_launch), when there is one
    hang: Any = None                 # stacks.Capture: what the watchdog's capture of a hang found (watch.py)
    sample_after: float = 0.0        # s of silence after which the watchdog samples the stacks (hang evidence); 0: it does not
    frames: Any = None               # stacks.FrameFacts: what the samples of this silence showed; None before the first

    @property
    def alive(self) -> list:
        return [p for p in self.processes if p.alive]

    @property
    def job_waiting(self) -> bool:
        """The scheduler holds the job in its queue (or requeued it): no process, no record is expected."""
        return self.job is not None and self.job.waiting

    @property
    def has_steps(self) -> bool:
        return bool(self.records.n_steps or self.records.fatal or "nan" in self.records.hits)


@dataclass(frozen=True)
class Verdict:
    """The one verdict every tool renders. state: watching | finishing | done | anomaly | stopped."""

    state: str
    line: str = ""
    anomaly: Any = None              # rules.Anomaly
    headline: str = ""               # RUNNING healthy | STARTING | NOT STARTED | FINISHING | DONE | ANOMALY <kind> | STOPPED
    notes: tuple = ()                # said once: the process is not visible here, a relaunch is starting, ...
    warnings: tuple = ()             # rules.Anomaly that do not end the watch (overfit)
    recheck_in: float = 0.0          # s: look once more this soon before trusting what history says
    change: Optional[str] = None     # the relaunch change the kind calls for: lr | batch | same | None
    move: Optional[str] = None       # the next move (vocabulary.MOVES) after an anomaly

    @property
    def code(self) -> int:
        return EXIT_ANOMALY if self.state == ANOMALY else EXIT_OK

    @property
    def kind(self) -> Optional[str]:
        return self.anomaly.kind if self.anomaly is not None else None


def frozen(d: Optional[Mapping]) -> Mapping:
    """A read-only view of a record (records are dicts; observations must not change)."""
    return MappingProxyType(dict(d)) if d else EMPTY


__all__ = ["EMPTY", "Proc", "Records", "Observation", "Verdict", "WatchdogSeen", "frozen"]
