"""The volumes a run writes to, followed by their free space, whatever fills them (standard
library only: the watchdog's hot path).

- ``VolumeWatch().poll(now, paths, th, explained) -> (VolumeState, ...)``: one ``statvfs`` per
  volume per poll (the run folder's, the log's, each checkpoint folder's; one per device), the
  readings of the last ``--disk-window`` kept, and a bounded scan of the run's folders on that
  volume (at most ``SCAN_ENTRIES`` entries) made only when its free space fell, never a full
  ``du`` each poll. ``explained``: the bytes of the checkpoints the checkpoint probe recognizes
  (complete ones), per folder: they are added back to the free space the trend is measured on,
  so a fill the probe already predicts (``checkpoints.rule_disk``) is not measured twice.
- ``trend(readings)``: the fill, robust to one save's burst and to deletions: the high-water mark
  of the free space in the oldest third of the readings against the one in the newest third (a
  save later deleted by a rotation, or a burst of writes then deleted, moves neither), trusted
  only when that fall holds two writes' worth (the biggest fall between two readings, or the
  biggest write seen to end within them: a save over several readings) and the free space still
  falls in the newest third. A save shorter than a third of the window never moves the newest
  third's mark.
- ``rule_ahead(volumes, th, step)``: ``disk`` while the run lives: the volume fills within
  ``--disk-horizon`` at its slope (never extrapolated beyond ``--disk-extrapolate`` x the span it
  was measured over); or the next write (repeated writes, none freed since) will not fit with
  ``--disk-margin``; or the free space is under the floor already.
- ``rule_full(volumes, th, step, who, save, other_error)``: ``disk`` once the trainer died with a
  volume of the run under the floor (``--disk-free-min``, at most a tenth of the volume), or
  under one save or write when its log names no other error: a full volume takes the log's
  ENOSPC line with it.
"""
from __future__ import annotations

import os
import stat
from collections import deque
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from supervise.observe.checkpoints import mount_point, size
from supervise.thresholds import Thresholds
from supervise.vocabulary import WATCHDOG_LOG, WATCHDOG_STATE, Anomaly, anomaly, secs

MB = 1e6
RESOLUTION = 1e6       # bytes: a change of free space under this between two readings is noise, not a write
HISTORY = 720          # readings kept per volume at most (the window is shorter when polls are fast)
MIN_READINGS = 5       # readings before a slope is measured
SCAN_ENTRIES = 4096    # directory entries one scan stats at most
SCAN_DEPTH = 4         # folder levels below a root one scan descends
SCAN_GAP = 60.0        # s between two scans made because the free space fell (a volume in trouble: each poll)
BURSTS = 8             # writes remembered per volume, however old
SHOWN = 2              # growing entries an anomaly names
ONE_FILE = 0.8         # a file that is this much of its folder's growth is named instead of the folder
OURS = (WATCHDOG_STATE, WATCHDOG_LOG, ".watchdog.lock")   # the supervisor's own files: never what fills it


@dataclass(frozen=True)
class Reading:
    t: float
    free: int          # bytes free (statvfs f_bavail, as df shows it)
    adj: int           # free + the bytes of the recognized checkpoints on it: what the trend is measured on


@dataclass(frozen=True)
class Trend:
    """The fill measured over the readings: ``slope`` bytes/s while filling, else None."""

    readings: int = 0
    span: float = 0.0            # s covered by the readings
    fall: float = 0.0            # bytes the high-water mark fell between the oldest and newest thirds
    dt: float = 0.0              # s between those two high-water readings
    biggest: float = 0.0         # the biggest fall between two readings (one write)
    slope: Optional[float] = None


@dataclass(frozen=True)
class Growth:
    """One entry that fills the volume: a folder (its files' growth) or a single file."""

    path: str
    bytes: int
    files: int = 1               # files that grew or are new
    new: int = 0                 # of which new
    recent: bool = False         # no earlier scan to compare: its size, modified within the window

    def describe(self, mount: str = "") -> str:
        """``run/train.log +15 MB``, ``out +12 MB (3 new files)``: relative to ``mount`` when under it."""
        p = _printable(os.path.relpath(self.path, mount) if mount and _under(self.path, mount) else self.path)
        p = p if len(p) <= 80 else f"{p[:30]}...{p[-47:]}"
        if self.recent:
            return f"{p} {size(self.bytes)}" + (f" ({self.files} files)" if self.files > 1 else "")
        what = (f" ({self.new} new files)" if self.new == self.files else f" ({self.files} files)") \
            if self.files > 1 else " (new)" if self.new else ""
        return f"{p} +{size(self.bytes)}{what}"


@dataclass(frozen=True)
class VolumeState:
    """One volume of the run at one poll."""

    mount: str
    roles: tuple = ()            # 'run folder', 'log', 'checkpoints': what of the run it holds
    roots: tuple = ()            # the run's paths on it (what a scan looks under)
    free: int = 0
    total: int = 0
    trend: Trend = Trend()
    writes: tuple = ()           # (t, bytes) of the last writes (falls of free space), oldest first
    freed_at: Optional[float] = None   # the last time free space came back (a deletion)
    growth: tuple = ()           # Growth, biggest first; () before any scan
    scanned: bool = False
    cut: bool = False            # the scan stopped at SCAN_ENTRIES

    @property
    def where(self) -> str:
        return f"{_printable(self.mount)} ({', '.join(self.roles)})" if self.roles else _printable(self.mount)

    def time_to_full(self) -> Optional[float]:
        s = self.trend.slope
        return self.free / s if s else None

    def write(self) -> Optional[int]:
        """The biggest of the last three writes, when at least two of them are of its size (at
        least half of it) and no space was freed since the first of those: a repeated write the
        volume keeps."""
        last = self.writes[-3:]
        if len(last) < 2:
            return None
        big = max(b for _, b in last)
        alike = [(t, b) for t, b in last if b >= big / 2]
        if len(alike) < 2 or (self.freed_at is not None and self.freed_at >= alike[0][0]):
            return None
        return big

    def biggest_write(self) -> Optional[int]:
        return max((b for _, b in self.writes), default=None)


def _under(path: str, mount: str) -> bool:
    return mount == os.sep or path == mount or path.startswith(mount.rstrip(os.sep) + os.sep)


def _printable(p: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in str(p))


def _span(s: float) -> str:
    return secs(s) if s < 120 else f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.1f} h"


def _rate(slope: float) -> str:
    return f"{size(slope)}/s" if slope >= MB else f"{size(slope * 3600)}/h"


# ---------------------------------------------------------------------------------------------
# The trend
# ---------------------------------------------------------------------------------------------
def trend(readings: Sequence[Reading], write: float = 0.0) -> Trend:
    """The fill of a volume from its readings (oldest first), measured on ``Reading.adj``.
    ``write``: the biggest write seen to end within them (a save over several readings): a fill
    must hold two of those too."""
    n = len(readings)
    if n < 2:
        return Trend(readings=n)
    t0, tn = readings[0].t, readings[-1].t
    span = tn - t0
    steps = [a.adj - b.adj for a, b in zip(readings, readings[1:])]
    biggest = max(max(steps), write, 0)
    if n < MIN_READINGS or span <= 0:
        return Trend(n, span, biggest=biggest)
    third = span / 3
    old = [r for r in readings if r.t <= t0 + third]
    new = [r for r in readings if r.t >= tn - third]
    a = max(old, key=lambda r: r.adj)
    b = max(new, key=lambda r: r.adj)
    fall, dt = a.adj - b.adj, b.t - a.t
    still = b.adj - readings[-1].adj > 0
    filling = dt > 0 and fall >= RESOLUTION and fall >= 2 * biggest and still
    return Trend(n, span, fall, dt, biggest, fall / dt if filling else None)


# ---------------------------------------------------------------------------------------------
# What fills it: a bounded scan
# ---------------------------------------------------------------------------------------------
def scan(roots: Sequence[str], dev: int, budget: int = SCAN_ENTRIES, depth: int = SCAN_DEPTH) -> tuple[dict, bool]:
    """({file: (bytes on disk, mtime)} under ``roots`` on device ``dev``, breadth first, at most
    ``budget`` entries and ``depth`` folder levels; whether it stopped at the budget). Links are
    not followed; other file systems mounted below are left out."""
    out: dict = {}
    queue = deque()
    for r in roots:
        try:
            st = os.stat(r, follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_dev == dev:
            out[r] = (_bytes(st), st.st_mtime)
        elif stat.S_ISDIR(st.st_mode) and st.st_dev == dev:
            queue.append((r, 0))
    seen, n = set(), 0
    while queue:
        d, level = queue.popleft()
        if d in seen:
            continue
        seen.add(d)
        try:
            it = os.scandir(d)
        except OSError:
            continue
        with it:
            for e in it:
                n += 1
                if n > budget:
                    return out, True
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                if st.st_dev != dev:
                    continue
                if stat.S_ISREG(st.st_mode):
                    if e.name not in OURS and not e.name.startswith(f".{WATCHDOG_STATE}."):
                        out[e.path] = (_bytes(st), st.st_mtime)
                elif stat.S_ISDIR(st.st_mode) and level + 1 < depth:
                    queue.append((e.path, level + 1))
    return out, False


def _bytes(st) -> int:
    blocks = getattr(st, "st_blocks", None)
    return blocks * 512 if blocks is not None else st.st_size


def growing(now_scan: dict, base: Optional[tuple], now: float, window: float) -> tuple:
    """The entries that fill the volume, biggest first: each file's growth since the ``base``
    scan ((t, files)), new files whole, summed per folder (a folder where one file grew is that
    file). With no base, or nothing grown since it: the files modified within ``window``, whole."""
    grew: dict = {}
    if base is not None:
        then = base[1]
        for path, (b, _) in now_scan.items():
            old = then.get(path)
            g = b - old[0] if old is not None else b
            if g > 0:
                grew[path] = (g, old is None)
    recent = sum(g for g, _ in grew.values()) < RESOLUTION   # nothing (or noise) grew since the base
    if recent:
        grew = {p: (b, False) for p, (b, m) in now_scan.items() if m >= now - window and b > 0}
    by_dir: dict = {}
    for path, (g, new) in grew.items():
        by_dir.setdefault(os.path.dirname(path), []).append((path, g, new))
    out = []
    for d, files in by_dir.items():
        total = sum(g for _, g, _ in files)
        path, g, new = max(files, key=lambda f: f[1])
        if g >= ONE_FILE * total:   # one file is the folder's growth: name it
            out.append(Growth(path, g, 1, int(new), recent))
        else:
            out.append(Growth(d, total, len(files), sum(new for *_, new in files), recent))
    return tuple(sorted(out, key=lambda g: -g.bytes)[:4])


def fills(v: VolumeState) -> str:
    """'growing: A +20 MB (5 new files), B +1.0 MB' or why nothing is named."""
    cut = f" (scan stopped at {SCAN_ENTRIES} entries)" if v.cut else ""
    if v.growth:
        head = "recently written: " if v.growth[0].recent else "growing: "
        top = v.growth[0].bytes
        shown = [g for g in v.growth[:SHOWN] if g.bytes >= top / 10]   # what matters beside the biggest
        return head + ", ".join(g.describe(v.mount) for g in shown) + cut
    if v.scanned:
        return f"nothing under the run's folders there grew: something else fills it{cut}"
    return ""


# ---------------------------------------------------------------------------------------------
# The probe
# ---------------------------------------------------------------------------------------------
class _Volume:
    def __init__(self, dev: int, mount: str):
        self.dev, self.mount = dev, mount
        self.readings: deque = deque(maxlen=HISTORY)
        self.writes: deque = deque(maxlen=BURSTS)
        self.open_write: Optional[list] = None   # [t, bytes] of the write still going on
        self.freed_at: Optional[float] = None
        self.scans: deque = deque(maxlen=3)      # (t, free, {file: (bytes, mtime)})
        self.growth: tuple = ()
        self.cut = False
        self.roots: dict = {}                    # path -> role, this poll
        self.last: Optional[VolumeState] = None

    def add(self, r: Reading, window: float) -> None:
        if self.readings:
            step = self.readings[-1].adj - r.adj
            if step >= RESOLUTION:
                if self.open_write is None:
                    self.open_write = [r.t, 0]
                self.open_write[0] = r.t
                self.open_write[1] += step
            else:
                self._close()
                if -step >= RESOLUTION:
                    self.freed_at = r.t
        self.readings.append(r)
        while self.readings and self.readings[0].t < r.t - window:
            self.readings.popleft()

    def _close(self) -> None:
        if self.open_write is not None:
            self.writes.append(tuple(self.open_write))
            self.open_write = None

    def state(self, free: int, total: int) -> VolumeState:
        writes = tuple(self.writes) + ((tuple(self.open_write),) if self.open_write else ())
        roles = tuple(dict.fromkeys(self.roots.values()))
        since = self.readings[0].t if self.readings else 0.0
        closed = max((b for t, b in self.writes if t >= since), default=0.0)
        return VolumeState(self.mount, roles, tuple(self.roots), free, total, trend(list(self.readings), closed), writes,
                           self.freed_at, self.growth, bool(self.scans), self.cut)

    def scan(self, now: float, free: int, window: float) -> None:
        files, self.cut = scan(list(self.roots), self.dev)
        base = next((s for s in self.scans if s[0] >= now - window), self.scans[-1] if self.scans else None)
        self.growth = growing(files, (base[0], base[2]) if base else None, now, window)
        self.scans.append((now, free, files))


class VolumeWatch:
    """Follows the free space of the volumes a run writes to. ``one_shot``: check-in's look (one
    reading: no slope; a scan only when a volume is under the floor)."""

    def __init__(self, one_shot: bool = False, statvfs=os.statvfs):
        self.one_shot = one_shot
        self.statvfs = statvfs
        self._vols: dict = {}     # dev -> _Volume
        self._where: dict = {}    # path -> (dev, mount, existing path)

    def _locate(self, path: str):
        p = os.path.abspath(path)
        while not os.path.exists(p) and os.path.dirname(p) != p:
            p = os.path.dirname(p)
        try:
            dev = os.stat(p).st_dev
        except OSError:
            return None
        known = self._where.get(path)
        if known is None or known[0] != dev or known[2] != p:
            known = self._where[path] = (dev, mount_point(p), p)
        return known

    def poll(self, now: float, paths: Sequence[tuple], th: Thresholds = Thresholds(),
             explained: Optional[Mapping[str, int]] = None) -> tuple:
        """One reading of each volume holding one of ``paths`` ((path, role), in order): their
        states, in the order first named."""
        explained = explained or {}
        seen: dict = {}
        for path, role in paths:
            where = self._locate(str(path))
            if where is None:
                continue
            dev, mount, existing = where
            v = self._vols.get(dev)
            if v is None:
                v = self._vols[dev] = _Volume(dev, mount)
            if dev not in seen:
                seen[dev] = (v, existing)
                v.roots = {}
            if os.path.exists(str(path)):
                v.roots.setdefault(os.path.abspath(str(path)), role)
        out = []
        for dev, (v, existing) in seen.items():
            try:
                st = self.statvfs(existing)
            except OSError:
                continue
            free, total = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
            adj = free + sum(b for p, b in explained.items() if self._where.get(p, (None,))[0] == dev)
            v.add(Reading(now, free, adj), th.disk_window)
            state = v.state(free, total)
            if self._want_scan(v, state, now, th):
                v.scan(now, free, th.disk_window)
                state = v.state(free, total)
            v.last = state
            out.append(state)
        return tuple(out)

    def _want_scan(self, v: _Volume, state: VolumeState, now: float, th: Thresholds) -> bool:
        """Scan when the volume is in trouble (what the rules would say) and this poll has not
        scanned it, or (a watchdog) when the free space fell since the last scan, at most every
        SCAN_GAP s. Never otherwise: a quiet volume costs one statvfs."""
        if not v.roots:
            return False
        trouble = state.free < floor(state, th) or _ahead(state, th) is not None
        last = v.scans[-1] if v.scans else None
        if trouble:
            return last is None or last[0] < now
        if self.one_shot:
            return False
        before = last[1] if last is not None else (v.readings[0].free if v.readings else state.free)
        return before - state.free >= RESOLUTION and (last is None or now - last[0] >= SCAN_GAP)


def explained_bytes(disk) -> dict:
    """{checkpoint folder: bytes of the complete checkpoints in it} of a ``checkpoints.DiskState``
    (None: {}): what the checkpoint probe already accounts for."""
    if disk is None:
        return {}
    out = {}
    for d in disk.dirs:
        root = str(d)
        out[root] = sum(c.bytes for c in disk.checkpoints if c.complete
                        and (c.path == root or c.path.startswith(root.rstrip(os.sep) + os.sep)))
    return out


# ---------------------------------------------------------------------------------------------
# The rules
# ---------------------------------------------------------------------------------------------
def floor(v: VolumeState, th: Thresholds) -> float:
    """The free space under which a volume is full: ``--disk-free-min`` MB, at most a tenth of it."""
    return min(th.disk_free_min * MB, v.total / 10) if v.total else th.disk_free_min * MB


def _floor_text(v: VolumeState, th: Thresholds) -> str:
    return f"{size(floor(v, th))} floor"


def _ahead(v: VolumeState, th: Thresholds) -> Optional[tuple]:
    """(what, fix end) when the volume is in trouble while the run lives, else None."""
    if v.free < floor(v, th):
        return (f"free space = {size(v.free)} < {_floor_text(v, th)} on {v.where} while the run writes there",
                "before the next write fails")
    margin = max(1.0, th.disk_margin)
    w = v.write()
    if w and v.free < w * margin:
        n = sum(1 for _, b in v.writes if b >= w / 2)
        return (f"free space = {size(v.free)} < next write {size(w)} x {margin:g} margin on {v.where} "
                f"({n} writes of up to {size(w)}, none freed since)", "before the next write fails")
    ttf, t = v.time_to_full(), v.trend
    if ttf is None:
        return None
    reach = th.disk_extrapolate * t.dt
    limit = min(th.disk_horizon, reach)
    if ttf >= limit:
        return None
    times = f"{th.disk_extrapolate:g} x " if th.disk_extrapolate != 1 else ""
    why = "--disk-horizon" if th.disk_horizon <= reach else f"{times}the {_span(t.dt)} the slope was measured over"
    shown, bound = _span(ttf), _span(limit)
    for digits in (1, 2):   # rounded alike: more digits
        if shown == bound:
            shown, bound = f"{ttf:.{digits}f}s", f"{limit:.{digits}f}s"
    return (f"time to full = {shown} < {bound} ({why}) on {v.where}: {size(v.free)} free, "
            f"falling {_rate(t.slope)}", "before the volume fills")


def _fix(v: VolumeState) -> str:
    return "free space there (delete, rotate or move what grows, or write elsewhere)"


def rule_ahead(volumes: Sequence[VolumeState], th: Thresholds, step: int) -> Optional[Anomaly]:
    """``disk`` while the run lives, for the first volume in trouble (``_ahead``)."""
    for v in volumes:
        found = _ahead(v, th)
        if found is not None:
            what, end = found
            said = fills(v)
            fix = _fix(v)
            return anomaly("disk", what + (f"; {said}" if said else ""), step, f"{fix[0].upper()}{fix[1:]}, {end}")
    return None


def shortfall(volumes: Sequence[VolumeState], th: Thresholds, save: Optional[float] = None
              ) -> Optional[tuple[VolumeState, float]]:
    """(the volume of the run with the least room, the bytes to free there) when one lacks room
    for the run to go on: its floor, plus one save (``save``, on a checkpoint volume) or its
    biggest write with the --disk-margin; None when every volume has room (a relaunch may go)."""
    margin = max(1.0, th.disk_margin)
    worst = None
    for v in volumes:
        per_save = save if "checkpoints" in v.roles else None
        one = per_save or v.biggest_write() or 0
        need = floor(v, th) + one * margin - v.free
        if need > 0 and (worst is None or need > worst[1]):
            worst = (v, need)
    return worst


def room_line(volumes: Sequence[VolumeState], th: Thresholds, save: Optional[float] = None) -> Optional[str]:
    """What must be freed before the run can go on (``shortfall``), with what grows there, or None."""
    found = shortfall(volumes, th, save)
    if found is None:
        return None
    v, need = found
    said = fills(v)
    return f"free at least {size(need)} on {v.where} ({size(v.free)} free now{'; ' + said if said else ''})"


def rule_full(volumes: Sequence[VolumeState], th: Thresholds, step: int, who: str,
              save: Optional[float] = None, other_error: bool = False) -> Optional[Anomaly]:
    """``disk`` once the trainer died (``who``) with a volume of the run under the floor, or under
    one save (``save``: the checkpoint probe's bytes per save, on a checkpoint volume) or one write
    when the log names no other error (``other_error``); the fullest such volume."""
    hits = []
    for v in volumes:
        if v.free < floor(v, th):
            hits.append((v.free / max(floor(v, th), 1), v, _floor_text(v, th)))
            continue
        per_save = save if "checkpoints" in v.roles else None
        one = per_save or v.biggest_write()
        if one and v.free < one and not other_error:
            hits.append((v.free / one, v, f"one {'save' if per_save else 'write'} {size(one)}"))
    if not hits:
        return None
    _, v, limit = min(hits, key=lambda h: h[0])
    said = fills(v)
    return anomaly("disk", f"free space = {size(v.free)} < {limit} on {v.where} after {who}"
                   + (f"; {said}" if said else ""), step,
                   f"The volume is full: {_fix(v)}, then relaunch from the last complete "
                   "checkpoint (checkin.py names it)")
