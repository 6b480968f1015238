"""Checkpoints you can trust and the disk they fill (standard library only: the watchdog's hot path).

- ``find_checkpoints(dirs)``: every checkpoint in the folders, oldest step first, each checked
  without torch: an HF ``checkpoint-N/`` (``trainer_state.json`` parses, the weights are present
  and whole: a safetensors file's header and length, a torch file's zip central directory, every
  shard of an index), a Lightning ``*.ckpt``, a plain torch ``*.pt``/``*.pth`` (its zip central
  directory reads; the step from the name, else from the pickle, read as opcodes and never
  executed), and the templates' temporary names (``.tmp.*``, ``.staging``, ``.ready-*``,
  ``.trash-*``), which are never complete.
- ``choose_resume(checkpoints, first_bad_step)``: the newest complete checkpoint written before
  the first non-finite record, and why each newer one is skipped.
- ``CheckpointWatch(dirs).poll(now) -> DiskState``: the probe. A poll stats the folders and
  re-lists only those whose mtime changed (plus the files, the newest folder and the incomplete
  ones, to see saves written in place or still being written): bytes per save, saves per hour,
  rotation, the free space of the file system holding them.
- ``rule_disk(state, th, remaining_saves, step)``: ``disk`` when the next save (or the run's
  remaining saves, rotation taken into account) would not fit.
- ``checkpoint_dirs(run_dir, start, explicit)``: where a run's checkpoints are.
"""
from __future__ import annotations

import json
import os
import re
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable, Optional, Sequence, Union

from supervise.contract import open_regular, read_json
from supervise.observe.probes import disk_usage
from supervise.observe.records import median
from supervise.thresholds import Thresholds
from supervise.vocabulary import Anomaly, anomaly

TORN = "still being written or torn"
SETTLE = 1.0           # s a complete save must stay before it shows that the run keeps its saves
PICKLE_MAX = 16 << 20  # bytes of a torch file's data.pkl read for its step
HEADER_MAX = 100 << 20 # safetensors' own limit on a header

HF_DIR = re.compile(r"^checkpoint-(\d+)$")
TEMP_DIR = re.compile(r"^(tmp-checkpoint|\.ready-checkpoint|\.trash-checkpoint)-(\d+)$")
TEMP_WHY = {"tmp-checkpoint": "temporary name: the Trainer renames it into place once written",
            ".ready-checkpoint": "temporary name: written, not yet renamed into place",
            ".trash-checkpoint": "temporary name: an old checkpoint being deleted"}
STAGING = ".staging"
TORCH_SUFFIXES = (".pt", ".pth")
TEMPLATE_FILES = ("last.pt", "best.pt")
STEP_IN_NAME = re.compile(r"(?:^|[^a-z])(?:global_step|step|iter|it|ckpt|checkpoint)[=_-]?(\d+)", re.I)
STEP_KEYS = ("global_step", "step", "iter_num", "iteration")   # in a torch pickle, by preference


@dataclass(frozen=True)
class Checkpoint:
    path: str
    step: Optional[int]
    bytes: int
    mtime: float
    complete: bool
    why: str          # why incomplete or unreadable; '' when complete
    layout: str       # 'hf' | 'lightning' | 'torch' | 'template'

    def describe(self) -> str:
        """``PATH (step 50, 6.0 MB, complete)`` or ``... incomplete: WHY``."""
        step = f"step {self.step}" if self.step is not None else "step unknown"
        state = "complete" if self.complete else f"incomplete: {self.why}"
        return f"{self.path} ({step}, {size(self.bytes)}, {state})"


def size(n: Optional[float]) -> str:
    """Bytes in decimal units: ``512 B``, ``6.0 MB``, ``1.25 GB``."""
    if n is None:
        return "?"
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}" if abs(n) >= 10 * scale else f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


# ---------------------------------------------------------------------------------------------
# One file or folder: is it whole?
# ---------------------------------------------------------------------------------------------
def _safetensors_why(path: str, name: str, length: int) -> str:
    """'' when the 8-byte header length, the JSON header and the file's length agree."""
    try:
        with open_regular(path) as f:
            head = f.read(8)
            if len(head) < 8:
                return f"{TORN}: {name} is {length} bytes, shorter than its 8-byte header length"
            n = int.from_bytes(head, "little")
            if n > HEADER_MAX or 8 + n > length:
                return f"{TORN}: {name} announces a {n}-byte header in {length} bytes"
            header = json.loads(f.read(n))
    except (OSError, ValueError) as e:
        return f"{TORN}: {name} header does not parse ({type(e).__name__})"
    try:
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (AttributeError, KeyError, IndexError, TypeError, ValueError):
        return f"{TORN}: {name} header has no valid data_offsets"
    if 8 + n + end > length:
        return f"{TORN}: {name} is {length} bytes < the {8 + n + end} its header describes"
    return ""


def _pickle_step(data: bytes) -> Optional[int]:
    """The step a pickled checkpoint dict holds (``global_step``, ``step``, ``iter_num``), read
    from the opcode stream without executing it: a key string followed by an integer."""
    found: dict = {}
    memo: dict = {}
    pending = last = None
    n_memo = 0
    import pickletools  # the imports of a Lightning file's reading, here: not a check-in's start-up
    try:
        for op, arg, _ in pickletools.genops(data):
            name = op.name
            if isinstance(arg, str) and ("UNICODE" in name or name in ("SHORT_BINSTRING", "BINSTRING", "STRING")):
                last = pending = arg if arg in STEP_KEYS else None
                continue
            if name in ("BINPUT", "LONG_BINPUT", "MEMOIZE"):
                index = arg if name != "MEMOIZE" else n_memo
                n_memo += name == "MEMOIZE"
                if last is not None:
                    memo[index] = last
                continue
            last = None
            if name in ("BINGET", "LONG_BINGET"):
                pending = memo.get(arg)
                continue
            if pending and name in ("BININT", "BININT1", "BININT2", "LONG1", "LONG4", "INT", "LONG") \
                    and isinstance(arg, int) and not isinstance(arg, bool) and arg >= 0:
                found.setdefault(pending, arg)
            pending = None
    except (ValueError, KeyError, EOFError, IndexError, TypeError):
        pass
    return next((found[k] for k in STEP_KEYS if k in found), None)


def _zip_why(path: str, name: str, length: int, want_step: bool = False) -> tuple[str, Optional[int]]:
    """('' or why, step): a torch file is whole when its zip central directory reads."""
    if length == 0:
        return f"{TORN}: {name} is empty", None
    import zipfile
    try:
        with open_regular(path) as f, zipfile.ZipFile(f) as z:
            pkl = [i for i in z.infolist() if i.filename.endswith("data.pkl")] if want_step else []
            pkl = min(pkl, key=lambda i: len(i.filename)) if pkl else None
            if pkl is None or pkl.file_size > PICKLE_MAX:
                return "", None
            return "", _pickle_step(z.read(pkl))
    except (zipfile.BadZipFile, EOFError) as e:
        return f"{TORN}: {name} is not a readable zip ({e})", None
    except (zipfile.LargeZipFile, OSError, ValueError, RuntimeError) as e:
        return f"{TORN}: {name} unreadable ({type(e).__name__}: {e})", None


def _sharded_why(folder: str, index: str, files: dict) -> str:
    doc = read_json(os.path.join(folder, index), limit=64 << 20)
    shards = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(shards, dict) or not shards:
        return f"{TORN}: {index} does not parse"
    for shard in sorted(set(map(str, shards.values()))):
        if shard not in files:
            return f"{TORN}: {shard} missing"
        path = os.path.join(folder, shard)
        why = _safetensors_why(path, shard, files[shard]) if shard.endswith(".safetensors") else \
            _zip_why(path, shard, files[shard])[0]
        if why:
            return why
    return ""


def _hf_weights_why(folder: str, files: dict, subdirs: dict) -> str:
    for name in ("model.safetensors", "adapter_model.safetensors"):
        if name in files:
            return _safetensors_why(os.path.join(folder, name), name, files[name])
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if index in files:
            return _sharded_why(folder, index, files)
    for name in ("pytorch_model.bin", "adapter_model.bin"):
        if name in files:
            return _zip_why(os.path.join(folder, name), name, files[name])[0]
    for d, inner in subdirs.items():   # FSDP's sharded state dict, DeepSpeed's global_stepN
        if d.startswith("pytorch_model_fsdp_") and ".metadata" in inner and any(inner.values()):
            return ""
        if re.match(r"global_step\d+$", d):
            states = [n for n in inner if n.endswith("model_states.pt")]
            for n in states:
                why = _zip_why(os.path.join(folder, d, n), f"{d}/{n}", inner[n])[0]
                if why:
                    return why
            if states:
                return ""
    return f"{TORN}: model.safetensors missing"


def _scan_folder(folder: str) -> tuple[dict, dict, int, float]:
    """(files: name -> size, subfolders: name -> {name -> size}, total bytes, newest mtime)."""
    files: dict = {}
    subdirs: dict = {}
    total, newest = 0, os.stat(folder).st_mtime
    with os.scandir(folder) as it:
        for e in it:
            try:
                if e.is_file():
                    st = e.stat()
                    files[e.name] = st.st_size
                    total += st.st_size
                    newest = max(newest, st.st_mtime)
                elif e.is_dir():
                    inner = subdirs[e.name] = {}
                    for root, _, names in os.walk(e.path):
                        for n in names:
                            st = os.stat(os.path.join(root, n))
                            inner[os.path.relpath(os.path.join(root, n), e.path)] = st.st_size
                            total += st.st_size
            except OSError:
                continue
    return files, subdirs, total, newest


def check_hf(folder: str) -> tuple[str, int, float]:
    """('' or why, bytes, mtime of its newest file) of an HF ``checkpoint-N`` folder: complete
    when the weights are whole, ``trainer_state.json`` parses and ``optimizer.pt`` (if any) reads."""
    try:
        files, subdirs, total, newest = _scan_folder(folder)
    except OSError as e:
        return f"unreadable ({type(e).__name__}: {e})", 0, 0.0
    why = _hf_weights_why(folder, files, subdirs)
    if not why:
        if "trainer_state.json" not in files:
            why = f"{TORN}: trainer_state.json missing"
        else:
            try:
                with open_regular(os.path.join(folder, "trainer_state.json")) as f:
                    json.loads(f.read())
            except (OSError, ValueError) as e:
                why = f"{TORN}: trainer_state.json does not parse ({type(e).__name__})"
    if not why and "optimizer.pt" in files:
        why = _zip_why(os.path.join(folder, "optimizer.pt"), "optimizer.pt", files["optimizer.pt"])[0]
    return why, total, newest


def _kind(name: str, is_dir: bool) -> Optional[tuple[str, Optional[int], str]]:
    """(layout, step from the name, why it is temporary or '') of a folder entry, or None."""
    if is_dir:
        m = HF_DIR.match(name)
        if m:
            return "hf", int(m.group(1)), ""
        m = TEMP_DIR.match(name)
        if m:
            return ("hf" if m.group(1) == "tmp-checkpoint" else "template"), int(m.group(2)), TEMP_WHY[m.group(1)]
        return None
    lower = name.lower()
    if not lower.endswith(TORCH_SUFFIXES + (".ckpt",)):
        return None
    m = re.search(r"step=(\d+)", name) or STEP_IN_NAME.search(name)
    step = int(m.group(1)) if m else None
    if name.startswith(".tmp."):
        return "template", step, "temporary name: written under it, then renamed into place"
    if lower.endswith(".ckpt"):
        return "lightning", step, ""
    return ("template" if name in TEMPLATE_FILES else "torch"), step, ""


def examine(path: Union[str, Path], layout: Optional[str] = None, step: Optional[int] = None,
            temp: str = "") -> Optional[Checkpoint]:
    """One checkpoint file or folder as a ``Checkpoint``, or None when ``path`` is not one."""
    path = os.path.abspath(str(path))
    try:
        st = os.stat(path)
    except OSError:
        return None
    is_dir = os.path.isdir(path)
    if layout is None:
        k = _kind(os.path.basename(path), is_dir)
        if k is None:
            return None
        layout, step, temp = k
    if temp:
        total = _scan_folder(path)[2] if is_dir else st.st_size
        return Checkpoint(path, step, total, st.st_mtime, False, temp, layout)
    if is_dir:
        why, total, mtime = check_hf(path)
        return Checkpoint(path, step, total, mtime, not why, why, layout)
    why, found = _zip_why(path, os.path.basename(path), st.st_size, want_step=step is None)
    return Checkpoint(path, step if step is not None else found, st.st_size, st.st_mtime, not why, why, layout)


def _listdir(d: str) -> list[tuple[str, str, bool]]:
    try:
        with os.scandir(d) as it:
            return [(e.path, e.name, e.is_dir()) for e in it]
    except OSError:
        return []


def _entries(d: str) -> list[tuple[str, str, bool, Optional[int], str]]:
    """(path, layout, is_dir, step, temp) of every checkpoint-looking entry of folder ``d`` (the
    template's ``.staging`` folder looked into), or of ``d`` itself when it is a checkpoint."""
    own = _kind(os.path.basename(d), os.path.isdir(d)) if os.path.exists(d) else None
    if own is not None:
        return [(d, own[0], os.path.isdir(d), own[1], own[2])]
    out = []
    for path, name, is_dir in _listdir(d):
        if is_dir and name == STAGING:
            for sub, sub_name, sub_dir in _listdir(path):
                m = HF_DIR.match(sub_name)
                if sub_dir and m:
                    out.append((sub, "template", True, int(m.group(1)), "staging folder: still being written"))
            continue
        k = _kind(name, is_dir)
        if k is not None:
            out.append((path, k[0], is_dir, k[1], k[2]))
    return out


def _order(c: Checkpoint):
    return (c.step if c.step is not None else -1, c.mtime, c.path)


def _as_dirs(dirs) -> list[str]:
    return list(dict.fromkeys(os.path.abspath(str(d)) for d in dirs))


def find_checkpoints(dirs: Sequence[Union[str, Path]]) -> list[Checkpoint]:
    """Every checkpoint in ``dirs`` (each a folder of checkpoints, or one checkpoint itself),
    oldest step first (unknown steps first, by mtime)."""
    out = []
    for d in _as_dirs(dirs):
        for path, layout, _, step, temp in _entries(d):
            c = examine(path, layout, step, temp)
            if c is not None:
                out.append(c)
    return sorted(out, key=_order)


# ---------------------------------------------------------------------------------------------
# Which checkpoint a relaunch resumes from
# ---------------------------------------------------------------------------------------------
def choose_resume(checkpoints: Iterable[Checkpoint], first_bad_step: Optional[int]
                  ) -> tuple[Optional[Checkpoint], list[tuple[Checkpoint, str]]]:
    """(the newest complete checkpoint written before ``first_bad_step``, the newer ones skipped
    with the reason, newest first). A checkpoint at or after the first non-finite record's step
    is poisoned; one whose step is unknown cannot be shown to predate it. None when none is left."""
    skipped = []
    for c in sorted(checkpoints, key=_order, reverse=True):
        if not c.complete:
            skipped.append((c, f"incomplete: {c.why}"))
        elif first_bad_step is not None and c.step is None:
            skipped.append((c, f"poisoned?: its step is unknown, so it cannot be shown to predate the "
                               f"first non-finite record at step {first_bad_step}"))
        elif first_bad_step is not None and c.step >= first_bad_step:
            skipped.append((c, f"poisoned: written at step {c.step} >= first non-finite record at "
                               f"step {first_bad_step}"))
        else:
            return c, skipped
    return None, skipped


def resume_lines(chosen: Optional[Checkpoint], skipped, first_bad_step: Optional[int]) -> list[str]:
    """Check-in's lines for a ``choose_resume`` choice: the checkpoint the relaunch uses, then
    each skipped one."""
    if chosen is not None:
        lines = [f"resume from: {chosen.describe()}"]
    elif skipped:
        lines = ["resume from: none (no complete checkpoint left" +
                 (f" before step {first_bad_step}" if first_bad_step is not None else "") +
                 "): the relaunch starts fresh"]
    else:
        lines = ["resume from: none (no checkpoint found): the relaunch starts fresh"]
    for c, why in skipped:
        step = f"step {c.step}" if c.step is not None else "step unknown"
        lines.append(f"  skipped {c.path} ({step}, {size(c.bytes)}): {why}")
    return lines


# ---------------------------------------------------------------------------------------------
# Where a run's checkpoints are
# ---------------------------------------------------------------------------------------------
def checkpoint_dirs(run_dir, start: Optional[dict], explicit: Sequence[str] = ()) -> list[Path]:
    """The folders to follow: ``explicit`` (``--checkpoint-dir``), else the start record's
    ``checkpoint_dir`` (a string or a list; relative to the start record's ``cwd``), else
    ``RUN_DIR/checkpoints`` when it exists (the templates'). Duplicates dropped."""
    start = start if isinstance(start, dict) else {}
    if explicit:
        chosen = [Path(os.path.abspath(str(p))) for p in explicit]
    else:
        given = start.get("checkpoint_dir")
        given = [given] if isinstance(given, str) else given if isinstance(given, list) else []
        cwd = start.get("cwd") if isinstance(start.get("cwd"), str) else str(run_dir)
        chosen = [Path(os.path.abspath(os.path.join(cwd, p))) for p in given if isinstance(p, str) and p]
        if not chosen and (Path(run_dir) / "checkpoints").is_dir():
            chosen = [Path(os.path.abspath(Path(run_dir) / "checkpoints"))]
    return list(dict.fromkeys(chosen))


def run_checkpoints(run_dir, start: Optional[dict], explicit: Sequence[str] = ()) -> list[Checkpoint]:
    """Every checkpoint of the run, oldest step first, in the folders ``checkpoint_dirs`` names:
    the one place check-in, the relaunch and smoke find them."""
    return find_checkpoints(checkpoint_dirs(run_dir, start, explicit))


def resume_choice(run_dir, start: Optional[dict], first_bad_step: Optional[int] = None,
                  explicit: Sequence[str] = ()) -> tuple[Optional[Checkpoint], list]:
    """``choose_resume`` over ``run_checkpoints``: the checkpoint a relaunch resumes from (the
    newest complete one written before the first non-finite record) and the newer ones skipped."""
    return choose_resume(run_checkpoints(run_dir, start, explicit), first_bad_step)


def declared_keep(run_dir, start: Optional[dict]) -> Optional[int]:
    """The most checkpoints a run keeps on disk at once, when it says so: the start record's
    ``save_total_limit`` (the Trainer writes the new one before deleting: limit + 1) or
    ``checkpoint_keep``, else a template's ``hparams.json`` ``keep`` (the templates never hold
    more). None when unknown."""
    start = start if isinstance(start, dict) else {}
    for key, extra in (("checkpoint_keep", 0), ("save_total_limit", 1)):
        v = start.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v + extra
    hp = read_json(Path(run_dir) / "hparams.json")
    v = hp.get("keep") if isinstance(hp, dict) else None
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


# ---------------------------------------------------------------------------------------------
# The probe
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DiskState:
    """What the checkpoint probe saw at one poll."""

    dirs: tuple = ()
    free_bytes: Optional[int] = None     # of the file system holding the dirs (the fullest one)
    total_bytes: Optional[int] = None
    mount: str = ""                      # that file system's mount point
    checkpoints: tuple = ()              # Checkpoint, oldest step first
    bytes_per_save: Optional[float] = None   # median size of the saves seen
    steps_per_save: Optional[float] = None   # median step gap between the saves seen
    saves: int = 0                       # complete saves seen (those present at the first poll too)
    saves_per_hour: Optional[float] = None   # from the median gap between the saves' mtimes
    kept_bytes: int = 0                  # every checkpoint now on disk, incomplete ones too
    rotating: bool = False               # old saves are deleted or overwritten (or a limit is declared)
    keep: Optional[int] = None           # the most checkpoints present at once under the rotation
    deleted: int = 0                     # complete saves seen to go (deleted, overwritten)
    settled: int = 0                     # complete saves present for SETTLE s or more
    first_save_at: Optional[float] = None

    @property
    def complete(self) -> int:
        return sum(1 for c in self.checkpoints if c.complete)

    def line(self) -> str:
        """Check-in's disk line."""
        where = f" on {self.mount}" if self.mount else ""
        free = f"{size(self.free_bytes)} free of {size(self.total_bytes)}{where}" if self.free_bytes is not None \
            else "free space unknown"
        if not self.checkpoints:
            return f"disk: {free}; no checkpoint yet in {', '.join(self.dirs) or '(no folder known)'}"
        sph = self.saves_per_hour
        rate = (f", {sph:.0f} saves/h" if sph >= 10 else f", {sph:.2g} saves/h") if sph else ""
        rot = f"; rotating (keeps {self.keep})" if self.rotating else "; every save kept"
        return (f"disk: {free}; {len(self.checkpoints)} checkpoints = {size(self.kept_bytes)}, "
                f"{size(self.bytes_per_save)} per save{rate}{rot}")


class _Entry:
    __slots__ = ("path", "layout", "is_dir", "step", "temp", "sig", "ckpt")

    def __init__(self, path, layout, is_dir, step, temp):
        self.path, self.layout, self.is_dir, self.step, self.temp = path, layout, is_dir, step, temp
        self.sig = self.ckpt = None


def _sig(e: _Entry):
    """What must change for the entry to be read again: a file's (mtime, size); a folder's
    mtime, plus its files' (name, size, mtime) while it is incomplete (being written)."""
    st = os.stat(e.path)
    if not e.is_dir:
        return st.st_mtime_ns, st.st_size
    if e.ckpt is not None and e.ckpt.complete:
        return (st.st_mtime_ns,)
    inner = []
    with os.scandir(e.path) as it:
        for x in it:
            s = x.stat()
            inner.append((x.name, s.st_size, s.st_mtime_ns))
    return st.st_mtime_ns, tuple(sorted(inner))


def _save_id(c: Checkpoint):
    """The same save whatever its name (a rename keeps a file's mtime); a folder is its path."""
    return c.path if c.layout == "hf" else (c.step, c.bytes, c.mtime)


def mount_point(path: str) -> str:
    p = os.path.abspath(path)
    while not os.path.exists(p) and os.path.dirname(p) != p:
        p = os.path.dirname(p)
    while not os.path.ismount(p):
        p = os.path.dirname(p)
    return p


class CheckpointWatch:
    """Follows checkpoint folders cheaply. ``keep``: the most checkpoints the run holds at once
    when it is declared (``declared_keep``); else a rotation is learned when saves go."""

    HISTORY = 32

    def __init__(self, dirs: Sequence[Union[str, Path]], keep: Optional[int] = None):
        self.dirs = tuple(_as_dirs(dirs))
        self.keep_declared = keep if isinstance(keep, int) and keep > 0 else None
        self._dir_mtime: dict = {}
        self._listing: dict = {d: {} for d in self.dirs}   # dir -> path -> _Entry
        self._present: dict = {}        # save id -> when the probe first saw it complete
        self._history: deque = deque(maxlen=self.HISTORY)   # (mtime, bytes, step) per save seen
        self._mounts: dict = {}
        self.saves = self.deleted = self.peak = 0
        self.first_save_at: Optional[float] = None
        self._base: Optional[DiskState] = None

    # -- reading the folders
    def _read(self, e: _Entry) -> None:
        e.ckpt = None
        try:
            sig = _sig(e)   # taken before the read (a folder's in full): a change during it shows next poll
        except OSError:
            sig = None
        e.ckpt = examine(e.path, e.layout, e.step, e.temp)
        if sig is not None and e.is_dir and e.ckpt is not None and e.ckpt.complete:
            sig = sig[:1]
        e.sig = sig

    def _relist(self, d: str) -> None:
        old, new = self._listing[d], {}
        for path, layout, is_dir, step, temp in _entries(d):
            e = old.get(path)
            if e is None or e.is_dir != is_dir:
                e = _Entry(path, layout, is_dir, step, temp)
                self._read(e)
            else:
                self._restat(e)
            new[path] = e
        self._listing[d] = new

    def _restat(self, e: _Entry) -> bool:
        try:
            sig = _sig(e)
        except OSError:
            sig = None
        if sig == e.sig and e.sig is not None:
            return False
        self._read(e)
        return True

    def _watched(self, d: str):
        """The entries a poll re-stats in an unchanged folder: files (saved in place), incomplete
        folders (being written) and the newest folder."""
        entries = self._listing[d].values()
        folders = [e for e in entries if e.is_dir and e.ckpt is not None]
        newest = max(folders, key=lambda e: _order(e.ckpt)) if folders else None
        for e in entries:
            if not e.is_dir or e is newest or e.ckpt is None or not e.ckpt.complete:
                yield e

    # -- one poll
    def poll(self, now: float) -> DiskState:
        changed = self._base is None
        for d in self.dirs:
            try:
                mtime = os.stat(d).st_mtime_ns
            except OSError:
                mtime = None
            if mtime != self._dir_mtime.get(d, -1):
                self._dir_mtime[d] = mtime
                self._relist(d)
                changed = True
            else:
                for e in list(self._watched(d)):
                    changed |= self._restat(e)
        if changed:
            self._account(now)
        free = total = None
        mount = ""
        for d in self.dirs:
            m = self._mounts.get(d)
            if m is None:
                m = self._mounts[d] = mount_point(d)
            try:
                u = disk_usage(d if self._dir_mtime.get(d) is not None else m)
            except OSError:
                continue
            if free is None or u.free < free:
                free, total, mount = u.free, u.total, m
        settled = sum(1 for t in self._present.values() if t <= now - SETTLE)
        return replace(self._base, free_bytes=free, total_bytes=total, mount=mount, settled=settled)

    def _account(self, now: float) -> None:
        cks = sorted((e.ckpt for d in self.dirs for e in self._listing[d].values() if e.ckpt is not None), key=_order)
        present = {_save_id(c): c for c in cks if c.complete}
        for sid, c in present.items():
            if sid not in self._present:
                self._present[sid] = now
                self.saves += 1
                self._history.append((c.mtime, c.bytes, c.step))
                self.first_save_at = c.mtime if self.first_save_at is None else min(self.first_save_at, c.mtime)
        for sid in [s for s in self._present if s not in present]:
            del self._present[sid]
            self.deleted += 1
        if self.deleted:
            self.peak = max(self.peak, len(present))
        hist = list(self._history)
        mtimes = sorted(h[0] for h in hist)
        gaps = [b - a for a, b in zip(mtimes, mtimes[1:]) if b > a]
        steps = sorted({h[2] for h in hist if h[2] is not None})
        step_gaps = [b - a for a, b in zip(steps, steps[1:])]
        rotating = bool(self.deleted) or self.keep_declared is not None
        keep = self.keep_declared or (max(self.peak, len(present)) if rotating else None)
        self._base = DiskState(
            dirs=self.dirs, checkpoints=tuple(cks),
            bytes_per_save=median(h[1] for h in hist) if hist else None,
            steps_per_save=median(step_gaps) if step_gaps else None,
            saves=self.saves, saves_per_hour=3600.0 / median(gaps) if gaps else None,
            kept_bytes=sum(c.bytes for c in cks), rotating=rotating, keep=keep, deleted=self.deleted,
            first_save_at=self.first_save_at)


def remaining_saves(state: DiskState, total_steps: Optional[int], step: int) -> Optional[float]:
    """The saves the run still makes: remaining steps / steps per save; None when unknown."""
    if not total_steps or not state.steps_per_save or state.steps_per_save <= 0:
        return None
    return max(0.0, (total_steps - step) / state.steps_per_save)


# ---------------------------------------------------------------------------------------------
# The rule
# ---------------------------------------------------------------------------------------------
def _limit_hint(layout: str, n: int) -> str:
    n = max(1, n)
    return {"hf": f"save_total_limit={n}", "lightning": f"ModelCheckpoint(save_top_k={n})",
            "template": "--keep 1"}.get(layout, f"keep only the last {n}")


def _hours(h: float) -> str:
    s = h * 3600
    return f"~{s:.0f}s" if s < 120 else f"~{s / 60:.0f} min" if s < 7200 else f"~{h:.1f} h"


def rule_disk(state: DiskState, th: Thresholds, remaining_saves: Optional[float], step: int) -> Optional[Anomaly]:
    """``disk`` when the next save would not fit in the free space with ``th.disk_margin``, or
    when the run's remaining saves would not: every one of them while the run keeps its saves
    (shown by ``th.disk_min_saves`` saves staying put), only up to the rotation's limit when it
    rotates (then it is the next save alone, once the limit is reached)."""
    bps, free = state.bytes_per_save, state.free_bytes
    if not bps or free is None:
        return None
    where = f" on {state.mount}" if state.mount else ""
    layout = state.checkpoints[-1].layout if state.checkpoints else "torch"
    margin = max(1.0, th.disk_margin)
    if state.rotating:
        keep = state.keep or 1
        fewer = f"keep fewer ({_limit_hint(layout, keep - 2)}), " if keep > 2 or (keep == 2 and layout == "template") else ""
        fix = (f"The rotation already keeps {keep} at once: {fewer}free space on {state.mount or 'that volume'}, "
               "or move the checkpoints to another volume")
    else:
        fits = int((free + state.kept_bytes) // (bps * margin))
        fix = (f"Delete or rotate old checkpoints ({_limit_hint(layout, 2 if fits >= 3 else 1)}), or move the "
               "checkpoints to another volume")
    if free < bps * margin:
        return anomaly("disk", f"free space = {size(free)} < next save {size(bps)} x {margin:g} margin{where}",
                       step, f"{fix}, before the next save fails")
    if remaining_saves is None or remaining_saves <= 1:
        return None
    if state.rotating:
        more = min(remaining_saves, (state.keep or 1) - state.complete)
        if more <= 1:
            return None
        what = f"{more:.0f} more saves x {size(bps)} until the rotation keeps {state.keep}"
    elif state.settled >= th.disk_min_saves:
        more = remaining_saves
        what = f"{more:.0f} remaining saves x {size(bps)} (every save kept)"
    else:
        return None
    need = bps * (more - 1 + margin)
    if free >= need:
        return None
    fill = int(free // bps)
    when = f" after {fill} more saves" + (f" ({_hours(fill / state.saves_per_hour)})" if state.saves_per_hour else "")
    return anomaly("disk", f"free space = {size(free)} < {what} = {size(need)} with the {margin:g} margin{where}",
                   step, f"{fix}, before the disk fills{when}")
