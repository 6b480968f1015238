"""The verdict: one pure function of one ``Observation`` over one rule table.

    verdict = judge(observation, thresholds)

``RULES`` is the one table of kinds, most specific first: for each its check (a record rule's
first hit, the record rule class being its ``record`` column, or a pure function of the
observation), the relaunch change it calls for, and whether it is an alarm or a check-in
warning. ``KINDS``, ``RECORD_RULES`` and ``change_for`` are derived from it. When several kinds
hold, the first in the table is reported; ``no_progress`` escalates: it is consulted over an
alarm whose fix is a relaunch, and reported instead when the last relaunches made none.

Semantics, stated once (references/contract.md repeats them):
- A process that cannot be seen from this host (none found, or a start record naming another
  host, or this host in another PID namespace or boot: a sidecar container's watchdog) is not
  dead: the run is judged by its records and heartbeats, and so is a rank whose heartbeat names
  another host, PID namespace or boot (``Observation.rank_where``). Fresh records are a
  running run, silence past the stall limit a ``stall``. ``dead`` needs a process seen alive
  (by this watchdog, or by its own start or launch record on this host) and then gone, or the
  scheduler saying so.
- A record rule's first hit wins over a later sentinel: a run that logged a non-finite loss
  never ends ``OK done``.
- History (the sentinel, FATAL or first hit of an attempt older than a live process, or any of
  them found at attach with no process yet) never decides while a newer process lives
  (``Observation.relaunch``), nor within the relaunch grace (``Observation.hold_for``).
- With the trainer visible, done is the sentinel and the process's exit; until then the verdict
  is ``finishing``.
Standard library only: this is on the hot path.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from supervise.observe import ranks as rk
from supervise.observe import records as rr
from supervise.observe import volumes as vol
from supervise.observe.checkpoints import remaining_saves, rule_disk as disk_ahead
from supervise.observe.logs import ENOSPC, enospc_line, is_environment, is_fallout, last_error, oom_line
from supervise.observe.observation import Observation, Verdict
from supervise.thresholds import Thresholds
from supervise.vocabulary import (ANOMALY, AS_IS, DONE, FINISHING, FIX_FIRST, GONE, RELAUNCH, STOP_ASK, STOPPED,
                                  WATCH_ON, WATCHING, Anomaly, anomaly, secs)

# How near the end of the log an error must be to be the process's last word (lines after it).
LAST_WORDS = 40


@dataclass(frozen=True)
class Rule:
    """One kind, one row: how it is found, what a relaunch changes, alarm or warning."""

    kind: str
    check: Optional[Callable[[Observation, Thresholds], Optional[Anomaly]]] = None  # None: the record rule's first hit
    change: Optional[str] = None     # relaunch: "lr" (halve it), "batch" (halve, double accumulation), "same", None (no relaunch)
    record: Optional[type] = None    # the rules.RecordRule class that finds it in the records, in order
    process: bool = False            # a process/time rule: it has nothing to say about a finished run
    escalates: bool = False          # consulted only over an alarm with a relaunch change, and then reported instead
    alarm_flag: Optional[str] = None  # the Thresholds switch without which it is a check-in warning, not an alarm
    move: str = FIX_FIRST            # the next move after it (vocabulary.MOVES); ``move_for`` refines a few by the facts
    engine: bool = False             # a scheduler's end of the job may be of this kind (rule_engine), consulted first
    hang: str = ""                   # a hang kind: its line names what the watchdog's capture found (obs.hang), the
                                     # capture's fix in place of the row's ("fix") or before it ("then")

    def find(self, obs: Observation, th: Thresholds) -> Optional[Anomaly]:
        found = self._find(obs, th)
        return _named(found, obs, keep_fix=self.hang == "then") if self.hang and found is not None else found

    def _find(self, obs: Observation, th: Thresholds) -> Optional[Anomaly]:
        if self.engine:
            found = rule_engine(obs, th)
            if found is not None and found.kind == self.kind:
                return found
        if self.check is not None:
            return self.check(obs, th)
        return obs.records.hits.get(self.kind) if self.record is not None else None

    def is_warning(self, th: Thresholds) -> bool:
        """A check-in warning, not an alarm (overfit unless --overfit-alarm)."""
        return self.alarm_flag is not None and not getattr(th, self.alarm_flag)


# --- what ended: processes, the log ---------------------------------------------------------
def _roots(obs: Observation) -> list:
    return [p for p in obs.processes if not p.child and p.seen_alive]


def died(obs: Observation, th: Thresholds) -> bool:
    """The attempt's processes, seen alive, are gone: all of them, or one of several for
    longer than --rank-grace."""
    roots = _roots(obs)
    gone = [p for p in roots if not p.alive]
    if not gone:
        return False
    return len(gone) == len(roots) or max(p.gone_for for p in gone) > th.rank_grace


def _last_words(obs: Observation) -> Optional[str]:
    """The error the log ends with (a traceback near its end, newer than the attempt's start),
    when no process of the run lives: a crash before the watchdog looked, or on another host."""
    if obs.alive or not obs.log_tail:
        return None
    start_t = obs.records.start.get("time")
    if obs.log_mtime is not None and start_t is not None and obs.log_mtime < start_t:
        return None
    if obs.log_mtime is not None and obs.metrics_mtime is not None and obs.log_mtime + 1 < obs.metrics_mtime:
        return None  # records came after it: an error the run survived
    tail = list(obs.log_tail[-LAST_WORDS:])
    return oom_line(tail) or last_error(tail)


def _ended(obs: Observation, th: Thresholds) -> bool:
    return died(obs, th) or _last_words(obs) is not None


def _root_cause(obs: Observation, th: Thresholds) -> Optional[Anomaly]:
    """torchrun's first observed failure, once the run ended."""
    c = obs.root_cause
    if c is None or obs.alive and not died(obs, th):
        return None
    k = obs.killed
    return rk.root_cause_anomaly(c, obs.records.last_step, k.text if k else None, bool(k and k.oom))


def rule_blind(obs, th):
    if not obs.blind:
        return None
    return anomaly("blind", f"read error = {obs.blind!r}", obs.records.last_step,
                   "The watchdog cannot see the run: fix the file's permissions or type (it must be a "
                   "regular file), then restart the watchdog")


def rule_oom(obs, th):
    cause = _root_cause(obs, th)
    if cause is not None:
        return cause if cause.kind == "oom" else None
    if not _ended(obs, th):
        return None
    line = oom_line(obs.log_tail)
    if line is None:
        return None
    return anomaly("oom", f"log line = {line[:160]!r} after the process died", obs.records.last_step,
                   "Out of memory: halve the per-device batch size (keep the effective batch with "
                   "gradient accumulation) or shorten the sequence length, then relaunch")


DISK_FULL = ("The disk is full: delete old checkpoints or rotate them (save_total_limit), or move the "
             "checkpoints to another volume, then relaunch from the last complete checkpoint (checkin.py names it)")


def rule_disk(obs, th):
    """A FATAL, torchrun root cause or last error saying the disk is full (not ``crash``/``dead``),
    or the trainer dead with a volume of the run full (volumes.rule_full: its log could not take
    the error); while the run lives, the next save or the remaining saves not fitting
    (checkpoints.rule_disk), else a volume of the run filling, whatever fills it (volumes.rule_ahead)."""
    step = obs.records.last_step
    fatal = (obs.records.fatal or {}).get("FATAL")
    if fatal and ENOSPC.search(fatal):
        return anomaly("disk", f"FATAL = {fatal[:160]!r} says the disk is full", step, DISK_FULL)
    if _ended(obs, th):
        cause = obs.root_cause.message if obs.root_cause is not None else None
        tail = list(obs.log_tail)
        err = cause or last_error(tail)
        line = err if err and ENOSPC.search(err) else enospc_line(tail[-LAST_WORDS:]) if err is None else None
        if line is None:
            save = obs.disk.bytes_per_save if obs.disk is not None else None
            return vol.rule_full(obs.volumes, th, step, _who_died(obs), save, other_error=err is not None)
        return anomaly("disk", f"log line = {line[:160]!r} after the process died", step, DISK_FULL)
    d = obs.disk
    found = disk_ahead(d, th, remaining_saves(d, obs.records.start.get("total_steps"), step), step) \
        if d is not None else None
    return found or vol.rule_ahead(obs.volumes, th, step)


def rule_crash(obs, th):
    if obs.job is not None:
        return None  # the scheduler says how the job ended (rule_engine): a log line may be its cancel
    cause = _root_cause(obs, th)
    if cause is not None:
        return cause if cause.kind == "crash" else None
    if died(obs, th):
        err = last_error(obs.log_tail)
    else:
        err = _last_words(obs)
    if err is None:
        return None
    who = _who_died(obs)
    return anomaly("crash", f"last error line = {err[:200]!r} after {who}", obs.records.last_step,
                   "Fix that error (checkin.py shows the log tail), then relaunch from the last checkpoint")


def _who_died(obs: Observation) -> str:
    if obs.relaunch is not None and not obs.relaunch.alive:
        p = obs.relaunch
        return f"the relaunch (pid {p.pid}, {p.why}) died before its start record"
    gone = [p for p in _roots(obs) if not p.alive]
    return f"pid {gone[0].pid} ({gone[0].why}) died" if gone else "the process died"


def rule_dead(obs, th):
    if obs.job is not None:
        return None  # the scheduler says how the job ended (rule_engine)
    step = obs.records.last_step
    fix = ("The trainer exited without writing its sentinel: read the end of train.log through "
           "checkin.py, then relaunch from the last checkpoint")
    if obs.ranks and died(obs, th):
        found = rk.rank_dead(obs.ranks, obs.rank_procs, obs.root_cause, where=obs.rank_where)
        if found is not None:
            return found
    if died(obs, th):
        gone = [p for p in _roots(obs) if not p.alive]
        p = gone[0]
        if obs.relaunch is not None and obs.relaunch.pid == p.pid:
            return anomaly("dead", f"relaunch pid {p.pid} ({p.why}) = {p.state} != alive before its start record",
                           step, "The relaunched command exited before training began: read train.log "
                           "through checkin.py (a rejected flag, a missing file), fix the line, then relaunch")
        return anomaly("dead", f"pid {p.pid} ({p.why}) = {p.state} != alive with no sentinel", step, fix)
    for p in obs.processes:
        if p.child and not p.alive and p.quiet_after_exit > max(th.rank_grace, obs.stall_after / 10):
            parent = p.why
            return anomaly("dead", f"pid {p.pid} ({parent}) = {p.state} != alive, metrics silent "
                           f"{secs(p.quiet_after_exit)} since", step,
                           "A process the run spawned (a rank) died and the run waits for it: read its "
                           "error in train.log through checkin.py, then kill the run and relaunch from the last checkpoint")
    return None


def rule_rank_hang(obs, th):
    if len(obs.ranks) < 2 or died(obs, th):
        return None  # one process: the stall rule names a stopped pid
    return rk.rank_hang(obs.ranks, obs.now, obs.rank_procs, stall_s=obs.stall_after, where=obs.rank_where)


def rule_rank_fatal(obs, th):
    if obs.root_cause is not None or not obs.ranks:
        return None
    found = rk.rank_fatal(obs.ranks)
    if found is None or any(is_fallout(s.fatal or "") for s in obs.ranks.values()):
        return None  # a peer's "connection reset" after another rank died is fallout, not the cause
    return found


def rule_fatal(obs, th):
    found = obs.records.hits.get("fatal")
    if found is not None and ENOSPC.search(found.message):
        return None  # the disk rule names it
    return found or rule_rank_fatal(obs, th)


def rule_straggler(obs, th):
    if not obs.ranks or obs.now - th.throughput_window < obs.judged_from:
        return None  # a --from-now watchdog judges a window that began after its start
    return rk.straggler(obs.ranks, obs.now, window_s=th.throughput_window, ratio=th.straggler_ratio)


def rule_stall(obs, th):
    stopped = [p for p in obs.processes if p.state == "stopped"]
    if stopped:
        p = stopped[0]
        return anomaly("stall", f"pid {p.pid} state = stopped != running", obs.records.last_step,
                       f"The process is suspended (SIGSTOP or Ctrl-Z): resume it with kill -CONT {p.pid}, "
                       "or kill it and relaunch")
    if not obs.has_steps or obs.quiet_since is None or _ended(obs, th) or obs.relaunch is not None:
        return None
    if obs.job_waiting:
        return None  # queued or requeued: no record is expected until the job runs again
    if obs.job is not None and obs.metrics_mtime is not None and obs.metrics_mtime < obs.started \
            and obs.now - obs.started <= th.startup_grace:
        return None  # the job (re)started after its last record: its start-up grace comes first
    if obs.processes and not obs.alive:
        return None  # gone: dead or crash says so
    age = obs.now - obs.quiet_since
    fr = obs.frames
    live = obs.alive
    fix = (f"The process lives but writes nothing: py-spy dump --pid {live[0].pid} shows where it hangs "
           "(a dataloader worker, a collective, a lock); kill it and relaunch") if live else ""
    if frames_hang(obs, th):   # the frames' evidence, before the clock's limit (references/hangs.md)
        return anomaly("stall", f"main-thread frames unchanged in a wait = {secs(fr.still_for)} >= "
                       f"{secs(th.hang_window)} ({fr.where}; metrics age {secs(age)}, sampled after "
                       f"{secs(obs.sample_after)} of silence)", obs.records.last_step, fix)
    if age <= obs.stall_after:
        return None
    if fr is not None and fr.complete and fr.samples < 2 and age <= PUSH_OUT * th.max_stall:
        return None   # one sample (a watchdog that came in a long silence): the next says whether the frames move
    moved = fr.moved_at if fr is not None and fr.complete and fr.moved_at is not None else None
    if moved is not None and moved > obs.quiet_since and obs.now - moved <= obs.stall_after \
            and age <= PUSH_OUT * th.max_stall:
        return None   # the frames move: it works; the clock counts from their last move
    unseen = f": {obs.visibility}" if obs.visibility else ""
    where = fix or (
             f"Nothing writes the metrics any more and no process of the run is visible from here{unseen}; "
             "judged by its records, it died or hangs where it runs: check the trainer there (its host, its "
             "container, the scheduler), then kill and relaunch it if it hangs")
    also = f", frames last moved {secs(obs.now - moved)} ago" if moved is not None and moved > obs.quiet_since else ""
    return anomaly("stall", f"metrics age = {secs(age)} > {secs(obs.stall_after)}{obs.stall_why}{also}",
                   obs.records.last_step, where)


PUSH_OUT = 3   # x --max-stall: frames that keep moving without a record hold the clock off at most this long


def frames_hang(obs: Observation, th: Thresholds) -> bool:
    """The samples of this silence show a hang (``Observation.frames``, stacks.FrameFacts): every
    process of the run here sampled, its main-thread frames the same and it idle for --hang-window,
    every rank's innermost frame in a wait, none in a checkpoint save (that keeps the clock's
    slow-save rule)."""
    fr = obs.frames
    return (fr is not None and th.hang_window > 0 and fr.complete and fr.waiting and not fr.saving
            and fr.still_since is not None and fr.still_for >= th.hang_window - 0.01)


def rule_no_telemetry(obs, th):
    if obs.has_steps or obs.job_waiting:
        return None
    waited = obs.now - obs.started
    if waited <= th.startup_grace:
        return None
    return anomaly("no_telemetry", f"time without a step record = {secs(waited)} > {secs(th.startup_grace)}",
                   obs.records.last_step, "No step record yet: check that the script writes RUN_DIR/metrics.jsonl "
                   "(the --out folder) and read train.log through checkin.py")


NO_PROGRESS_AFTER = 3     # relaunches without the checkpoint's step moving


def no_progress(starts_and_checkpoint_steps, *, current: Optional[int] = None, after: int = NO_PROGRESS_AFTER,
                last: Optional[str] = None) -> Optional[Anomaly]:
    """``no_progress`` when the last ``after`` relaunches all began at the same checkpoint step.

    ``starts_and_checkpoint_steps``: one (start record, step) per attempt, oldest first; step is
    where that attempt began (its first logged step: a resumed attempt's first step lies one
    logging interval after the checkpoint it began at, so equal values mean the same
    checkpoint), None when it logged nothing. The first attempt is the launch, the others
    relaunches; a relaunch with None began nowhere visible and counts as no progress.
    ``current``: the same measure now, when known: a last attempt that moved it made progress.
    ``last``: the kind the last attempt ended in, named in the message."""
    relaunches = [step for _start, step in list(starts_and_checkpoint_steps)[1:]]
    if len(relaunches) < after:
        return None
    known = {s for s in relaunches[-after:] if s is not None}
    if len(known) > 1:
        return None
    step = known.pop() if known else None
    if current is not None and step is not None and current != step:
        return None
    ended = f" (the last ended in {last})" if last else ""
    return anomaly("no_progress", f"relaunches without the checkpoint step moving = {after} >= {after}{ended}",
                   step or 0, "Stop relaunching: read the last error in check-in, fix its cause or ask the user, "
                   "then relaunch once")


def rule_no_progress(obs, th, last: Optional[str] = None):
    """Consulted over an alarm whose fix is a relaunch (``Rule.escalates``): the relaunch would be
    the next of several that began at the same checkpoint, so the verdict is no_progress. The
    relaunches are the attempts' start records and the launches that died before writing one."""
    attempts = list(obs.records.attempts) + [({}, None)] * obs.failed_launches
    return no_progress(attempts, last=last)


def rule_engine(obs, th):
    """The one engine rule: the end the scheduler reports for the job (``Observation.job.end``,
    read by its engine in observe), unless the sentinel completes the run. Every row with
    ``engine=True`` consults it first and keeps it when the kind is its own, so the table's order
    still decides."""
    job = obs.job
    if job is None or not job.ended or job.end is None or obs.sentinel is not None:
        return None
    return anomaly(job.end.kind, job.end.what, obs.records.last_step, job.end.fix)


def rule_gpu_idle(obs, th):
    if obs.gpu_util is None or _ended(obs, th) or not obs.alive:
        return None
    if obs.now - obs.started <= th.startup_grace or obs.gpu_idle_for <= th.gpu_idle:
        return None
    pid = obs.alive[0].pid
    return anomaly("gpu_idle", f"GPU utilization = {obs.gpu_util:.0f}% < {th.gpu_idle_util:g}% for "
                   f"{secs(obs.gpu_idle_for)} > {secs(th.gpu_idle)}", obs.records.last_step,
                   "The process lives but the GPU does nothing: a CPU-bound dataloader, a hang in a "
                   f"collective, or the model on the CPU; py-spy dump --pid {pid} shows which")


def rule_timeout(obs, th):
    if obs.time_limit is None:
        return None
    began = obs.records.start.get("time")
    ran = obs.now - (began if isinstance(began, (int, float)) and began > 0 else obs.started)  # the run's own start
    if ran <= obs.time_limit:
        return None
    return anomaly("timeout", f"wall time = {secs(ran)} > {secs(obs.time_limit)} ({obs.time_limit_why})",
                   obs.records.last_step, "The run outlived its plan: stop it (scripts/stop.py RUN_DIR), keep the "
                   "best checkpoint, and bench again before relaunching a shorter run")


def _named(found: Anomaly, obs: Observation, keep_fix: bool = False) -> Anomaly:
    """A hang kind's anomaly with its line naming what the watchdog's capture found (``obs.hang``):
    where every rank sits and the stacks folder, or why no stack could be taken."""
    if obs.hang is None:
        return found
    tail = f" at step {found.step}. "
    at = found.message.find(tail)
    if at < 0:
        return found
    what, fix = found.message[len(f"ANOMALY {found.kind}: "):at], found.message[at + len(tail):].rstrip(".")
    then = fix[0].lower() + fix[1:] if keep_fix and fix else ""
    from supervise.observe.stacks import hang_fix   # only once a capture exists: off every look's start-up
    return anomaly(found.kind, what, found.step, hang_fix(obs.hang, fix, then))


RULES = (
    Rule("blind", rule_blind, process=True),
    Rule("no_progress", rule_no_progress, escalates=True),
    Rule("nan", change="lr", record=rr.Nan, move=RELAUNCH),
    Rule("fatal", rule_fatal, "same", record=rr.Fatal, move=AS_IS),
    Rule("oom", rule_oom, "batch", process=True, engine=True, move=RELAUNCH),
    Rule("disk", rule_disk, "same", process=True, move=AS_IS),
    Rule("crash", rule_crash, "same", process=True, engine=True, move=AS_IS),
    Rule("node_fail", None, "same", process=True, engine=True, move=AS_IS),
    Rule("preempted", None, "same", process=True, engine=True, move=AS_IS),
    Rule("diverged", change="lr", record=rr.Diverged, move=RELAUNCH),
    Rule("loss_spike", change="lr", record=rr.LossSpike, move=RELAUNCH),
    Rule("dead", rule_dead, "same", process=True, engine=True, move=AS_IS),
    Rule("rank_hang", rule_rank_hang, "same", process=True, move=AS_IS, hang="fix"),
    Rule("stall", rule_stall, "same", process=True, move=AS_IS, hang="fix"),
    Rule("no_telemetry", rule_no_telemetry, process=True, hang="fix"),
    Rule("inverted_labels", record=rr.InvertedLabels, move=STOP_ASK),
    Rule("stuck_auroc", record=rr.StuckAuroc, move=STOP_ASK),
    Rule("chance_loss", record=rr.ChanceLoss, move=STOP_ASK),
    Rule("grad_explode", change="lr", record=rr.GradExplode, move=RELAUNCH),
    Rule("grad_collapse", record=rr.GradCollapse, move=STOP_ASK),
    Rule("overfit", record=rr.Overfit, alarm_flag="overfit_alarm", move=STOP_ASK),
    Rule("throughput", record=rr.Throughput, move=WATCH_ON),
    Rule("straggler", rule_straggler, process=True, move=WATCH_ON),
    Rule("gpu_idle", rule_gpu_idle, process=True, move=WATCH_ON),
    Rule("timeout", rule_timeout, process=True, engine=True, move=STOP_ASK, hang="then"),
)
# Derived from the one table, never kept beside it:
BY_KIND = {r.kind: r for r in RULES}
KINDS = tuple(BY_KIND)                                        # every kind, most specific first
RECORD_RULES = tuple(r.record for r in RULES if r.record)     # what the observer folds the records with
HANG_KINDS = tuple(r.kind for r in RULES if r.hang)           # a live process's stacks are taken (watch.py)


def is_hang(verdict: Verdict, obs: Observation) -> bool:
    """The verdict is a hang with a live process of the run on this host to look at: a hang
    kind's (``HANG_KINDS``), but not a suspended process (its line says so)."""
    if verdict.state != ANOMALY or verdict.kind not in HANG_KINDS:
        return False
    if any(p.state == "stopped" for p in obs.processes) or "stopped" in obs.rank_procs.values():
        return False
    return bool(obs.alive) or any(s not in GONE for s in obs.rank_procs.values())


def move_for(kind: Optional[str], message: str = "", obs: Optional[Observation] = None,
             th: Optional[Thresholds] = None) -> tuple[str, Optional[str]]:
    """(the next move, the relaunch change) for a kind: its row's, refined by the facts. No kind
    (a run found dead by hand) is a relaunch as is. A ``fatal`` that says a value is not finite
    halves the learning rate. ``crash`` and any other ``fatal`` (the writers record the exception
    that ended the loop) are a relaunch as is only when the error is the environment's
    (``logs.is_environment``: NCCL/gloo, CUDA, ECC, a network file system, a signal), else the
    user's code is fixed first. ``disk`` is fix-first while the trainer lives (free space;
    it goes on) or until every volume of the run has room (``volumes.shortfall``). A ``stall`` of a
    stopped process is watch-on (resume it). The change is None unless the move relaunches."""
    if kind is None:
        return AS_IS, "same"
    rule = BY_KIND.get(kind)
    if rule is None:
        return FIX_FIRST, None
    move, change = rule.move, rule.change
    if kind == "fatal" and "non-finite" in message:
        move, change = RELAUNCH, "lr"
    elif kind in ("crash", "fatal") and not is_environment(message):
        move = FIX_FIRST
    elif kind == "disk" and obs is not None and th is not None:
        save = obs.disk.bytes_per_save if obs.disk is not None else None
        if obs.alive or vol.shortfall(obs.volumes, th, save) is not None:
            move = FIX_FIRST
    elif kind == "stall" and obs is not None and any(p.state == "stopped" for p in obs.processes):
        move = WATCH_ON
    return move, (change if move in (RELAUNCH, AS_IS) else None)


def change_for(kind: Optional[str], message: str = "") -> Optional[str]:
    """The relaunch change for a kind: 'lr', 'batch', 'same', or None (a relaunch does not fix it)."""
    return move_for(kind, message)[1]


def is_warning(kind: str, th: Thresholds) -> bool:
    """A kind that is a check-in warning, not an alarm, under these thresholds."""
    rule = BY_KIND.get(kind)
    return bool(rule and rule.is_warning(th))


def _headline(obs: Observation) -> str:
    queued = obs.job is not None and (obs.job.waiting or obs.job.running)
    if obs.relaunch is not None or (not obs.records.n_steps and (obs.alive or queued)):
        return "STARTING"
    if not obs.records.n_steps:
        return "NOT STARTED"
    return "RUNNING healthy"


def _notes(obs: Observation) -> tuple:
    notes = []
    if obs.visibility:
        notes.append(f"process not visible here: {obs.visibility}; judged by its records")
    if obs.job_waiting:
        j = obs.job
        notes.append(f"{j.engine.capitalize()} job {j.job_id} is {j.state}{f' ({j.reason})' if j.reason else ''}: it waits (queued, "
                     "scheduling, restarting or held), and no record is expected until it runs")
    if obs.job is not None and obs.job.note:
        notes.append(f"{obs.job.engine}: {obs.job.note}")
    if obs.relaunch is not None:
        p = obs.relaunch
        notes.append(f"relaunch pid {p.pid} ({p.why}) has not written its start record yet: "
                     "the previous attempt's records are history")
    return tuple(notes)


def _done(obs: Observation, notes: tuple) -> Verdict:
    final = obs.sentinel or {}
    nums = [(k, v) for k, v in final.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
            and k != "attempt"][:6]
    facts = "; " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in nums) if nums else ""
    start = obs.records.start
    of = f"/{start['total_steps']}" if start.get("total_steps") else ""
    attempt = f" (attempt {start['attempt']})" if start.get("attempt") else ""
    ran = obs.now - obs.watch_started
    line = (f"OK done: {obs.sentinel_name} written at step {obs.records.last_step}{of}{attempt} "
            f"after {ran:.0f}s of watching{facts}")
    return Verdict(DONE, line, None, "DONE", notes)


def judge(obs: Observation, th: Thresholds) -> Verdict:
    """The verdict on one observation: the first alarm of ``RULES``, else done / finishing /
    watching. Pure: no file, process or clock is read."""
    notes = _notes(obs)
    warnings = tuple(a for k, a in obs.records.hits.items() if BY_KIND[k].is_warning(th))
    trainer = [p for p in obs.alive if not p.child]   # a rank or worker outliving the trainer is no reason to wait
    finished = obs.sentinel is not None and not trainer
    said = _watchdog_verdict(obs, th, notes, warnings)
    if said is not None:
        return said
    if obs.stopped and not trainer and obs.sentinel is None:
        first = next((a for r in RULES if not r.process and not r.escalates and not r.is_warning(th)
                      for a in (r.find(obs, th),) if a is not None), None)
        if first is None:  # a first hit before the stop is still the verdict
            return Verdict(STOPPED, f"STOPPED: {obs.stopped} at step {obs.records.last_step}; no anomaly before it",
                           None, "STOPPED", notes, warnings)
    late = finished and _after_sentinel(obs)
    for rule in RULES:
        if rule.escalates:
            continue
        if rule.process and finished and rule.kind != "blind" and not (late and rule.kind in ("oom", "crash")):
            continue  # a finished run's processes have ended: that is no anomaly
        found = rule.find(obs, th)
        if found is None or rule.is_warning(th):
            continue
        if obs.hold_for > 0:
            return Verdict(WATCHING, "", None, _headline(obs), notes, warnings, recheck_in=obs.hold_for)
        if move_for(found.kind, found.message, obs, th)[1] is not None:
            found = rule_no_progress(obs, th, last=found.kind) or found
        move, change = move_for(found.kind, found.message, obs, th)
        return Verdict(ANOMALY, found.message, found, f"ANOMALY {found.kind}", notes, warnings,
                       change=change, move=move)
    if obs.sentinel is not None:
        if obs.hold_for > 0:
            return Verdict(WATCHING, "", None, _headline(obs), notes, warnings, recheck_in=obs.hold_for)
        quiet = obs.now - obs.sentinel_mtime if obs.sentinel_mtime is not None else 0.0
        if trainer and quiet <= obs.stall_after:
            return Verdict(FINISHING, "", None, "FINISHING",
                           notes + (f"{obs.sentinel_name} written; pid {trainer[0].pid} is finishing "
                                    "(a final save or eval): done when it exits",), warnings)
        v = _done(obs, notes + ((f"pid {trainer[0].pid} still runs {secs(quiet)} after the sentinel",)
                                if trainer else ()))
        return Verdict(v.state, v.line, None, v.headline, v.notes, warnings)
    return Verdict(WATCHING, "", None, _headline(obs), notes, warnings, recheck_in=_stall_due_in(obs, th))


def _stall_due_in(obs: Observation, th: Optional[Thresholds] = None) -> float:
    """Seconds until the watchdog must look again: when the silence passes the stall limit, and
    never later than the shortest limit the clock may learn from records written meanwhile (so
    the first learned deadline is met, not a poll later). 0: no stall is coming (a relaunch,
    nothing alive)."""
    if obs.quiet_since is None or obs.relaunch is not None or (obs.processes and not obs.alive):
        return 0.0
    if not obs.has_steps:
        return obs.stall_soonest
    left = obs.quiet_since + obs.stall_after - obs.now
    due = min(left + 0.25, obs.stall_soonest) if left > 0 else 0.0
    if obs.sample_after > 0 and obs.alive:   # the watchdog samples the stacks of a silence: its next sample
        to = obs.quiet_since + obs.sample_after - obs.now
        fr = obs.frames
        nxt = to + 0.05 if to > 0 else max(0.05, fr.last + fr.every - obs.now) if fr is not None else 5.0
        if th is not None and fr is not None and fr.still_since is not None:   # the window's end, not a poll later
            end = fr.still_since + th.hang_window - obs.now
            nxt = min(nxt, end + 0.05) if end > 0 else nxt
        return min(due, nxt) if due > 0 else nxt
    return due


def watchdog_ended(w) -> bool:
    """The run's watchdog (``Observation.watchdog``) ended on a verdict about the run: done, a
    stop, or an anomaly of a kind of this table (not a failure of its own)."""
    return w is not None and w.ended and (w.state != ANOMALY or w.kind in KINDS)


def _watchdog_verdict(obs: Observation, th: Thresholds, notes: tuple, warnings: tuple) -> Optional[Verdict]:
    """The verdict a watchdog of this same attempt ended on (a one-shot look renders it: the
    watchdog saw every record and every poll), unless a newer launch has begun since."""
    w = obs.watchdog
    if not watchdog_ended(w) or not w.same_attempt or obs.relaunch is not None:
        return None
    if w.state == ANOMALY:
        a = Anomaly(w.kind, w.step, w.message)
        move, change = move_for(w.kind, w.message, obs, th)
        return Verdict(ANOMALY, w.message, a, f"ANOMALY {w.kind}", notes, warnings, change=change, move=move)
    return Verdict(w.state, w.message, None, "DONE" if w.state == DONE else "STOPPED", notes, warnings)


def _after_sentinel(obs: Observation) -> bool:
    """An error in the log written after the sentinel: the process failed while finishing."""
    return (obs.log_mtime is not None and obs.sentinel_mtime is not None and obs.log_mtime > obs.sentinel_mtime
            and last_error(list(obs.log_tail[-LAST_WORDS:])) is not None)
