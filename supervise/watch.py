"""The verdict engine and the watchdog's poll loop: read new lines -> rules -> probes -> verdict.

``python scripts/watchdog.py RUN_DIR`` exits 0 with ``OK done: ...`` when the current run's
completion sentinel appears, 7 with ``ANOMALY <kind>: ...`` the first poll an anomaly holds, 2 on
bad usage. Nothing else is printed per poll: the agent reads this output when the job ends.
Each poll also writes ``RUN_DIR/watchdog.json`` atomically. Check-in, smoke and plot call
``assess(run_dir)``: the same engine, one poll, so every tool gives the same verdict.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from . import ranks as rk
from . import registry
from . import slurm as sl
from .cli import EXIT_ANOMALY, EXIT_OK, EXIT_USAGE, Parser, count, duration, fraction, positive_float, \
    positive_int, run_dir_arg
from .contract import LOG, METRICS, SENTINEL, WATCHDOG_STATE, TailReader, atomic_write_json, \
    is_number, read_json, why_unreadable
from .launch import run_on_exit
from .logs import cgroup_dir, is_fallout, kernel_oom_lines, killed_reason, log_tail, oom_kills, root_cause
from .probes import GpuReport, Nvml, ProcessWatch, log_writers
from .recovery import no_progress
from .rules import Anomaly, Process, RecordRules, Thresholds, Window, evaluate, secs


@dataclass
class Verdict:
    state: str                     # watching | done | anomaly | stopped
    line: str = ""
    anomaly: Optional[Anomaly] = None

    @property
    def code(self) -> int:
        return EXIT_ANOMALY if self.state == "anomaly" else EXIT_OK


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

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, obj) -> Optional["WatchState"]:
        """A watchdog.json as read from disk; None when it is not an object. Wrong-typed
        fields take their defaults: the file is input, not trusted."""
        if not isinstance(obj, dict):
            return None
        types = {"run_dir": str, "watchdog_pid": int, "started": float, "last_poll": float, "polls": int,
                 "poll_interval": float, "state": str, "kind": str, "message": str, "step": int,
                 "total_steps": int, "run_id": str, "attempt": int, "records": dict, "pids": list,
                 "warnings": list, "thresholds": dict, "slurm_job": str, "slurm_state": str}
        out = cls()
        for name, kind in types.items():
            default = getattr(out, name)
            setattr(out, name, _typed(obj.get(name), kind, default))
        out.gpu = obj.get("gpu") if isinstance(obj.get("gpu"), (str, list)) else None
        out.pids = [p for p in out.pids if isinstance(p, dict)]
        out.warnings = [w for w in out.warnings if isinstance(w, str)]
        return out


class Watcher:
    """The engine: one poll at a time over one run directory. ``gpu`` is any object with
    ``read() -> GpuReport`` (NVML by default; tests inject one). ``one_shot`` is check-in's
    mode: a single poll, judged from what the files and processes say now."""

    def __init__(self, run_dir, thresholds: Thresholds = Thresholds(), pids=(), log=None,
                 sentinel: str = SENTINEL, gpu=None, num_labels_given: bool = False, clock=time.time,
                 one_shot: bool = False, slurm_job: Optional[str] = None, slurm_runner=None):
        self.run_dir = Path(run_dir)
        self.th = thresholds
        self.explicit_pids = tuple(pids)
        self.log = Path(log) if log else self.run_dir / LOG
        self.sentinel = self.run_dir / sentinel
        self.metrics = self.run_dir / METRICS
        self.reader = TailReader(str(self.metrics)) if not one_shot else \
            TailReader(str(self.metrics), notable=False, head=32 << 10, tail=64 << 10)  # a check-in: cheap
        self.rules = RecordRules(thresholds, num_labels_given)
        self.gpu = gpu
        self.clock = clock
        self.one_shot = one_shot
        self.watch_started = clock()
        self.procs = ProcessWatch()
        self.known: dict = {}            # pid -> why it is a run process
        self.seen_alive: set = set()     # pids this watchdog saw alive
        self._scanned_at: Optional[int] = None
        self.gone_since: Optional[float] = None
        self.orphan_since: Optional[float] = None
        self.polls = 0
        self.idle_since: Optional[float] = None
        self.gpu_note = ""
        self.last_procs: list = []
        self.last_gpu: Optional[GpuReport] = None
        self.save_error = ""
        self.rank_files = rk.RankFiles(self.run_dir)
        self.ranks: dict = {}
        self.rank_procs: dict = {}
        self.cgroup = None               # the run's cgroup and its oom_kill count, read while it lives
        self.oom_before: Optional[int] = None
        self.slurm_job = slurm_job
        self.slurm_runner = slurm_runner
        self.slurm: Optional[sl.SlurmJob] = None
        self.slurm_running_since: Optional[float] = None
        self.verdict = Verdict("watching")

    # -- the run's identity and processes ---------------------------------------------------
    @property
    def run(self):
        return self.rules.run

    @property
    def start(self) -> dict:
        return self.run.start

    def _discover(self) -> None:
        """Add every process of the run not yet known: --pid, the start record's pid, and the
        roots among the processes writing train.log (a dataloader worker or a torchrun worker is
        a child: its own exit is no verdict; the root's is)."""
        for pid in self.explicit_pids:
            self.known.setdefault(pid, "--pid")
        pid = self.start.get("pid")
        if pid and pid not in self.known:
            self.known[pid] = "start record"
        if self.explicit_pids or not self.log.exists():
            return
        if self._scanned_at is not None and self.polls - self._scanned_at < 10 and any(
                p.alive for p in self.last_procs):
            return  # a live run: look for new roots every 10th poll only (a /proc scan per poll is the cost)
        self._scanned_at = self.polls
        writers = log_writers(self.log, exclude=(os.getpid(),))
        for pid, ppid in writers.items():
            if ppid not in writers and pid not in self.known:
                self.known[pid] = "writes train.log"
        if self.cgroup is None and self.known:
            self.cgroup = cgroup_dir(next(iter(self.known)))
            self.oom_before = oom_kills(self.cgroup)

    def _forget_stale(self) -> None:
        """A new attempt began (a new start record): the processes of the old one are history."""
        keep = {p: why for p, why in self.known.items() if why in ("--pid",)}
        self.known, self.gone_since, self.orphan_since, self._scanned_at = keep, None, None, None
        self.procs = ProcessWatch()

    # -- the sentinel ------------------------------------------------------------------------
    def _sentinel(self, procs) -> Optional[dict]:
        """The sentinel's content when it completes the current run, else None. A file still
        being written (empty, not a JSON object) is not yet a sentinel; one with another run's
        run_id, or older than the records or processes of the current run, is history."""
        try:
            mtime = os.stat(self.sentinel).st_mtime
        except OSError:
            return None
        final = read_json(self.sentinel)
        if not isinstance(final, dict):
            return None
        rid, sid = self.start.get("run_id"), final.get("run_id")
        if rid and sid:
            return final if rid == sid else None
        if self.start.get("time") and self.start["time"] > mtime + 1:
            return None
        try:
            if os.stat(self.metrics).st_mtime > mtime + 0.5:
                return None  # records were written after it: a relaunch into an old folder
        except OSError:
            pass
        if any(p.alive and p.create_time and p.create_time > mtime for p in procs):
            return None  # a live trainer started after it
        if (not self.one_shot and mtime < self.watch_started and not self.known
                and self.clock() - self.watch_started < self.th.orphan_grace):
            return None  # an old sentinel and no trainer yet: wait a moment for a relaunch to show
        return final

    def _done(self, final: dict) -> Verdict:
        nums = [(k, v) for k, v in final.items() if is_number(v) and k not in ("attempt",)][:6]
        facts = "; " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in nums) if nums else ""
        total = self.start.get("total_steps")
        of = f"/{total}" if total else ""
        attempt = f" (attempt {self.start['attempt']})" if self.start.get("attempt") else ""
        ran = self.clock() - self.watch_started
        return Verdict("done", f"OK done: {self.sentinel.name} written at step {self.run.last_step}{of}{attempt} "
                               f"after {ran:.0f}s of watching{facts}")

    # -- one poll ----------------------------------------------------------------------------
    def _gpu(self, now: float, alive: bool, pids) -> Optional[float]:
        if self.gpu is None:
            self.gpu = Nvml()
        report = self.gpu.read()
        self.last_gpu = report
        if not report.available:
            self.gpu_note = f"{report.note}; gpu_idle is off"
            self.idle_since = None
            return None
        util = max(g.util for g in report.for_pids(pids))
        if alive and util < self.th.gpu_idle_util:
            self.idle_since = self.idle_since if self.idle_since is not None else now
        else:
            self.idle_since = None
        return util

    def _stall_after(self) -> tuple:
        """(seconds of silence that are a stall now, why). Learned once the run has shown its
        rhythm; an announced silence (an expect record) extends it."""
        th, run = self.th, self.run
        after, why = th.max_stall, ""
        shown = run.n_steps >= 20 and run.n_evals >= 1  # a run without evals keeps --max-stall (a save is silent too)
        if th.stall_factor > 0 and run.longest_gap > 0 and shown:
            learned = max(th.min_stall, th.stall_factor * run.longest_gap)
            if learned < after:
                after, why = learned, f" (learned: {th.stall_factor:g} x the longest gap {secs(run.longest_gap)})"
        if run.expect is not None:
            announced = run.expect["seconds"] + th.min_stall
            if announced > after:
                after, why = announced, f" (announced: {run.expect.get('why') or 'a pause'} of {secs(run.expect['seconds'])})"
        return after, why

    def _follow_slurm(self, now: float) -> bool:
        """Ask the scheduler (``--slurm-job``); True while the job waits (PENDING, requeued):
        then no process is expected and the startup grace has not begun."""
        if self.slurm_job is None:
            return False
        kw = {"runner": self.slurm_runner} if self.slurm_runner else {}
        self.slurm = sl.query(self.slurm_job, **kw)
        if self.slurm.running and self.slurm_running_since is None:
            self.slurm_running_since = now
        if self.slurm.waiting:
            self.slurm_running_since = None
        return self.slurm.waiting

    def _rank_findings(self, now: float, stall_after: float, dead_log) -> dict:
        """The per-rank heartbeats' findings this poll, by kind. ``dead_log``: the log tail once
        every run process is gone, whose torchrun root cause names the first failing rank."""
        self.ranks = self.rank_files.poll(since=self.start.get("time"))
        self.rank_procs = {pid: self.procs.read(pid).state for pid in rk.local_pids(self.ranks)}
        out: dict = {}

        def put(found):
            if found is not None:
                out.setdefault(found.kind, found)

        cause = root_cause(dead_log) if dead_log else None
        if cause is not None:
            pid = cause.pid
            killed = killed_reason(pid, self.oom_before, oom_kills(self.cgroup),
                                   kernel_oom_lines(pid) if cause.signal == "SIGKILL" else ())
            put(rk.root_cause_anomaly(cause, self.run.last_step, killed.text, killed.oom))
        if dead_log is not None:
            put(rk.rank_dead(self.ranks, self.rank_procs, cause))
        fatal = rk.rank_fatal(self.ranks)
        if cause is None and fatal is not None and not any(is_fallout(s.fatal or "") for s in self.ranks.values()):
            put(fatal)  # a peer's "connection reset" after another rank died is fallout, not the cause
        if len(self.ranks) > 1:  # one process: the stall rule names a stopped pid
            put(rk.rank_hang(self.ranks, now, self.rank_procs, stall_s=stall_after))
        put(rk.straggler(self.ranks, now, window_s=self.th.throughput_window, ratio=self.th.straggler_ratio))
        return out

    def poll(self) -> Verdict:
        self.polls += 1
        starts = self.rules.starts
        for rec in self.reader.records():
            self.rules.add(rec)
        if self.rules.starts != starts and self.polls > 1:
            self._forget_stale()
        now = self.clock()
        self._discover()
        infos = [self.procs.read(pid) for pid in self.known]
        self.last_procs = infos
        final = self._sentinel(infos)
        if final is not None:
            return self._finish(self._done(final))
        self.seen_alive.update(p.pid for p in infos if p.alive)
        # a process already gone when this watchdog first looked (the last attempt's, before a
        # relaunch shows up) is no verdict yet: the run is judged as an orphan, after its grace
        procs = tuple(Process(p.pid, p.state, self.known.get(p.pid, "")) for p in infos
                      if p.alive or p.pid in self.seen_alive or self.one_shot)
        waiting = self._follow_slurm(now)
        if waiting:
            procs = ()  # queued or requeued: no process is expected, none is dead
        alive = [p for p in procs if p.alive]
        gone = [p for p in procs if not p.alive]
        self.gone_since = (self.gone_since or now) if gone else None
        evidence = bool(self.run.n_steps or self.run.fatal) or self.log.exists()
        orphan = not procs and evidence and self.slurm_job is None
        self.orphan_since = (self.orphan_since or now) if orphan else None
        try:
            mtime = os.stat(self.metrics).st_mtime
        except OSError:
            mtime = None
        births = [p.create_time for p in infos if p.alive and p.create_time]
        quiet = max([t for t in (mtime, max(births, default=None)) if t is not None], default=None)
        started = min([self.watch_started] + births) if not self.one_shot or births else now
        if self.start.get("time") and not births:
            started = min(started, self.start["time"])
        if self.slurm_job is not None:
            started = self.slurm_running_since or now  # the grace starts when the job runs
        stall_after, stall_why = self._stall_after()
        util = self._gpu(now, bool(alive), tuple(self.known))
        run = self.run
        died = bool(gone) or orphan
        log = tuple(log_tail(self.log)) if died or (self.slurm and self.slurm.finished) else ()
        judged = (gone and not alive) or (orphan and now - self.orphan_since >= self.th.orphan_grace)
        extra = self._rank_findings(now, stall_after, log if judged else None)
        stuck = no_progress([tuple(a) for a in self.rules.attempts])
        if stuck is not None:
            extra.setdefault("no_progress", stuck)
        if self.slurm is not None and not waiting:
            found = sl.slurm_anomaly(self.slurm, False, run.last_step)
            if found is not None:
                extra.setdefault(found.kind, found)
        blind = self.reader.error or why_unreadable(self.log)
        window = Window(
            now=now, started=started, watch_started=self.watch_started, last_step=run.last_step,
            has_steps=bool(run.n_steps or run.fatal or self.rules.hits.get("nan")),
            metrics_mtime=mtime, quiet_since=quiet, stall_after=stall_after, stall_why=stall_why,
            processes=procs, died_for=(now - self.gone_since) if gone and alive else 0.0,
            orphan_for=(now - self.orphan_since) if orphan else 0.0, orphan=orphan,
            log_tail=log, blind=blind,
            gpu_util=util, gpu_idle_for=(now - self.idle_since) if self.idle_since is not None else 0.0)
        found = evaluate(window, self.th, self.rules.findings(), extra)
        if found is not None:
            return self._finish(Verdict("anomaly", found.message, found))
        self.verdict = Verdict("watching")
        self.save()
        return self.verdict

    def _finish(self, verdict: Verdict) -> Verdict:
        self.verdict = verdict
        self.save()
        return verdict

    def stop(self, signame: str) -> Verdict:
        v = Verdict("stopped", f"STOPPED: watchdog ended by {signame} after {self.polls} polls; "
                               f"no anomaly seen up to step {self.run.last_step}")
        return self._finish(v)

    def snapshot(self) -> WatchState:
        r, run = self.reader, self.run
        a = self.verdict.anomaly
        return WatchState(
            run_dir=str(self.run_dir.resolve()), watchdog_pid=os.getpid(), started=self.watch_started,
            last_poll=self.clock(), polls=self.polls, poll_interval=self.th.poll, state=self.verdict.state,
            kind=a.kind if a else None, message=self.verdict.line or None, step=run.last_step,
            total_steps=self.start.get("total_steps"), run_id=self.start.get("run_id"),
            attempt=self.start.get("attempt"),
            records={"lines": r.lines, "steps": run.n_steps, "evals": run.n_evals, "bad_lines": r.bad_lines,
                     "last_bad": r.last_bad or None, "unknown": run.unknown, "resets": r.resets,
                     "starts": self.rules.starts, "torn_tail": r.torn, "bytes_read": r.bytes_read,
                     "skipped_bytes": r.skipped_bytes},
            pids=[{"pid": p.pid, "state": p.state, "why": self.known.get(p.pid, "")} for p in self.last_procs],
            gpu=self.gpu_note or [g.line() for g in (self.last_gpu.gpus if self.last_gpu else [])],
            warnings=[w.message for w in self.rules.warnings()],
            slurm_job=self.slurm_job, slurm_state=self.slurm.state if self.slurm else None,
            thresholds=dataclasses.asdict(self.th))

    def save(self) -> None:
        if self.one_shot:
            return
        try:
            atomic_write_json(self.run_dir / WATCHDOG_STATE, self.snapshot().to_json())
            self.save_error = ""
        except OSError as e:
            if not self.save_error:  # say it once; the verdict still reaches stdout
                print(f"watchdog.py: warning: cannot write {self.run_dir / WATCHDOG_STATE}: {e.strerror or e}; "
                      "check-in will not see this watchdog", file=sys.stderr, flush=True)
            self.save_error = str(e)


def assess(run_dir, thresholds: Optional[Thresholds] = None, gpu=None, pids=(),
           slurm_job: Optional[str] = None) -> Watcher:
    """Check-in's verdict: the watchdog's engine, one poll over the run as it is now. The
    returned watcher holds the verdict (``.verdict``) and the facts it found."""
    th = dataclasses.replace(thresholds or Thresholds(), orphan_grace=0.0, rank_grace=0.0)
    w = Watcher(run_dir, th, pids=pids, gpu=gpu, one_shot=True, slurm_job=slurm_job)
    w.poll()
    return w


class _Wake(Exception):
    pass


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def run(watcher: Watcher, out=None, on_exit: Optional[str] = None) -> int:
    """Poll until done, an anomaly, or SIGTERM/SIGINT/SIGHUP; print the one final line; exit code.
    A second signal while stopping changes nothing: one line, exit 0, never a traceback.
    ``on_exit``: a shell command run once, detached, after the line (launch.run_on_exit)."""
    out = out or sys.stdout
    flags = {"sleeping": False, "signal": None}

    def on_signal(signum, frame):
        if flags["signal"] is None:
            flags["signal"] = signal.Signals(signum).name
        if flags["sleeping"]:
            flags["sleeping"] = False
            raise _Wake()

    old = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS}
    try:
        while True:
            if flags["signal"]:
                verdict = watcher.stop(flags["signal"])
                break
            verdict = watcher.poll()
            if verdict.state != "watching":
                break
            try:
                flags["sleeping"] = True
                if not flags["signal"]:
                    time.sleep(watcher.th.poll)
            except _Wake:
                pass
            finally:
                flags["sleeping"] = False
        try:
            print(verdict.line, file=out, flush=True)
        except (BrokenPipeError, OSError):
            pass  # whoever read stdout is gone; the verdict is in watchdog.json all the same
        if on_exit:
            run_on_exit(on_exit, line=verdict.line, kind=verdict.anomaly.kind if verdict.anomaly else None,
                        code=verdict.code, run_dir=watcher.run_dir)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return verdict.code


def _threshold_type(name, default, is_duration):
    if is_duration:
        return duration
    if name in ("throughput_drop", "chance_margin", "min_auroc", "straggler_ratio"):
        return fraction
    if isinstance(default, int):
        return count if name in ("min_auroc_step", "chance_step", "baseline_steps", "warmup_steps",
                                 "overfit_evals") else positive_int
    return positive_float if name != "stall_factor" else _nonnegative


def _nonnegative(text):
    return 0.0 if str(text).strip() in ("0", "0.0") else positive_float(text)


def _show(default, unit, is_duration):
    if is_duration:
        return f"{default:g}s"
    if unit in ("%", "fraction", "AUROC", "grad norm", "x"):
        return f"{default:g}{unit}" if unit in ("%", "x") else f"{default:g}"
    return f"{default:g} {unit}"


def build_parser() -> Parser:
    p = Parser(prog="watchdog.py", description=(
        "Watch a training run directory; exit 0 with 'OK done: ...' when the current run's completion "
        "sentinel appears, 7 with 'ANOMALY <kind>: ...' on the first poll an anomaly holds, 2 on bad usage. "
        "The run's processes are found by themselves: --pid, the start record's pid, and every process "
        "whose output goes to RUN_DIR/train.log. Durations are seconds, or a number with s, m or h "
        "(90s, 6m, 3h)."))
    p.add_argument("run_dir", metavar="RUN_DIR", type=run_dir_arg,
                   help="the run directory (metrics.jsonl, train.log, final_val_metrics.json)")
    p.add_argument("--pid", type=positive_int, action="append", default=[], metavar="PID",
                   help="a training process to watch (repeatable); default: found from the start record and train.log")
    p.add_argument("--log", metavar="PATH", help="the training log [default: RUN_DIR/train.log]")
    p.add_argument("--slurm-job", metavar="ID", type=slurm_id,
                   help="follow this Slurm job with squeue/sacct: PENDING is no stall, the scheduler's end "
                        "states are verdicts (OUT_OF_MEMORY, NODE_FAIL, TIMEOUT, PREEMPTED, FAILED)")
    p.add_argument("--on-exit", metavar="CMD",
                   help="a shell command run once, detached, when the watchdog ends, with SUPERVISE_VERDICT, "
                        "SUPERVISE_KIND, SUPERVISE_EXIT_CODE, SUPERVISE_RUN_DIR, SUPERVISE_SESSION_ID set "
                        "(references/session.md)")
    p.add_argument("--sentinel", default=SENTINEL, metavar="NAME", type=sentinel_name,
                   help=f"completion sentinel, a file name in RUN_DIR [default: {SENTINEL}]")
    for name, default, unit, doc, is_duration in Thresholds.describe():
        flag = "--" + name.replace("_", "-")
        if isinstance(default, bool):
            p.add_argument(flag, dest=name, action="store_true", default=None, help=doc)
            continue
        metavar = "DURATION" if is_duration else {"%": "PERCENT", "x": "FACTOR"}.get(unit, unit.upper().replace(" ", "_"))
        p.add_argument(flag, dest=name, default=None, metavar=metavar,
                       type=_threshold_type(name, default, is_duration),
                       help=f"{doc} (default: {_show(default, unit, is_duration)})".replace("%", "%%"))
    return p


def slurm_id(text: str) -> str:
    """A Slurm job id: digits, optionally an array task (123 or 123_4)."""
    import argparse
    import re
    if not re.fullmatch(r"\d{1,12}(_\d{1,8})?", text or ""):
        raise argparse.ArgumentTypeError(f"{text!r} is not a Slurm job id; give the number sbatch printed (e.g. 4242)")
    return text


def sentinel_name(text: str) -> str:
    """A plain file name inside RUN_DIR: not empty, no folder, not . or .."""
    import argparse
    if not text or text in (".", "..") or "/" in text or "\0" in text:
        raise argparse.ArgumentTypeError(f"{text!r} is not a file name; give the sentinel's name inside RUN_DIR "
                                         f"(default {SENTINEL})")
    return text


def main(argv=None, gpu=None) -> int:
    args = build_parser().parse_args(argv)
    given = {n: getattr(args, n) for n, *_ in Thresholds.describe() if getattr(args, n) is not None}
    th = Thresholds(**given)
    if th.grad_low >= th.grad_high:
        print(f"watchdog.py: error: --grad-low {th.grad_low:g} must be below --grad-high {th.grad_high:g}",
              file=sys.stderr)
        return EXIT_USAGE
    run_dir = Path(args.run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".watchdog-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        print(f"watchdog.py: error: run directory {run_dir} is not writable ({e.strerror or e}); "
              "pass a folder the watchdog can write watchdog.json into", file=sys.stderr)
        return EXIT_USAGE
    log = Path(args.log) if args.log else run_dir / LOG
    for path in (run_dir / METRICS, log, run_dir / args.sentinel):
        why = why_unreadable(path)
        if why:
            print(f"watchdog.py: error: {why}; the watchdog would be blind: fix it (a readable regular file) "
                  "and start again", file=sys.stderr)
            return EXIT_USAGE
    if args.slurm_job:
        job = sl.query(args.slurm_job)
        if job.error:
            print(f"watchdog.py: error: {job.error}", file=sys.stderr)
            return EXIT_USAGE
    watcher = Watcher(run_dir, th, pids=args.pid, log=log, sentinel=args.sentinel, gpu=gpu,
                      num_labels_given="num_labels" in given, slurm_job=args.slurm_job)
    registry.register(run_dir, os.getpid(), args.pid)
    return run(watcher, on_exit=args.on_exit)
