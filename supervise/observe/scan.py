"""What a scan of the metrics file learned, kept beside watchdog.json so that the next look
reads only what was appended since (``RUN_DIR/.scan.json``).

    scan = Scan(run_dir, metrics, thresholds, RECORD_RULES, num_labels_given)
    scan.resume(reader, rules)     # before the first read: '' when the saved fold was taken up
    ...                            # fold what was appended since (reader.records() -> rules.add)
    scan.keep(reader, rules, now)  # atomically, after the look

What is kept is the whole folded state, so a resumed fold is the fold of every record: the
reader's offset (a line boundary) and counters, and ``rules.RecordRules`` as it stands (the
current attempt's ``Run`` with its recent records and stall clock, each record rule's own
state, the first hits, the attempts); plus the last CPU reading of the run's process (check-in's
CPU %, measured between two looks instead of sleeping through a sample).

The file is input, not trusted. It is taken up only when all of these hold, else ignored (the
look scans the file as if it were the first, and says why in ``Scan.note``): it parses, its
``format`` is FORMAT and its ``kind`` this one; the code that folded it is this code (the
package version and a checksum of the rules' and the contract's sources), with the same rule
classes, record thresholds and --num-labels; its ``crc`` matches its state; the metrics file is
the one it read (same device and inode, no shorter than the offset, the same first 64 bytes
and the same 4 KiB before the offset: neither truncated nor replaced, nor rewritten in place);
and every restored attribute has the type a fresh fold gives it. Writes are atomic (a temporary
file, then a rename), so two looks at once leave one whole file or the other. Standard library
only: this is on the hot path.

A one-shot look (check-in) reads only the tail of a big file (``TailReader(window=WINDOW)``: the head, the
notable lines of the last WINDOW bytes, the tail; issue 35) and keeps what it folded with the
count of bytes it left unread (``reader.unseen``): the next check-in takes that up and says so;
a watchdog never does (``partial`` False: a NaN there would be lost), it reads every notable line
once and keeps a whole scan, which every later look takes up.
"""
from __future__ import annotations

import dataclasses
import json
import os
import zlib
from collections import deque
from pathlib import Path
from typing import Optional

from supervise import __version__
from supervise.contract import atomic_write_json, is_number, open_regular
from supervise.observe.records import RecordRules
from supervise.thresholds import Thresholds
from supervise.vocabulary import SCAN_STATE, Anomaly

FORMAT = 1
KIND = "supervising-training-runs scan"
HEAD = 64                 # bytes of the file's head compared
BEFORE = 4096             # bytes before the offset compared (crc32)
LIMIT = 4 << 20           # a larger scan file is not read
SAVE_EVERY = 5.0          # s: a watchdog keeps its scan at most this often (a one-shot look: each look)
CPU_SPAN = (0.5, 6 * 3600.0)  # s between two CPU readings for a CPU % between looks
WINDOW = 32 << 20          # bytes: what a one-shot look (check-in) skims before the tail, at most


class Foreign(ValueError):
    """The scan file is not one this code can take up (corrupt, another format or another fold)."""


# ---------------------------------------------------------------------------- values
def encode(v):
    """A folded value as JSON: every container tagged (D dict, L list, T tuple, Q deque, A
    Anomaly), so that decoding restores the types the rules rely on. TypeError on anything else."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, dict):
        if not all(isinstance(k, str) for k in v):
            raise TypeError("a dict key that is not a string")
        return {"D": {k: encode(x) for k, x in v.items()}}
    if isinstance(v, list):
        return {"L": [encode(x) for x in v]}
    if isinstance(v, tuple):
        return {"T": [encode(x) for x in v]}
    if isinstance(v, deque):
        return {"Q": [encode(x) for x in v], "n": v.maxlen}
    if isinstance(v, Anomaly):
        return {"A": [v.kind, v.step, v.message]}
    raise TypeError(f"cannot keep a {type(v).__name__}")


def decode(v, depth: int = 0):
    """``encode``'s inverse; Foreign on anything that ``encode`` does not write."""
    if depth > 40:
        raise Foreign("nested too deeply")
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, dict):
        if len(v) == 1 and isinstance(v.get("D"), dict):
            return {k: decode(x, depth + 1) for k, x in v["D"].items()}
        if len(v) == 1 and isinstance(v.get("L"), list):
            return [decode(x, depth + 1) for x in v["L"]]
        if len(v) == 1 and isinstance(v.get("T"), list):
            return tuple(decode(x, depth + 1) for x in v["T"])
        if len(v) == 2 and isinstance(v.get("Q"), list) and "n" in v and (
                v["n"] is None or (isinstance(v["n"], int) and not isinstance(v["n"], bool) and v["n"] >= 0)):
            return deque((decode(x, depth + 1) for x in v["Q"]), maxlen=v["n"])
        a = v.get("A")
        if len(v) == 1 and isinstance(a, list) and len(a) == 3 and isinstance(a[0], str) and \
                isinstance(a[1], int) and not isinstance(a[1], bool) and isinstance(a[2], str):
            return Anomaly(a[0], a[1], a[2])
    raise Foreign(f"not a kept value: {str(v)[:60]}")


def _attrs(obj, skip: tuple) -> dict:
    return {k: v for k, v in vars(obj).items() if k not in skip}


def _like(fresh, v) -> bool:
    """``v`` may stand where a fresh fold has ``fresh``: a number for a number, the same
    container type (a deque of the same length limit), anything kept for a None."""
    if fresh is None:
        return True
    if isinstance(fresh, bool):
        return isinstance(v, bool)
    if isinstance(fresh, (int, float)):
        return is_number(v)
    if isinstance(fresh, deque):
        return isinstance(v, deque) and v.maxlen == fresh.maxlen
    return type(v) is type(fresh)


def _restore(obj, saved, skip: tuple) -> None:
    fresh = _attrs(obj, skip)
    if not isinstance(saved, dict) or set(saved) != set(fresh):
        raise Foreign(f"the kept {type(obj).__name__} has other fields")
    values = {k: decode(x) for k, x in saved.items()}
    for k, v in values.items():
        if not _like(fresh[k], v):
            raise Foreign(f"{type(obj).__name__}.{k} is a {type(v).__name__}")
    for k, v in values.items():
        setattr(obj, k, v)


RUN_SKIP = ("th", "stall", "num_labels_given", "_memo", "_fixed")   # caches, rebuilt from the rest
RULE_SKIP = ("th", "run")


def fold_state(rules: RecordRules) -> dict:
    """The folded state of ``rules`` as JSON values (TypeError when something cannot be kept)."""
    run = rules.run
    return {
        "starts": rules.starts, "attempts": encode(rules.attempts), "hits": encode(rules.hits),
        "run": {k: encode(v) for k, v in _attrs(run, RUN_SKIP).items()},
        "stall": {k: encode(v) for k, v in _attrs(run.stall, ("th",)).items()},
        "rules": [[type(r).__name__, {k: encode(v) for k, v in _attrs(r, RULE_SKIP).items()}] for r in rules.rules]}


def restore_fold(rules: RecordRules, state) -> None:
    """Put a ``fold_state`` back into a fresh ``rules`` (built with the same classes and
    thresholds); Foreign, leaving ``rules`` unusable, when the state does not fit."""
    if not isinstance(state, dict):
        raise Foreign("no fold")
    names = [type(r).__name__ for r in rules.rules]
    kept = state.get("rules")
    if not isinstance(kept, list) or [r[0] if isinstance(r, list) and len(r) == 2 else None for r in kept] != names:
        raise Foreign("other record rules")
    starts, attempts, hits = state.get("starts"), decode(state.get("attempts")), decode(state.get("hits"))
    if not (isinstance(starts, int) and not isinstance(starts, bool) and starts >= 0):
        raise Foreign("starts is not a count")
    if not (isinstance(attempts, list) and all(isinstance(a, list) and len(a) == 2 and isinstance(a[0], dict)
                                               and (a[1] is None or is_number(a[1])) for a in attempts)):
        raise Foreign("attempts are not [start record, step]")
    if not (isinstance(hits, dict) and all(isinstance(a, Anomaly) and a.kind == k for k, a in hits.items())):
        raise Foreign("hits are not first hits")
    _restore(rules.run, state.get("run"), RUN_SKIP)
    run = rules.run
    if not (isinstance(run.start, dict) and all(isinstance(r, dict) for r in (*run.steps, *run.evals))
            and all(r is None or isinstance(r, dict) for r in (run.last_eval, run.best_eval, run.fatal))):
        raise Foreign("the kept records are not records")
    _restore(run.stall, state.get("stall"), ("th",))
    if not (run.stall.expect is None or isinstance(run.stall.expect, dict)):
        raise Foreign("the kept expect is not a record")
    for rule, (_, attrs) in zip(rules.rules, kept):
        _restore(rule, attrs, RULE_SKIP)
    rules.starts, rules.attempts, rules.hits = starts, attempts, hits


def _code() -> str:
    """Which code folded: the package version and a checksum of the rules' and contract's sources."""
    crc = 0
    from supervise import contract
    from supervise.observe import records
    for path in (records.__file__, contract.__file__, __file__):
        try:
            with open(path, "rb") as f:
                crc = zlib.crc32(f.read(), crc)
        except OSError:
            return __version__
    return f"{__version__}+{crc:08x}"


def folded_thresholds(th: Thresholds) -> dict:
    """The thresholds a fold depends on (those declared ``folded``), as JSON values."""
    folded = th.folded()
    return {k: v for k, v in dataclasses.asdict(th).items() if k in folded}


def _crc_before(f, offset: int) -> int:
    lo = max(0, offset - BEFORE)
    f.seek(lo)
    return zlib.crc32(f.read(offset - lo))


# ---------------------------------------------------------------------------- the file
class Scan:
    """The scan file of one run folder, for one fold (its rule classes, thresholds and
    --num-labels). ``note`` says what the last ``resume`` did: '' when nothing was kept, else
    'resumed at byte N' or 'ignored: <why>'."""

    def __init__(self, run_dir, metrics, thresholds: Thresholds, classes, num_labels_given: bool = False,
                 every: float = SAVE_EVERY, partial: bool = False):
        self.path = Path(run_dir) / SCAN_STATE
        self.metrics = str(metrics)
        self.fold = {"code": _code(), "rules": [c.__name__ for c in classes],
                     "thresholds": json.loads(json.dumps(folded_thresholds(thresholds))),
                     "num_labels_given": bool(num_labels_given)}
        self.every = every
        self.partial = partial              # a one-shot look: it may keep, and take up, a fold with unseen bytes
        self.note = ""
        self.cpu: Optional[dict] = None     # the last CPU reading kept: {pid, create_time, cpu_s, at}
        self.saved_at: Optional[float] = None
        self.saved_offset: Optional[int] = None
        self._cpu_changed = False
        self.error = ""

    def load(self) -> Optional[dict]:
        """The kept scan, checked against this fold and the metrics file as it is now; None
        (``note`` says why) when there is none or it cannot be taken up."""
        self.note = ""
        try:
            with open_regular(self.path) as f:
                data = f.read(LIMIT + 1)
        except FileNotFoundError:
            return None
        except OSError as e:
            self.note = f"ignored: {self.path.name} cannot be read ({e.strerror or e})"
            return None
        try:
            return self._check(data)
        except Foreign as e:
            self.note = f"ignored: {e}"
        except (ValueError, TypeError, KeyError, RecursionError, OverflowError) as e:
            self.note = f"ignored: {self.path.name} is not a scan ({type(e).__name__})"
        return None

    def _check(self, data: bytes) -> dict:
        if len(data) > LIMIT:
            raise Foreign(f"{self.path.name} is over {LIMIT >> 20} MiB")
        obj = json.loads(data)
        if not isinstance(obj, dict) or obj.get("kind") != KIND:
            raise Foreign(f"{self.path.name} is not a scan file")
        if obj.get("format") != FORMAT:
            raise Foreign(f"format {obj.get('format')!r}, this code reads {FORMAT}")
        if obj.get("fold") != self.fold:
            raise Foreign("another fold (other code, rules, thresholds or --num-labels)")
        state = obj.get("state")
        if zlib.crc32(json.dumps(state, separators=(",", ":")).encode()) != obj.get("crc"):
            raise Foreign("its checksum does not match (corrupt)")
        f_ = obj.get("file")
        reader = obj.get("reader")
        if not isinstance(f_, dict) or not isinstance(reader, dict):
            raise Foreign("no file identity")
        offset = reader.get("offset")
        if not (isinstance(offset, int) and not isinstance(offset, bool) and offset >= 0):
            raise Foreign("no offset")
        try:
            with open_regular(self.metrics) as f:
                st = os.fstat(f.fileno())
                if [st.st_dev, st.st_ino] != [f_.get("dev"), f_.get("ino")]:
                    raise Foreign(f"{Path(self.metrics).name} was replaced (another file)")
                if st.st_size < offset:
                    raise Foreign(f"{Path(self.metrics).name} was truncated ({st.st_size} < {offset} bytes)")
                head = f_.get("head")
                if not isinstance(head, str) or f.read(HEAD).hex()[:len(head)] != head:
                    raise Foreign(f"{Path(self.metrics).name}'s first bytes changed")
                if _crc_before(f, offset) != f_.get("before"):
                    raise Foreign(f"{Path(self.metrics).name} changed before the kept offset")
        except OSError as e:
            raise Foreign(f"{Path(self.metrics).name} cannot be read ({e.strerror or e})") from None
        obj["head"] = bytes.fromhex(head)
        return obj

    def resume(self, reader, rules: RecordRules) -> str:
        """Take up the kept scan: the reader goes on from its offset, the rules from its fold.
        '' when it was taken up; else why not (``rules`` and ``reader`` as they were)."""
        obj = self.load()
        if obj is None:
            return self.note or "no scan kept"
        fresh = RecordRules(rules.th, rules.classes, rules.num_labels_given)
        try:
            restore_fold(fresh, obj["state"])
            r = obj["reader"]
            counts = [r.get(k) for k in ("lines", "bad_lines", "resets")]
            if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts):
                raise Foreign("the reader's counts are not counts")
            if not isinstance(r.get("last_bad", ""), str) or not isinstance(r.get("dropping", False), bool):
                raise Foreign("the reader's state is not a reader's")
            unseen = r.get("unseen", 0)
            if not (isinstance(unseen, int) and not isinstance(unseen, bool) and unseen >= 0):
                raise Foreign("the reader's unseen bytes are not a count")
            if unseen and not self.partial:
                raise Foreign(f"a one-shot look kept it without reading {unseen} bytes of the middle (a NaN there "
                              "would be lost)")
        except Foreign as e:
            self.note = f"ignored: {e}"
            return self.note
        rules.__dict__.update(fresh.__dict__)
        reader.resume(offset=r["offset"], ident=(obj["file"]["dev"], obj["file"]["ino"]), head=obj["head"],
                      lines=counts[0], bad_lines=counts[1], resets=counts[2], last_bad=r.get("last_bad", ""),
                      dropping=r.get("dropping", False))
        reader.unseen = unseen
        cpu = obj.get("cpu")
        self.cpu = cpu if isinstance(cpu, dict) and all(is_number(cpu.get(k)) for k in (
            "pid", "create_time", "cpu_s", "at")) else None
        self.saved_offset = r["offset"]
        self.note = f"resumed at byte {r['offset']}"
        return ""

    def keep(self, reader, rules: RecordRules, now: float, force: bool = True) -> bool:
        """Write what the reader and rules hold now (atomically); True when written. Nothing is
        kept when the reader left bytes unlooked-at (a one-shot look's bounded read: a NaN there
        is unseen) unless ``partial`` (the count is kept: a watchdog never takes such a scan up,
        a one-shot look takes it up with its count), nor when nothing changed, nor (``force``
        False) within ``every`` seconds of the last write. A folder that cannot be written is
        said once in ``error``."""
        if (reader.unseen and not self.partial) or reader.error or reader._ident is None:
            return False
        offset = reader.offset - len(reader._buf)
        if not force and self.saved_at is not None and now - self.saved_at < self.every:
            return False
        if offset == self.saved_offset and not self._cpu_changed:
            return False
        try:
            with open_regular(self.metrics) as f:
                st = os.fstat(f.fileno())
                if (st.st_dev, st.st_ino) != tuple(reader._ident) or st.st_size < offset:
                    return False  # replaced or truncated since the read: the next look starts over
                head = reader._head[:HEAD] if reader._head else f.read(HEAD)
                before = _crc_before(f, offset)
        except OSError:
            return False
        try:
            state = fold_state(rules)
            text = json.dumps(state, separators=(",", ":"))
        except (TypeError, ValueError):
            return False   # something in the fold cannot be kept: the next look scans again
        obj = {"kind": KIND, "format": FORMAT, "fold": self.fold, "crc": zlib.crc32(text.encode()),
               "file": {"dev": st.st_dev, "ino": st.st_ino, "head": head.hex(), "before": before},
               "reader": {"offset": offset, "dropping": reader._dropping, "lines": reader.lines,
                          "bad_lines": reader.bad_lines, "resets": reader.resets, "last_bad": reader.last_bad,
                          "unseen": reader.unseen},
               "cpu": self.cpu, "state": state}
        try:
            atomic_write_json(self.path, obj, indent=None)
        except (OSError, ValueError) as e:
            self.error = str(getattr(e, "strerror", None) or e)
            return False
        self.saved_at, self.saved_offset, self._cpu_changed = now, offset, False
        self.error = ""
        return True

    def cpu_percent(self, pid: int, create_time: Optional[float], cpu_s: Optional[float], now: float) -> Optional[float]:
        """CPU % of one core of ``pid`` since the reading kept by the last look (same process,
        CPU_SPAN apart), else over its lifetime; None without a reading. The reading is kept."""
        if cpu_s is None:
            return None
        prev, pct = self.cpu, None
        if prev and prev["pid"] == pid and create_time is not None and abs(prev["create_time"] - create_time) < 1.5 \
                and CPU_SPAN[0] <= now - prev["at"] <= CPU_SPAN[1] and cpu_s >= prev["cpu_s"]:
            pct = 100.0 * (cpu_s - prev["cpu_s"]) / (now - prev["at"])
        elif create_time is not None and now - create_time > 0:
            pct = 100.0 * cpu_s / (now - create_time)
        if prev is None or now - prev["at"] >= CPU_SPAN[0] or prev["pid"] != pid:
            self.cpu = {"pid": pid, "create_time": create_time or 0.0, "cpu_s": cpu_s, "at": now}
            self._cpu_changed = True
        return pct
