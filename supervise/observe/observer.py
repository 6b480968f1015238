"""Observe a run: one frozen ``Observation`` per poll, from what changed since the last one.

    observer = Observer(run_dir, thresholds)      # keeps offsets, first hits, pids seen alive
    obs = observer.observe()                      # records -> rules, processes, ranks, GPU, log
    verdict = judge(obs, thresholds)              # pure: supervise/judge/table.py

``judge.assess.assess(run_dir)`` is one look (check-in, smoke, plot): the same observer and judge, once.
The run's processes are found by themselves: ``--pid``, the launcher's record
(``RUN_DIR/launch.json``), the start record's pid when it is this watchdog's to probe (the same
host, and the same PID namespace and boot where the record names them: ``probes.locality``), and
every process whose stdout/stderr is ``RUN_DIR/train.log`` (roots, and their children). What
cannot be seen from here is left out, and ``Observation.visibility`` says why; a rank whose pid is
not ours is in ``Observation.rank_where`` and is judged by its heartbeats. Standard library only.
"""
from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Optional

from supervise.observe import engines
from supervise.observe.checkpoints import CheckpointWatch, checkpoint_dirs, choose_resume, declared_keep
from supervise.contract import TailReader, is_count, is_finite, read_json, why_unreadable
from supervise.observe.logs import cgroup_dir, kernel_oom_lines, killed_reason, last_error, log_tail, oom_kills, oom_line, root_cause
from supervise.observe.observation import Observation, Proc, Records, WatchdogSeen, frozen
from supervise.observe.probes import Nvml, ProcessWatch, born_after, cpu_seconds, disk_free, here, log_writers, process, runs_where, \
    same_process, same_start
from supervise.observe.ranks import RankFiles, local_pids, rank_where
from supervise.observe.records import RecordRules
from supervise.observe.scan import WINDOW, Scan
from supervise.observe.state import read_launch, where_launched
from supervise.thresholds import Thresholds
from supervise.observe.volumes import VolumeWatch, explained_bytes
from supervise.vocabulary import GONE, LAUNCH, LOG, METRICS, SENTINEL

SCAN_EVERY = 10        # polls between /proc scans for new train.log writers while the run lives
LOG_LINES = 200


def _mtime(path: Path) -> Optional[float]:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


class Observer:
    """The state one watchdog keeps between polls; ``observe()`` is one poll. ``gpu`` is any
    object with ``read() -> probes.GpuReport`` (NVML by default; tests inject one). ``one_shot``
    is check-in's look: a cheap read of the head and tail, no relaunch grace. ``record_rules``: the
    RecordRule classes the records are folded with (the judge's table gives them:
    ``judge.table.RECORD_RULES``); the observer keeps their first hits, the judge reads them."""

    def __init__(self, run_dir, thresholds: Thresholds = Thresholds(), record_rules: tuple = (), pids=(), log=None,
                 sentinel: str = SENTINEL, gpu=None, num_labels_given: bool = False, clock=time.time,
                 one_shot: bool = False, job: Optional[tuple] = None, runner=None,
                 notable: bool = True, checkpoint_dirs: tuple = (), watchdog_state=None, keep_scan: bool = True,
                 from_now: bool = False, sample_frames: bool = False, native: bool = False):
        self.run_dir = Path(run_dir)
        self.th = thresholds
        self.from_now = from_now         # judge only what is written after this watchdog's start (--from-now)
        self.explicit_pids = tuple(pids)
        self.log = Path(log) if log else self.run_dir / LOG
        self.sentinel = self.run_dir / sentinel
        self.metrics = self.run_dir / METRICS
        self.reader = TailReader(str(self.metrics)) if not one_shot else \
            TailReader(str(self.metrics), window=WINDOW, notable=notable, head=32 << 10, tail=64 << 10)
        self.rules = RecordRules(thresholds, record_rules, num_labels_given)
        # what a scan learned, kept beside watchdog.json (scan.py): the next look reads what was appended
        self.scan = Scan(self.run_dir, self.metrics, thresholds, record_rules, num_labels_given,
                         partial=one_shot) if keep_scan else None
        self.gpu = gpu
        self.clock = clock
        self.one_shot = one_shot
        self.me = here()                 # host, PID namespace, boot: which recorded pids are ours to probe
        self.host = self.me.host
        self.watch_started = clock()
        self.polls = 0
        self.procs = ProcessWatch()
        self.known: dict = {}            # pid -> why it is a run process
        self.parents: dict = {}          # child pid -> parent pid (children of the run's processes)
        self.seen_alive: set = set()
        self.gone_at: dict = {}          # pid -> when this watchdog first saw it gone
        self._scanned_at: Optional[int] = None
        self._launch: tuple = (None, None)   # (mtime, record)
        self._log: tuple = (None, ())         # ((size, mtime), lines)
        self.rank_files = RankFiles(self.run_dir)
        self.cgroup = None
        self.oom_before: Optional[int] = None
        self.job = job                   # (engine, job id) given (--slurm-job), else launch.json's job
        self.runner = runner             # the engine's command runner (tests replay recorded outputs)
        self._clocks: tuple = (None, None, None)  # ((engine, job id), waiting since, running since)
        self.idle_since: Optional[float] = None
        self.last: Optional[Observation] = None
        self.explicit_checkpoint_dirs = tuple(str(d) for d in checkpoint_dirs)
        self.watchdog_state = watchdog_state  # state.WatchState of the run's watchdog (one-shot looks)
        self._ckpt: tuple = (None, None)      # (dirs and run_id, CheckpointWatch or None)
        self.volumes = VolumeWatch(one_shot=one_shot)   # the free space of every volume the run writes to
        self._log_elsewhere = os.path.dirname(os.path.realpath(self.log)) != os.path.realpath(self.run_dir)
        # the hang evidence: a silent run's stacks sampled every poll (stacks.FrameWatch); the watchdog's only
        self.frame_watch = None
        if sample_frames and thresholds.hang_window > 0 and not one_shot:
            from supervise.observe.stacks import FrameWatch
            self.frame_watch = FrameWatch(self.run_dir, every=thresholds.poll, native=native, clock=clock,
                                          window=thresholds.hang_window)

    @property
    def run(self):
        return self.rules.run

    # -- the run's processes -------------------------------------------------------------------
    def launch_record(self) -> Optional[dict]:
        """RUN_DIR/launch.json (scripts/launch.py), re-read only when it changes."""
        m = _mtime(self.run_dir / LAUNCH)
        if m != self._launch[0]:
            self._launch = (m, read_launch(self.run_dir) if m is not None else None)
        return self._launch[1]

    @staticmethod
    def _launches_since(launch: Optional[dict], start: dict) -> list:
        """(pid, launched_at) of the launches after the current attempt's start record."""
        if launch is None:
            return []
        start_t = start.get("time") if is_finite(start.get("time")) else None
        out = [(launch["pid"], launch["launched_at"])] + [
            (e.get("pid"), e["launched_at"]) for e in launch.get("earlier") or []]
        return [(p, t) for p, t in out if p is not None and (start_t is None or t > start_t + 1)]  # a job: the scheduler's

    def _new_attempt(self) -> None:
        """A new start record: the processes of the old attempt are history."""
        self.known = {p: why for p, why in self.known.items() if why == "--pid"}
        self.parents, self.gone_at, self._scanned_at = {}, {}, None
        self.seen_alive &= set(self.known)

    def _launch_is_current(self, launch: dict) -> bool:
        """Whether launch.json's trainer is the current attempt's: no start record of an earlier
        attempt came after its launch. A trainer started by hand into a folder the launcher ran
        wrote the newest start record; the launched one is the old attempt's, whatever
        launch.json says."""
        at = launch.get("launched_at")
        return not is_finite(at) or not any(is_finite(a[0].get("time")) and a[0]["time"] > at
                                            for a in self.rules.attempts[:-1])

    def _discover(self, start: dict, launch: Optional[dict]) -> str:
        """Add every process of the run not yet known; '' when one is visible from here, else
        why none is."""
        for pid in self.explicit_pids:
            self.known.setdefault(pid, "--pid")
        launched = launch is not None and launch.get("pid") and self._launch_is_current(launch)
        launch_away = where_launched(launch) if launched else ""
        if launched and not launch_away:
            self.known.setdefault(int(launch["pid"]), "launch record")
        pid, away = start.get("pid"), self._start_away(start)
        if pid and not away:
            self.known.setdefault(pid, "start record")
        if not self.explicit_pids:
            self._scan()
        if self.known:
            return ""
        if away:
            return f"the start record's pid {pid} runs {away}"
        if launch_away:
            return f"launch.json's pid {launch['pid']} runs {launch_away}"
        if not self.log.exists():
            return f"nothing writes {self.log.name} and no --pid was given"
        return (f"no process writes {self.log} and the start record names none"
                if not pid else f"no process writes {self.log}")

    def _start_away(self, start: dict) -> str:
        """'' when the start record's pid is this watchdog's to probe, else where it runs, in words."""
        return runs_where(start, self.me)

    def _scan(self) -> None:
        """The train.log writers: roots are run processes, their children are watched too (a
        hand-spawned rank; a dataloader worker's exit is no verdict while records go on)."""
        if self._scanned_at is not None and self.polls - self._scanned_at < SCAN_EVERY and any(
                p in self.seen_alive and p not in self.gone_at for p in self.known):
            return  # a live run: a /proc scan per poll is the cost; look every SCAN_EVERY polls
        self._scanned_at = self.polls
        writers = log_writers(self.log, exclude=(os.getpid(),))
        for pid, ppid in writers.items():
            if ppid in writers or ppid in self.known:
                self.parents.setdefault(pid, ppid)
            elif pid not in self.known:
                self.known[pid] = "writes train.log"
        if self.cgroup is None and self.known:
            self.cgroup = cgroup_dir(next(iter(self.known)))
            self.oom_before = oom_kills(self.cgroup)

    def _procs(self, now: float, start: dict, launch: Optional[dict]) -> list:
        out = []
        start_t = start.get("time")
        for pid, why in self.known.items():
            info = self.procs.read(pid)
            state = info.state
            born = info.create_time or self.procs.birth.get(pid)  # a gone process keeps the birth first seen
            if why == "start record" and is_finite(start_t) and born_after(born, start_t):
                state = "gone"   # that pid was reused by another process after the trainer ended
            if why == "launch record" and launch and not same_start(born, launch.get("create_time")):
                state = "gone"   # likewise for the launched one
            recorded_here = why in ("start record", "launch record", "--pid")
            out.append((pid, why, state, born, False, recorded_here))
        for pid, ppid in self.parents.items():
            info = self.procs.read(pid)
            out.append((pid, f"child of {ppid}", info.state, info.create_time or self.procs.birth.get(pid), True, False))
        procs = []
        for pid, why, state, born, child, recorded_here in out:
            alive = state not in GONE
            if alive:
                self.seen_alive.add(pid)
                self.gone_at.pop(pid, None)
            else:
                self.gone_at.setdefault(pid, now)
            seen = pid in self.seen_alive or recorded_here
            if child and not seen:
                continue
            gone_for = now - self.gone_at[pid] if pid in self.gone_at else 0.0
            quiet = 0.0
            if child and not alive:
                m = _mtime(self.metrics) or 0.0
                quiet = now - max(self.gone_at[pid], m)
            procs.append(Proc(pid, state, why, child, born, seen, gone_for, max(quiet, 0.0)))
        return procs

    def _relaunch(self, procs: list, start: dict, launch: Optional[dict]) -> Optional[Proc]:
        """A process newer than the current attempt's start record: a relaunch whose own start
        record has not come yet. Its fate, not the old attempt's history, is the verdict."""
        start_t = start.get("time")
        if not is_finite(start_t):
            return None
        start_pid = start.get("pid") if not self._start_away(start) else None   # another namespace's: not a pid of ours
        newer = [p for p in procs if not p.child and p.pid != start_pid and p.seen_alive
                 and born_after(p.create_time, start_t)]
        if launch is not None and is_finite(launch.get("launched_at")) and launch["launched_at"] > start_t + 1:
            newer += [p for p in procs if p.pid == launch["pid"] and p not in newer]
        return max(newer, key=lambda p: p.create_time or 0.0) if newer else None

    # -- the sentinel ---------------------------------------------------------------------------
    def _sentinel(self, procs, start: dict) -> tuple:
        """(content, mtime) when the sentinel completes the current run, else (None, mtime). A file
        still being written (empty, not a JSON object) is not yet a sentinel; one with another
        run's run_id, or older than the records or processes of the current run, is history."""
        mtime = _mtime(self.sentinel)
        if mtime is None:
            return None, None
        final = read_json(self.sentinel)
        if not isinstance(final, dict):
            return None, mtime
        rid, sid = start.get("run_id"), final.get("run_id")
        if rid and sid:
            return (final if rid == sid else None), mtime
        if is_finite(start.get("time")) and start["time"] > mtime + 1:
            return None, mtime
        m = _mtime(self.metrics)
        if m is not None and m > mtime + 0.5:
            return None, mtime  # records were written after it: a relaunch into an old folder
        if any(p.alive and born_after(p.create_time, mtime) for p in procs):
            return None, mtime  # a live trainer started after it
        return final, mtime

    # -- the log -------------------------------------------------------------------------------
    def _log_tail(self) -> tuple:
        """(lines, mtime) of train.log's filtered tail, re-read only when the file changed."""
        try:
            st = os.stat(self.log)
        except OSError:
            return (), None
        key = (st.st_size, st.st_mtime)
        if key != self._log[0]:
            self._log = (key, tuple(log_tail(self.log, LOG_LINES)))
        return self._log[1], st.st_mtime

    # -- the rest ------------------------------------------------------------------------------
    def _gpu(self, now: float, alive: bool, pids) -> tuple:
        if self.gpu is None:
            self.gpu = Nvml()
        report = self.gpu.read()
        if not report.available:
            self.idle_since = None
            return None, 0.0, (f"{report.note}; gpu_idle is off",)
        util = max(g.util for g in report.for_pids(pids))
        if alive and util < self.th.gpu_idle_util:
            self.idle_since = self.idle_since if self.idle_since is not None else now
        else:
            self.idle_since = None
        return util, (now - self.idle_since) if self.idle_since is not None else 0.0, \
            tuple(g.line() for g in report.gpus)

    def _followed(self, launch: Optional[dict]) -> Optional[tuple]:
        """(engine, job id) of the scheduled job followed: the one given, else launch.json's newest."""
        return self.job or engines.of_launch(launch)

    def _job(self, now: float, launch: Optional[dict]) -> Optional[engines.Job]:
        """What the engine says of the job followed, with when this watchdog first saw it wait
        and run (a resubmission starts its own clocks; the start-up grace counts from the run)."""
        followed = self._followed(launch)
        if followed is None:
            return None
        job = engines.engine(followed[0]).state(followed[1], runner=self.runner)
        key, waiting, running = self._clocks if self._clocks[0] == followed else (followed, None, None)
        if job.waiting:
            waiting, running = waiting or now, None
        elif job.running:
            waiting, running = None, running or now
        self._clocks = (key, waiting, running)
        return dataclasses.replace(job, waiting_since=waiting, running_since=running)

    def _time_limit(self, start: dict, launch: Optional[dict]) -> tuple:
        """(seconds from the run's start after which it is over its plan, where that comes from)."""
        th = self.th
        if th.hard_timeout > 0:
            return th.hard_timeout, "--hard-timeout"
        window = launch.get("window_s") if launch else None
        if is_finite(window) and window > 0:
            return float(window), "the launcher's --window"
        total, rate = start.get("total_steps"), self.run.steps_per_s
        if total and rate and rate > 0 and self.run.n_steps >= 5:
            projected = total / rate
            return th.timeout_margin * projected + th.startup_grace, (
                f"{th.timeout_margin:g} x the projection {projected / 3600:.2g}h ({total} steps at {rate:.3g} "
                f"steps/s) + --startup-grace")
        return None, "no plan: no --hard-timeout, no launch window, no total_steps and step rate yet"

    def _disk(self, now: float, start: dict):
        """The checkpoint probe's DiskState: --checkpoint-dir, else the start record's
        checkpoint_dir, else RUN_DIR/checkpoints once it exists; a new probe per attempt."""
        dirs = checkpoint_dirs(self.run_dir, start, self.explicit_checkpoint_dirs)
        key = (tuple(dirs), start.get("run_id"))
        if key != self._ckpt[0]:
            self._ckpt = (key, CheckpointWatch(dirs, declared_keep(self.run_dir, start)) if dirs else None)
        return self._ckpt[1].poll(now) if self._ckpt[1] is not None else None

    def _volumes(self, now: float, disk) -> tuple:
        """The VolumeState of the run folder's volume, the log's (when elsewhere) and the checkpoint
        folders'; the checkpoint probe's complete saves are what it already accounts for."""
        probe = self._ckpt[1]
        paths = [(str(self.run_dir), "run folder")] + ([(str(self.log), "log")] if self._log_elsewhere else []) \
            + [(str(d), "checkpoints") for d in (probe.dirs if probe is not None else ())]
        return self.volumes.poll(now, paths, self.th, explained_bytes(disk))

    def _sample_cpu(self, procs: list, now: float) -> list:
        """The first live root process with its CPU % and RSS: a one-shot look shows them. The
        CPU % is measured since the last look's reading (kept in the scan file), else over the
        process's lifetime: no sampling sleep."""
        first = next((p for p in procs if p.alive and not p.child), None)
        if first is None:
            return procs
        info = process(first.pid)
        cpu = cpu_seconds(first.pid)
        pct = self.scan.cpu_percent(first.pid, info.create_time, cpu, now) if self.scan is not None else None
        seen = dataclasses.replace(first, cpu_percent=pct, rss=info.rss)
        return [seen if p is first else p for p in procs]

    def _records(self) -> Records:
        run, rules = self.run, self.rules
        return Records(
            start=frozen(run.start), last_step=run.last_step, n_steps=run.n_steps, n_evals=run.n_evals,
            hits=frozen(rules.hits), fatal=frozen(run.fatal) if run.fatal else None, steps=tuple(run.steps)[-8:],
            evals=tuple(run.evals), best_eval=run.best_eval, attempts=tuple(tuple(a) for a in rules.attempts),
            steps_per_s=run.steps_per_s, elapsed=run.last_t, unknown=run.unknown)

    def _watchdog(self, start: dict, launch: Optional[dict]) -> Optional[WatchdogSeen]:
        """The run's watchdog as watchdog.json says: alive or gone, and its verdict when it ended
        on one about this attempt."""
        wd = self.watchdog_state
        if wd is None:
            return None
        alive = bool(wd.watchdog_pid) and same_process(wd.watchdog_pid, wd.watchdog_create_time)
        ended = wd.verdict_on_run
        same = (wd.run_id == start.get("run_id") and wd.attempt == start.get("attempt")
                and (wd.launch_pid is None or launch is None or wd.launch_pid == launch["pid"])
                and not (launch is not None and is_finite(wd.last_poll) and launch["launched_at"] > wd.last_poll))
        # (a launch after its last poll, a Slurm resubmission: the verdict is about an older launch)
        bad = wd.records.get("bad_lines")
        return WatchdogSeen(pid=wd.watchdog_pid, alive=alive, state=wd.state, last_poll=wd.last_poll,
                            argv=tuple(wd.argv), ended=ended, same_attempt=same, ended_by=wd.ended_by or "",
                            kind=wd.kind, step=wd.step, message=wd.message or "", headline=wd.headline or "",
                            bad_lines=bad if is_count(bad) else None, stacks=wd.stacks)

    def observe(self) -> Observation:
        """One poll: fold the new records, look at the processes, the ranks, the scheduler, the
        GPU and (when something ended) the log; one frozen Observation."""
        self.polls += 1
        if self.polls == 1 and self.scan is not None:
            self.scan.resume(self.reader, self.rules)
        starts = self.rules.starts
        add, reader = self.rules.add, self.reader
        for rec in reader.records():
            add(rec, reader.kind)
        if self.from_now and self.polls == 1:
            self.rules.rebase()   # what was written before this watchdog is what the last one judged
        if self.rules.starts != starts and self.polls > 1:
            self._new_attempt()
        now = self.clock()
        start = self.run.start
        launch = self.launch_record()
        visibility = self._discover(start, launch)
        procs = self._procs(now, start, launch)
        relaunch = self._relaunch(procs, start, launch)
        records = self._records()
        since = self._launches_since(launch, start)
        live = relaunch.pid if relaunch is not None and relaunch.alive else None
        failed = sum(1 for pid, _ in since if pid != live and pid not in {p.pid for p in procs if p.alive})
        if relaunch is not None:
            records = Records(start=records.start, attempts=records.attempts)  # the old attempt is history
            procs = [p for p in procs if p.pid == relaunch.pid or p.why == "--pid" or p.why.startswith("child")]
        stop = launch.get("stop") if launch else None
        stopped = ""
        if stop and is_finite(stop.get("requested_at")) and not (is_finite(start.get("time"))
                                                                  and stop["requested_at"] < start["time"]):
            stopped = f"pid {launch['pid']} stopped by {stop.get('by') or 'scripts/stop.py'}"
        job = self._job(now, launch)
        submitted = bool(job is not None and (job.engine, job.job_id) == engines.of_launch(launch)
                         and not (is_finite(start.get("time")) and start["time"] > launch["launched_at"]))
        if submitted and records.start:   # the submitted job has not written its start record: the old attempt is history
            records = Records(start=records.start, attempts=records.attempts)
        sentinel, sentinel_mtime = self._sentinel(procs, start) if relaunch is None and not submitted else (None, None)
        waiting = bool(job and job.waiting)  # queued or requeued
        if waiting or submitted:
            procs = []  # queued, requeued or not yet written: no process is expected, none is dead
        alive = [p for p in procs if p.alive]
        ended = any(not p.alive for p in procs if not p.child) or not alive or self.one_shot
        lines, log_mtime = self._log_tail() if ended and not (waiting or submitted) else ((), _mtime(self.log))
        cause = killed = None
        if lines:
            cause = root_cause(lines)
            if cause is not None:
                killed = killed_reason(cause.pid, self.oom_before, oom_kills(self.cgroup),
                                       kernel_oom_lines(cause.pid) if cause.signal == "SIGKILL" else ())
        metrics_mtime = _mtime(self.metrics)
        births = [p.create_time for p in alive if p.create_time and not p.child]
        quiet = max([t for t in (metrics_mtime, max(births, default=None)) if t is not None], default=None)
        started = min([self.watch_started] + births) if not self.one_shot or births else now
        if is_finite(start.get("time")) and not births:
            started = min(started, start["time"])
        if job is not None:
            started = job.running_since or now  # the grace starts when the job runs
        heard = start.get("time")
        if self.from_now and is_finite(heard):
            heard = max(heard, self.watch_started)
        ranks = self.rank_files.poll(since=heard) if relaunch is None and not submitted else {}
        away = rank_where(ranks, self.me)      # ranks of another host, PID namespace or boot: judged by their heartbeats
        rank_procs = {pid: self.procs.read(pid).state for pid in local_pids(ranks, self.me)}
        stall_after, stall_why = self.run.stall.limit(quiet)
        util, idle_for, gpu_lines = self._gpu(now, bool(alive), tuple(self.known))
        limit, limit_why = self._time_limit(start, launch)
        disk = self._disk(now, start)
        volumes = self._volumes(now, disk)
        resume, skipped = None, ()
        if self.one_shot and disk is not None:  # what check-in shows and its relaunch line uses, chosen once
            bad = records.hits.get("nan")
            resume, skipped = choose_resume(disk.checkpoints, bad.step if bad is not None else None)
        if self.one_shot:
            procs = self._sample_cpu(procs, now)
        touched = max([t for t in (metrics_mtime, log_mtime, sentinel_mtime) if t is not None], default=0.0)
        hold = 0.0
        if not self.one_shot and not alive and not (self.seen_alive & {p.pid for p in procs}) \
                and touched <= self.watch_started:
            hold = max(0.0, self.th.orphan_grace - (now - self.watch_started))
        obs = Observation(
            now=now, watch_started=self.watch_started, judged_from=self.watch_started if self.from_now else 0.0,
            records=records, processes=tuple(procs),
            visibility=visibility if not waiting else "", relaunch=relaunch, started=started,
            metrics_mtime=metrics_mtime, quiet_since=quiet, stall_after=stall_after, stall_why=stall_why,
            stall_soonest=self.run.stall.soonest(),
            sentinel=frozen(sentinel) if sentinel is not None else None, sentinel_name=self.sentinel.name,
            sentinel_mtime=sentinel_mtime, log_tail=lines, log_mtime=log_mtime, root_cause=cause, killed=killed,
            ranks=ranks, rank_procs=rank_procs, rank_where=frozen(away), job=job, gpu_util=util,
            gpu_idle_for=idle_for, gpu_lines=gpu_lines, checkpoint_dirs=self._ckpt[0][0] if self._ckpt[0] else (),
            disk=disk, resume=resume, resume_skipped=tuple(skipped),
            volume_free=disk_free(str(self.run_dir)), volumes=volumes, last_error=(oom_line(lines) or last_error(lines)) if lines else None,
            blind=self.reader.error or why_unreadable(self.log), hold_for=hold,
            time_limit=limit, time_limit_why=limit_why, failed_launches=failed, stopped=stopped,
            watchdog=self._watchdog(start, launch), launch=frozen(launch) if launch else None,
            sample_after=self.run.stall.sample_after() if self.frame_watch is not None else 0.0)
        if self.frame_watch is not None:
            facts = self.frame_watch.look(obs, obs.sample_after)
            if facts is not None:
                obs = dataclasses.replace(obs, frames=facts)
        self.last = obs
        if self.scan is not None:
            self.scan.keep(self.reader, self.rules, now, force=self.one_shot)
        return obs
