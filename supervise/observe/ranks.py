"""Every rank's heartbeat: read RUN_DIR/ranks/rank-<N>.jsonl cheaply, name the rank that hangs,
died or straggles (standard library only; the watchdog's hot path).

    files = RankFiles(run_dir)                 # keep it: it remembers where each file was read to
    ranks = files.poll()                       # {rank: RankState}, only appended bytes are read
    where = rank_where(ranks, here())          # {rank: why its pid is not probed here}: another host, PID namespace, boot
    procs = {pid: probe(pid) for pid in local_pids(ranks, here())}   # 'running'|'sleeping'|'stopped'|'gone'|'zombie'
    found = (rank_fatal(ranks) or rank_dead(ranks, procs, where=where)
             or rank_hang(ranks, now, procs, stall_s=300, where=where) or straggler(ranks, now, window_s=300))
    lines = rank_lines(ranks, now, procs, where=where)   # check-in: one line per rank, healthy ones summarized

A heartbeat line (contract v0.2) is ``{"rank","local_rank","host","pid","step","t","time","sps"}``
(v0.4 adds ``"pid_ns"`` and ``"boot_id"`` where /proc has them); a rank's FATAL line
``{"step","t","FATAL","rank","pid"}``. A rank's pid is probed only where ``probes.locality``
says it is this watchdog's (same host, PID namespace and boot); any other rank is judged by its
heartbeats alone, as a remote one is. Torn last lines, garbage, missing
files and non-regular files are tolerated: a bad line is skipped, a bad file is left out.
The rules are pure: state + ``now`` + process states + numbers in, ``Anomaly | None`` out.
"""
from __future__ import annotations

import os
import stat
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Mapping, Optional

from supervise.contract import TailReader, is_count, is_finite
from supervise.observe.logs import RootCause, oom_line
from supervise.observe.probes import ANOTHER_BOOT, ANOTHER_HOST, ANOTHER_PID_NS, Here, here, locality
from supervise.observe.records import median
from supervise.vocabulary import ranks_text, GONE, Anomaly, anomaly, secs

MAX_READ = 64 << 10       # bytes read from one rank file per poll (the rest is skipped, oldest first)
FIRST_READ = 32 << 10     # bytes read from the end of a rank file the first time it is seen
MAX_PARTIAL = 64 << 10    # a torn line longer than this is garbage, not a line in progress
HISTORY = 512             # (time, sps) samples kept per rank
NOWHERE: Mapping[int, str] = MappingProxyType({})   # no rank is away (rank_where)
# How a check-in line says why a rank's pid is not probed (rank_where's codes)
AWAY = {ANOTHER_HOST: "remote", ANOTHER_PID_NS: "in another PID namespace: judged by its records",
        ANOTHER_BOOT: "another boot of its host: judged by its records"}


@dataclass
class RankState:
    """What one rank's heartbeat file has said. ``time`` is the wall clock of its last heartbeat
    (the record's "time", else the file's mtime when it was read); ``sps`` its last throughput."""

    rank: int
    path: str
    local_rank: Optional[int] = None
    host: str = ""
    pid: Optional[int] = None
    pid_ns: Optional[int] = None                # the PID namespace its pid belongs to (v0.4), when written
    boot_id: Optional[str] = None               # the boot it ran in (v0.4), when written
    step: Optional[int] = None
    t: Optional[float] = None
    time: Optional[float] = None
    sps: Optional[float] = None
    mtime: Optional[float] = None
    fatal: Optional[str] = None                 # a FATAL record's reason, when the rank wrote one
    history: deque = field(default_factory=lambda: deque(maxlen=HISTORY))  # (time, sps)
    records: int = 0                            # heartbeats parsed so far

    @property
    def last_seen(self) -> Optional[float]:
        """Wall clock of the last sign of life: the newer of the record's time and the mtime."""
        seen = [x for x in (self.time, self.mtime) if x is not None]
        return max(seen) if seen else None

    def where(self) -> str:
        """``pid 4242 on node-a`` (what is known of it)."""
        bits = [f"pid {self.pid}" if self.pid else "", f"on {self.host}" if self.host else ""]
        return " ".join(b for b in bits if b)


class RankFiles:
    """The heartbeat files of one run directory, read incrementally.

    ``poll()`` lists RUN_DIR/ranks/rank-<N>.jsonl and reads each through its own
    ``contract.TailReader`` (the metrics file's reader: offsets, torn lines, truncation and
    replacement, regular files only), bounded: a file seen for the first time is read from its
    last FIRST_READ bytes, so that attaching to a long run costs no more than a few polls, and
    at most MAX_READ appended bytes per poll (a file that grew more is read from its last
    MAX_READ bytes). Returns ``{rank: RankState}`` for the files that held at least one
    heartbeat or FATAL."""

    def __init__(self, run_dir):
        self.dir = Path(run_dir) / "ranks"
        self._readers: dict[int, TailReader] = {}
        self.state: dict[int, RankState] = {}

    @property
    def skipped(self) -> int:
        """Garbage lines seen so far, over every rank file."""
        return sum(r.bad_lines for r in self._readers.values())

    def poll(self, since: Optional[float] = None) -> dict[int, RankState]:
        """Read what was appended; the ranks that have written. ``since`` (wall clock, the
        current attempt's start record "time"): leave out ranks silent since before it, the
        files of an earlier launch (another world size, a rank that no longer exists)."""
        try:
            entries = list(os.scandir(self.dir))
        except OSError:
            entries = []
        for e in entries:
            name = e.name
            if not (name.startswith("rank-") and name.endswith(".jsonl")):
                continue
            num = name[5:-6]
            if num.isdigit():
                self._read(int(num), e.path)
        return {r: s for r, s in self.state.items() if (s.records or s.fatal)
                and (since is None or (s.last_seen or 0.0) >= since)}

    def _read(self, rank: int, path: str):
        try:
            st = os.stat(path)
        except OSError:
            return
        if not stat.S_ISREG(st.st_mode):
            return
        reader = self._readers.get(rank)
        if reader is None:
            reader = self._readers[rank] = TailReader(path, catchup=FIRST_READ, head=0, tail=FIRST_READ,
                                                      notable=False, max_append=MAX_READ, max_line=MAX_PARTIAL)
        s = self.state.get(rank)
        if s is None:
            s = self.state[rank] = RankState(rank=rank, path=path)
        s.mtime = st.st_mtime
        for rec in reader.records():
            self._apply(s, rec)

    @staticmethod
    def _apply(s: RankState, rec: dict):
        if "FATAL" in rec:
            s.fatal = str(rec.get("FATAL"))[:300]
        step = rec.get("step")
        if step is None:
            return
        pid = rec.get("pid")
        if "FATAL" not in rec:
            s.records += 1
            if is_count(pid) and s.pid is not None and pid != s.pid:
                s.fatal = None       # a relaunched rank: the old process's FATAL and sps are history
                s.history.clear()
        s.step = step
        host = rec.get("host")
        if isinstance(host, str):
            s.host = host[:100]
        if "FATAL" not in rec:   # a heartbeat says where its pid lives (a FATAL line does not: it keeps the last)
            ns, boot = rec.get("pid_ns"), rec.get("boot_id")
            s.pid_ns = int(ns) if is_count(ns) else None
            s.boot_id = boot[:100] if isinstance(boot, str) else None
        for name in ("pid", "local_rank"):
            v = rec.get(name)
            if is_count(v):
                setattr(s, name, int(v))
        t, when, sps = rec.get("t"), rec.get("time"), rec.get("sps")
        if is_finite(t):
            s.t = t
        s.time = when if is_finite(when) else s.mtime
        if is_finite(sps):
            s.sps = sps
            if s.time is not None:
                s.history.append((s.time, sps))


def rank_where(ranks: Mapping[int, RankState], me: Optional[Here] = None) -> dict[int, str]:
    """{rank: why its pid is not this watchdog's to probe} for every such rank: ``probes.locality``
    of its heartbeat (``ANOTHER_HOST``, ``ANOTHER_BOOT``, ``ANOTHER_PID_NS``) against ``me``
    (default ``probes.here()``). The ranks left out are local. Such a rank is judged by its
    heartbeats alone (age, step, sps), never by a process state."""
    me = me or here()
    out = {}
    for r, s in ranks.items():
        code = locality(s.host, s.pid_ns, s.boot_id, me)
        if code:
            out[r] = code
    return out


def local_pids(ranks: Mapping[int, RankState], me: Optional[Here] = None) -> list[int]:
    """The pids of the ranks whose process this watchdog can probe (``me``, default
    ``probes.here()``: the same host, PID namespace and boot): the only ones whose process state
    means anything here. The others are judged by their files alone."""
    away = rank_where(ranks, me)
    return sorted({s.pid for r, s in ranks.items() if s.pid and r not in away})


def _state(s: RankState, procs: Mapping[int, str], where: Mapping[int, str]) -> Optional[str]:
    """The process state of rank ``s``: None when its pid is not probed here (``where``), or not read."""
    return None if s.rank in where else procs.get(s.pid) if s.pid is not None else None


def _others(ranks, bad) -> str:
    more = sorted(bad[1:])
    return f" (and rank{'s' if len(more) > 1 else ''} {ranks_text(more)})" if more else ""


def _step(ranks: Mapping[int, RankState]) -> int:
    steps = [s.step for s in ranks.values() if s.step is not None]
    return max(steps) if steps else 0


def rank_fatal(ranks: Mapping[int, RankState]) -> Optional[Anomaly]:
    """A rank wrote a FATAL record (Telemetry does so before raising): ``fatal``, naming it."""
    bad = sorted(r for r, s in ranks.items() if s.fatal)
    if not bad:
        return None
    s = ranks[bad[0]]
    return anomaly("fatal", f"rank {s.rank} ({s.where()}) FATAL = {s.fatal[:200]!r} written{_others(ranks, bad)}",
                   s.step or 0, "That rank stopped itself: fix the reason it gives, then relaunch "
                   "from the last checkpoint")


def rank_dead(ranks: Mapping[int, RankState], procs: Mapping[int, str],
              cause: Optional[RootCause] = None, where: Mapping[int, str] = NOWHERE) -> Optional[Anomaly]:
    """A local rank whose process is gone (or a zombie): ``dead``, naming rank and pid.
    ``procs``: pid -> state of the local ranks' pids (``local_pids``); a pid absent from it is
    not judged, nor is a rank in ``where`` (``rank_where``: its pid is another host's, PID
    namespace's or boot's, whatever pid of ours has the same number). When several are gone
    (torchrun terminates the others within a second of the first failure), the rank of ``cause``
    (``logs.root_cause`` of train.log) is named first, else the one whose heartbeat stopped first. Call it only while the run has no sentinel
    (a finished run's ranks exit)."""
    bad = [r for r, s in ranks.items() if _state(s, procs, where) in GONE]
    if not bad:
        return None
    first = cause.rank if cause is not None else None
    bad.sort(key=lambda r: (r != first, ranks[r].step if ranks[r].step is not None else -1,
                            ranks[r].last_seen or 0.0, r))
    s = ranks[bad[0]]
    shows = "torchrun's root cause" if len(ranks) > 1 else "the last error of train.log"
    return anomaly("dead", f"rank {s.rank} ({s.where()}) = {procs[s.pid]} != alive{_others(ranks, bad)}",
                   s.step or 0, "That rank's process exited without the run finishing: read its "
                   f"error in train.log (checkin.py shows {shows}), then relaunch from the last checkpoint")


def rank_hang(ranks: Mapping[int, RankState], now: float, procs: Mapping[int, str],
              stall_s: float, where: Mapping[int, str] = NOWHERE) -> Optional[Anomaly]:
    """The rank that holds the others up: ``rank_hang``, naming rank, pid and host.

    - a local rank whose process is ``stopped`` (SIGSTOP, Ctrl-Z, a debugger): at once;
    - a rank silent for more than ``stall_s`` while another rank wrote within ``stall_s``, and
      wrote once the silent one was overdue (``stall_s`` or more after its last heartbeat): ranks
      that fell silent together (a job killed or frozen as a whole) are not one rank's hang, so
      which kind it is never depends on where a poll falls between their last writes;
    - all ranks silent for more than ``stall_s`` but one behind the others' step: that one
      (the others wait for it in a collective). All silent at the same step is no rank's fault:
      None (the run-level stall rule reports it).
    ``stall_s`` may be the learned (adaptive) stall time. A rank in ``where`` (``rank_where``) has
    no process state: it is judged by its heartbeats alone."""
    if len(ranks) < 1:
        return None
    stopped = sorted(r for r, s in ranks.items() if _state(s, procs, where) == "stopped")
    if stopped:
        s = ranks[stopped[0]]
        return anomaly("rank_hang", f"rank {s.rank} ({s.where()}) state = stopped != running{_others(ranks, stopped)}",
                       s.step or 0, f"The rank is suspended (SIGSTOP, Ctrl-Z or a debugger) and the others "
                       f"wait for it: resume it with kill -CONT {s.pid}, or kill the job and relaunch")
    if len(ranks) < 2:
        return None
    age = {r: now - s.last_seen for r, s in ranks.items() if s.last_seen is not None}
    silent = sorted((r for r, a in age.items() if a > stall_s and _state(ranks[r], procs, where) not in GONE),
                    key=lambda r: (-age[r], r))
    if not silent:
        return None
    writing = [r for r, a in age.items() if a <= stall_s]
    if writing:
        newest = max(ranks[r].last_seen for r in writing)
        silent = [r for r in silent if newest - ranks[r].last_seen >= stall_s]   # another wrote once it was overdue
        if not silent:
            return None   # the others wrote only moments after it: they fall silent too, and are judged then
        w = max(writing, key=lambda r: (ranks[r].step or 0, -r))
        s, o = ranks[silent[0]], ranks[w]
        why = f"while rank {o.rank} wrote at step {o.step} {secs(max(age[w], 0))} ago"
    else:
        steps = {r: ranks[r].step for r in silent if ranks[r].step is not None}
        if len(set(steps.values())) < 2:
            return None
        low = min(steps.values())
        behind = sorted((r for r in steps if steps[r] == low), key=lambda r: (-age[r], r))
        silent = behind
        o = ranks[max(steps, key=lambda r: (steps[r], -r))]
        s = ranks[behind[0]]
        why = f"behind rank {o.rank} at step {o.step}"
    pid = s.pid if s.pid else "PID"
    on = (f"inside its own PID namespace (its container) on {s.host or 'its node'}"
          if where.get(s.rank) == ANOTHER_PID_NS else f"on {s.host or 'its node'}")
    return anomaly("rank_hang", f"rank {s.rank} ({s.where()}) silent = {secs(age[s.rank])} > {secs(stall_s)} "
                   f"{why}{_others(ranks, silent)}", s.step or 0,
                   f"That rank hangs and the others will wait for it until the collective timeout: "
                   f"py-spy dump --pid {pid} {on} shows where (a dataloader, a "
                   f"collective, I/O); kill -CONT {pid} if it was stopped, else kill the job and relaunch")


def _window(history, start: float) -> tuple[list, Optional[float]]:
    """(sps samples at or after ``start``, the last sample before it or None); newest first."""
    mine, before = [], None
    for t, v in reversed(history):
        if t < start:
            before = v
            break
        mine.append(v)
    return mine, before


def straggler(ranks: Mapping[int, RankState], now: float, window_s: float,
              ratio: float = 0.75) -> Optional[Anomaly]:
    """A rank whose every sps sample in the last ``window_s`` (and the one before, so that the
    slowness is known to span the window) is below ``ratio`` x the median of the other ranks'
    median sps over the same window: ``straggler``. Needs at least two ranks with samples."""
    start = now - window_s
    windows = {r: _window(s.history, start) for r, s in ranks.items()}
    medians = {r: median(w[0]) for r, w in windows.items() if w[0]}
    if len(medians) < 2:
        return None
    worst = None
    for r, (mine, before) in windows.items():
        if not mine or before is None:
            continue  # silent in the window, or its history does not reach back over it yet
        med = median([m for o, m in medians.items() if o != r])
        floor = ratio * med
        if med > 0 and before < floor and max(mine) < floor:
            if worst is None or medians[r] / med < worst[1] / worst[2]:
                worst = (r, medians[r], med, floor)
    if worst is None:
        return None
    r, slow, med, floor = worst
    s = ranks[r]
    return anomaly("straggler", f"rank {r} ({s.where()}) median sps = {slow:.4g} < {floor:.4g} "
                   f"({ratio:g} x the other ranks' median {med:.4g}) for {secs(window_s)}",
                   s.step or 0, f"One rank holds the others back: check its node ({s.host or 'host'}) "
                   "with nvidia-smi (throttling, another process, a slow GPU or link) and its dataloader; "
                   "exclude the node and relaunch if it stays slow")


def root_cause_anomaly(cause: RootCause, step: int, killed: Optional[str] = None,
                       oom: bool = False) -> Anomaly:
    """torchrun's first observed failure as an anomaly: ``oom`` when ``oom`` (from
    ``logs.killed_reason``) or the message names an out-of-memory error, else ``crash``;
    ``killed`` is ``killed_reason``'s text for a SIGKILL."""
    text = cause.summary(killed)
    kind = "oom" if oom or (cause.message and oom_line([cause.message])) else "crash"
    fix = ("Out of memory on that rank: halve the per-device batch size (keep the effective batch with "
           "gradient accumulation) or shorten the sequence length, then relaunch") if kind == "oom" else (
           "The first failing rank's error is the cause, the other ranks' timeouts are fallout: fix it "
           "(checkin.py shows the log tail), then relaunch from the last checkpoint")
    return anomaly(kind, f"root cause = {text[:300]!r} (first observed failure)", step, fix)


def rank_lines(ranks: Mapping[int, RankState], now: float, procs: Optional[Mapping[int, str]] = None,
               stall_s: float = 60.0, limit_chars: int = 600,
               where: Optional[Mapping[int, str]] = None) -> list[str]:
    """Check-in lines: one per rank (``rank 1: step 120, 9.8 sps, 3s ago, running, pid 4242 on
    node-a``) when they fit in ``limit_chars``; otherwise the ranks that are not healthy one per
    line (stopped, gone, silent > ``stall_s``, FATAL) and one summary line for the healthy ones
    (``ranks 0-61 healthy: steps 118-120, sps 9.7-10.4, last heartbeat <= 3s ago``).
    The total stays within ``limit_chars`` (a last ``... N more`` line when it must). A rank in
    ``where`` (``rank_where``; default: computed here) says why its pid is not probed:
    ``remote``, ``in another PID namespace: judged by its records``, or another boot; a given
    ``where`` wins over ``procs`` (a pid of ours may have a foreign rank's number), a computed
    one only names the ranks ``procs`` does not hold."""
    procs = procs or {}
    if not ranks:
        return []
    given = where is not None
    where = where if given else rank_where(ranks)

    def state(s: RankState) -> str:
        if s.fatal:
            return "FATAL"
        if s.rank in where and (given or s.pid not in procs):
            return AWAY.get(where[s.rank], "not probed here: judged by its records")
        if s.pid in procs:
            return procs[s.pid]
        return "?"

    def age(s: RankState) -> Optional[float]:
        return None if s.last_seen is None else max(0.0, now - s.last_seen)

    def line(s: RankState) -> str:
        a = age(s)
        sps = f"{s.sps:.4g} sps" if s.sps is not None else "sps ?"
        return (f"rank {s.rank}: step {s.step if s.step is not None else '?'}, {sps}, "
                f"{secs(a) + ' ago' if a is not None else 'never'}, {state(s)}, {s.where()}").rstrip(", ")

    order = sorted(ranks)
    full = [line(ranks[r]) for r in order]
    if sum(len(x) + 1 for x in full) <= limit_chars:
        return full

    def healthy(s: RankState) -> bool:
        a = age(s)
        return (not s.fatal and state(s) not in GONE + ("stopped",) and a is not None and a <= stall_s)

    good = [ranks[r] for r in order if healthy(ranks[r])]
    bad = [ranks[r] for r in order if not healthy(ranks[r])]
    out = []
    if good:
        steps = [s.step for s in good if s.step is not None]
        sps = [s.sps for s in good if s.sps is not None]
        ages = [age(s) for s in good]
        bits = [f"steps {min(steps)}-{max(steps)}" if steps else "",
                f"sps {min(sps):.4g}-{max(sps):.4g}" if sps else "",
                f"last heartbeat <= {secs(max(ages))} ago"]
        out.append(f"ranks {ranks_text(s.rank for s in good)} healthy: " + ", ".join(b for b in bits if b))
    used = sum(len(x) + 1 for x in out)
    for i, s in enumerate(bad):
        text = line(s)
        rest = len(bad) - i - 1
        reserve = 40 if rest else 0
        if used + len(text) + 1 + reserve > limit_chars:
            out.append(f"... {len(bad) - i} more unhealthy: ranks {ranks_text(b.rank for b in bad[i:])}"[:limit_chars - used])
            break
        out.append(text)
        used += len(text) + 1
    return out
