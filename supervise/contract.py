"""The telemetry contract: record shapes, a validator and a tail reader (writers: telemetry.py).

One JSON object per line in ``RUN_DIR/metrics.jsonl``:

- start (optional, first line): ``{"event": "start", "t": 0, "pid", "total_steps",
  "num_labels", "world_size", "batch_size"}``
- step (every ~10 steps):       ``{"step", "t", "loss", "lr", "grad_norm", "sps"}`` (lr, grad_norm
  and sps optional: a writer leaves out what it does not measure, never writes null for it)
- eval (every ~250 steps):      ``{"step", "eval_auroc", "eval_acc"}`` (+ ``"eval_loss"``)
- fatal (just before raising):  ``{"step", "t", "FATAL": "<reason>"}``

Readers accept what real files hold: ``NaN``/``Infinity`` tokens, ``null``, a torn last line
still being written, stray non-JSON lines. Standard library only: this is on the hot path.
"""
from __future__ import annotations

import json
import json.decoder
import json.scanner
import math
import mmap
import os
import stat
import sys
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

NUMBER = "number"
INTEGER = "integer"
TEXT = "string"

# The record shapes: field -> type. Extra fields are allowed everywhere.
START_FIELDS = {"event": TEXT, "t": NUMBER, "pid": INTEGER, "total_steps": INTEGER,
                "num_labels": INTEGER, "world_size": INTEGER, "batch_size": INTEGER,
                # v0.2, all optional
                "run_id": TEXT, "attempt": INTEGER, "task": TEXT, "vocab_size": INTEGER,
                "rank": INTEGER, "cwd": TEXT, "time": NUMBER,
                # v0.3, optional: how the run continues and was launched (lists and objects are
                # checked by sanitize): resume, resume_env, checkpoint_dir, flags, launcher, slurm
                "slurm_job_id": TEXT,
                # v0.4, optional: which processes may probe this pid (the writer's PID namespace, its boot)
                "pid_ns": INTEGER, "boot_id": TEXT}
START_REQUIRED = ("event", "t")
STEP_FIELDS = {"step": INTEGER, "t": NUMBER, "loss": NUMBER, "lr": NUMBER,
               "grad_norm": NUMBER, "sps": NUMBER}
STEP_OPTIONAL = ("lr", "grad_norm", "sps")   # left out when not measured
EVAL_FIELDS = {"step": INTEGER}           # + any eval_* metric, each a number or null
FATAL_FIELDS = {"step": INTEGER, "t": NUMBER, "FATAL": TEXT}
EXPECT_FIELDS = {"event": TEXT, "seconds": NUMBER}
SHAPES = {"start": START_FIELDS, "step": STEP_FIELDS, "eval": EVAL_FIELDS, "fatal": FATAL_FIELDS,
          "expect": EXPECT_FIELDS}
# Values that the rules exist to catch: a non-finite or null value here is valid in shape.
MAY_BE_NONFINITE = {"loss", "grad_norm", "lr", "sps"}
# Integer fields of a start record that must be positive to mean anything.
START_COUNTS = ("pid", "total_steps", "num_labels", "world_size", "batch_size", "attempt",
                "vocab_size", "pid_ns")


def is_eval(rec: dict) -> bool:
    """An eval record: any record with at least one ``eval_*`` metric (v0.2: any task)."""
    try:  # this runs twice for every record the watchdog folds: most have no "eval_" at all
        if "eval_" not in "\0".join(rec):
            return False
    except TypeError:   # a key that is not a string
        pass
    for k in rec:
        if isinstance(k, str) and k.startswith("eval_"):
            return True
    return False


def kind_of(rec: dict) -> str | None:
    """Which record this is: 'start', 'expect', 'fatal', 'eval', 'step', or None."""
    event = rec.get("event")
    if event == "start":
        return "start"
    if event == "expect":
        return "expect"
    if "FATAL" in rec:
        return "fatal"
    if is_eval(rec):
        return "eval"
    if "loss" in rec:
        return "step"
    return None


def is_number(v) -> bool:
    t = type(v)
    return t is float or t is int or (isinstance(v, (int, float)) and not isinstance(v, bool))


def is_finite(v) -> bool:
    if type(v) is float:
        return v - v == 0.0   # NaN - NaN and inf - inf are NaN: math.isfinite without the call
    return is_number(v) and math.isfinite(v)


def is_count(v) -> bool:
    """A whole number >= 0 (a pid, a rank, a step), bool never counting as one."""
    return is_finite(v) and v >= 0 and float(v).is_integer()


def _type_ok(value, want: str, name: str) -> bool:
    if want == TEXT:
        return isinstance(value, str)
    if want == INTEGER:
        return is_number(value) and float(value).is_integer()
    if value is None:
        return name in MAY_BE_NONFINITE
    return is_number(value)


def validate_record(rec, require: tuple[str, ...] = ()) -> list[str]:
    """Problems with one record, each naming the field; [] when it is valid.

    ``require`` names step-record fields that must be present and not null here (the
    templates' tests ask for ``grad_norm`` and ``sps``)."""
    if not isinstance(rec, dict):
        return [f"not a JSON object but {type(rec).__name__}"]
    kind = kind_of(rec)
    if kind is None:
        return ["not a start, step, eval or FATAL record (keys: %s)" % ", ".join(sorted(rec)[:8])]
    fields = dict(SHAPES[kind])
    if kind == "eval":
        fields.update({k: NUMBER for k in rec if isinstance(k, str) and k.startswith("eval_")})
    problems = []
    for name, want in fields.items():
        optional = ((kind == "start" and name not in START_REQUIRED) or (kind == "eval" and name != "step")
                    or (kind == "step" and name in STEP_OPTIONAL))
        if name not in rec:
            if not optional:
                problems.append(f"{kind} record lacks field '{name}'")
        elif not _type_ok(rec[name], want, name) and not ((kind == "eval" or optional) and rec[name] is None):
            problems.append(f"{kind} field '{name}' = {rec[name]!r} is not a {want}")
    for name in require if kind == "step" else ():
        if rec.get(name) is None:
            problems.append(f"step record lacks field '{name}'" if name not in rec else f"step field '{name}' is null")
    return problems


_scan_once = json.scanner.make_scanner(json.JSONDecoder())
_intern = sys.intern
_WHITESPACE = json.decoder.WHITESPACE


def parse_line(raw: bytes | str):
    """One line -> dict, or raise ValueError saying why. NaN/Infinity tokens are accepted.
    What ``json.loads`` accepts, through json's C scanner directly (a third of the cost per
    line); anything it does not take at once goes through ``json.loads`` for its error."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    try:
        try:
            rec, end = _scan_once(text, 0)
            if end != len(text) and _WHITESPACE.match(text, end).end() != len(text):
                raise StopIteration(end)
        except StopIteration:
            rec = json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    if not isinstance(rec, dict):
        raise ValueError(f"a JSON {type(rec).__name__}, not an object")
    return rec


def _float(v):
    """A JSON value as a float (NaN/Infinity kept: the rules exist to see them), None for null,
    KeyError for anything that is not a number (a string that float() reads counts)."""
    if type(v) is float:
        return v
    if v is None:
        return None
    if isinstance(v, bool):
        raise KeyError(v)
    if isinstance(v, (int, float)):
        try:
            return float(v)
        except OverflowError:  # an integer of 400 digits
            return math.inf if v > 0 else -math.inf
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            raise KeyError(v) from None
    raise KeyError(v)


def _count(v):
    """A finite, non-negative whole number -> int; anything else -> None."""
    if type(v) is int and 0 <= v < 1 << 53:
        return v
    try:
        f = _float(v)
    except KeyError:
        return None
    return int(f) if f is not None and math.isfinite(f) and f >= 0 else None


def sanitize(rec: dict, kind: str | None = "?") -> dict | None:
    """A record with every field the tools read coerced to its type, or None when the record is
    unusable (a step or eval without a usable step, a non-numeric loss, an expect without
    seconds). Every value in a metrics file is untrusted: nothing downstream type-checks again.
    Numbers are floats (NaN/Infinity/None kept where the rules must see them), steps and counts
    ints >= 0, FATAL a string, and unknown fields pass through untouched (a new dict: ``rec`` is
    left as it was). ``kind``: ``kind_of(rec)`` when the caller has it (sanitizing keeps it)."""
    if kind == "?":
        kind = kind_of(rec)
    # the keys interned: json makes new key strings per line, and every rule's rec.get("loss")
    # then compares strings instead of pointers (the fold costs a sixth more)
    out = {_intern(k) if type(k) is str else k: v for k, v in rec.items()}
    if "t" in out:
        t = out["t"]
        if type(t) is not float or t - t != 0.0:   # a finite float stays as it is
            try:
                t = _float(t)
            except KeyError:
                t = None
            out["t"] = t if t is not None and math.isfinite(t) else None
    for name in ("time", "sps") if kind is None else ():   # a rank heartbeat: wall time, the rank's sps
        if name in out:
            try:
                v = _float(out[name])
            except KeyError:
                v = None
            out[name] = v if v is not None and math.isfinite(v) else None
    if "step" in out or kind in ("step", "eval"):
        out["step"] = _count(out.get("step"))
        if out["step"] is None and kind in ("step", "eval"):
            return None
    if kind == "start":
        for name in START_COUNTS:
            if name in out:
                n = _count(out[name])
                out[name] = n if n else None
        for name in ("run_id", "task", "cwd", "boot_id"):
            if name in out and not isinstance(out[name], str):
                out[name] = None if out[name] is None else str(out[name])
        for name in ("argv", "resume", "launcher"):
            if name in out and not (isinstance(out[name], list) and all(isinstance(a, str) for a in out[name])):
                out[name] = None
        if "checkpoint_dir" in out and not isinstance(out["checkpoint_dir"], str) and not (
                isinstance(out["checkpoint_dir"], list) and all(isinstance(a, str) for a in out["checkpoint_dir"])):
            out["checkpoint_dir"] = None
        for name in ("resume_env", "slurm"):
            if name in out and not (isinstance(out[name], dict) and all(
                    isinstance(k, str) and isinstance(v, str) for k, v in out[name].items())):
                out[name] = None
        if "flags" in out:
            flags = out["flags"] if isinstance(out["flags"], dict) else {}
            out["flags"] = {k: v for k, v in flags.items() if isinstance(k, str) and is_finite(v)} or None
        if "slurm_job_id" in out and out["slurm_job_id"] is not None:
            out["slurm_job_id"] = str(out["slurm_job_id"]) if isinstance(out["slurm_job_id"], (str, int)) else None
        if "rank" in out:
            out["rank"] = _count(out["rank"])
        if "time" in out:  # wall clock, s: kept to the fraction (a relaunch is told apart by its birth)
            try:
                v = _float(out["time"])
            except KeyError:
                v = None
            out["time"] = v if v is not None and math.isfinite(v) and v >= 0 else None
    elif kind == "expect":
        try:
            seconds = _float(out.get("seconds"))
        except KeyError:
            return None
        if seconds is None or not math.isfinite(seconds) or seconds < 0:
            return None
        out["seconds"] = seconds
    elif kind == "fatal":
        out["FATAL"] = str(out["FATAL"])
    elif kind == "step":
        try:
            for name in ("loss", "grad_norm", "lr", "sps"):
                if name in out and type(out[name]) is not float:
                    out[name] = _float(out[name])
        except KeyError:
            return None
    elif kind == "eval":
        for name in list(out):
            if name.startswith("eval_"):
                try:
                    out[name] = _float(out[name])
                except KeyError:
                    out[name] = None
    return out


class NotRegular(OSError):
    """The path exists but is not a regular file (a FIFO, a device, a directory)."""


def open_regular(path: str | os.PathLike):
    """Open a regular file for binary reading without ever blocking: a FIFO or a device (a
    symlink to /dev/zero) raises ``NotRegular`` instead of hanging the reader."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            what = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode)
                    else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a file")
            raise NotRegular(f"{os.fspath(path)} is {what}, not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def why_unreadable(path: str | os.PathLike) -> str:
    """'' when ``path`` is absent or a readable regular file, else one line saying why not."""
    try:
        open_regular(path).close()
    except FileNotFoundError:
        return ""
    except NotRegular as e:
        return str(e)
    except OSError as e:
        return f"{os.fspath(path)} cannot be read ({e.strerror or e})"
    return ""


def why_unwritable(folder: str | os.PathLike) -> str:
    """'' when ``folder`` exists (made if missing) and a file can be created in it, else the
    OS's reason (one short phrase)."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        return str(e.strerror or e)
    return ""


def validate_file(path: str | os.PathLike, require: tuple[str, ...] = ()) -> list[str]:
    """Every problem in a metrics file as 'line N: ...' (a torn last line included)."""
    problems = []
    with open_regular(path) as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            if not raw.endswith(b"\n"):
                problems.append(f"line {n}: torn (no newline at the end of the file)")
                break
            try:
                rec = parse_line(raw)
            except ValueError as e:
                problems.append(f"line {n}: not JSON ({str(e)[:80]})")
                continue
            problems += [f"line {n}: {p}" for p in validate_record(rec, require)]
    return problems


def dumps(rec: dict) -> str:
    """One record as one line; non-finite floats become NaN/Infinity tokens (what json writes)."""
    return json.dumps(rec, separators=(",", ":")) + "\n"


def atomic_write_json(path: str | os.PathLike, obj, indent: int | None = 1) -> None:
    """Write JSON to a temporary file in the same folder, then rename it over ``path``
    (``indent=None``: one compact line, through json's C encoder: the watchdog's every poll)."""
    atomic_write_text(path, json.dumps(obj, indent=indent, default=str) + "\n")  # the C encoder when indent is None


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to a temporary file in the same folder, then rename it over ``path``."""
    path = Path(path)
    fd, tmp = _temp_beside(path)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


_SEQ = itertools.count()


def _temp_beside(path: Path) -> tuple:
    """(fd, name) of a new file ``.<name>.<pid>-<n>.tmp`` beside ``path``, mode 0600, made with
    O_EXCL (what tempfile.mkstemp does, without importing tempfile: random, shutil, bz2, lzma)."""
    for _ in range(1000):
        tmp = path.parent / f".{path.name}.{os.getpid()}-{next(_SEQ)}.tmp"
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600), str(tmp)
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {path}")


def read_json(path: str | os.PathLike, limit: int = 1 << 20):
    """A small JSON file -> object, or None when it is missing, too big or unreadable."""
    try:
        with open_regular(path) as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            return None
        return json.loads(data)
    except (OSError, ValueError, RecursionError):
        return None


# Lines worth parsing in the part of a long file that a re-attaching reader skips: whatever
# can hold a first hit (non-finite values, FATAL, evals, start/expect events). Searched with
# bytes.find (memmem speed), not a regex alternation.
_NOTABLE = (b"NaN", b"Infinity", b"null", b"FATAL", b'"eval_', b'"event"')


def _token_lines(data: bytes) -> list:
    """(start, end) of every line in ``data`` holding a notable token, token by token."""
    hits = set()
    for token in _NOTABLE:
        i = data.find(token)
        while i >= 0:
            lo = data.rfind(b"\n", 0, i) + 1
            hi = data.find(b"\n", i)
            hi = len(data) if hi < 0 else hi + 1
            hits.add((lo, hi))
            i = data.find(token, hi)
    return sorted(hits)


# One byte of each notable token (N of NaN, I of Infinity, the u of null, F of FATAL, the v of
# eval/event): a line without any of them holds no token. Each is searched with bytes.find of one
# byte (memchr), so a file with an eval every 25,000 lines costs five fast passes, not six
# substring searches of every chunk that holds one eval (issue 35).
_MARKS = (b"N", b"I", b"u", b"F", b"v")
_DENSE = 1024              # hits of one mark in a chunk past which the token search is cheaper


def _notable_lines(data: bytes) -> list:
    """(start, end) of every line in ``data`` holding a notable token, in file order."""
    hits = set()
    for mark in _MARKS:
        i, n = data.find(mark), 0
        while i >= 0:
            n += 1
            if n > _DENSE:   # the mark is in most lines (a key with a u): token by token
                return _token_lines(data)
            lo = data.rfind(b"\n", 0, i) + 1
            hi = data.find(b"\n", i)
            hi = len(data) if hi < 0 else hi + 1
            if any(token in data[lo:hi] for token in _NOTABLE):
                hits.add((lo, hi))
            i = data.find(mark, hi)
    return sorted(hits)


@dataclass
class TailReader:
    """Reads only what was appended to a file since the last call.

    Keeps its byte offset, buffers a torn last line until its newline, counts non-JSON and
    unusable lines and skips them (each record comes out through ``sanitize``), and starts over
    when the file is truncated or replaced (a new inode, a shorter size, or different first
    bytes). A file that is not a regular file or cannot be read sets ``error`` and yields
    nothing; reading never blocks.

    Re-attach: the first read of a file larger than ``catchup`` bytes parses the current run's
    head (from its last start record: the baseline), every notable line of the middle (NaN,
    null, FATAL, evals, events: a first hit is never skipped) and the last ``tail`` bytes.

    Resume (``resume()``, scan.py's kept scan): the reader goes on from a saved offset; when
    more than ``tail`` bytes were appended since, the gap is read like the re-attach's middle
    (its notable lines) and the last ``tail`` bytes in full. ``unseen`` counts bytes that were
    not even skimmed for notable lines (``notable=False``, ``window``, ``max_append``).

    Bounded (``window``, a one-shot look: check-in, issue 35): the start record is searched in the
    last ``window`` + ``tail`` bytes only (else the head is the file's), and only the last
    ``window`` bytes before the tail are skimmed; what is passed over is counted in ``unseen``
    (with a kept scan's) and ``unseen_bytes`` (this reader's)."""

    path: str
    chunk: int = 4 << 20
    max_line: int = 1 << 20
    catchup: int = 8 << 20
    head: int = 64 << 10
    tail: int = 256 << 10
    notable: bool = True      # re-attach: parse the middle's notable lines (False: head and tail only)
    max_append: int = 0       # > 0: of more bytes appended since the last read, read only the last this many
    window: int | None = None  # a bounded catch-up: skim at most this many bytes before the tail
    offset: int = 0
    lines: int = 0
    bad_lines: int = 0
    resets: int = 0
    last_bad: str = ""
    bytes_read: int = 0
    skipped_bytes: int = 0
    unseen: int = 0
    unseen_bytes: int = 0     # bytes this reader passed over unread (``unseen`` adds a kept scan's)
    error: str = ""
    kind: str | None = None   # kind_of the record yielded last (the fold need not ask again)
    _resumed: bool = False
    _buf: bytes = b""
    _ident: tuple | None = None
    _head: bytes = b""
    _dropping: bool = field(default=False, repr=False)

    @property
    def torn(self) -> bool:
        """True while a partial last line is buffered."""
        return bool(self._buf)

    def _changed(self, f, st) -> bool:
        if self._ident is None:
            return False
        if (st.st_dev, st.st_ino) != self._ident or st.st_size < self.offset:
            return True
        if self._head:
            f.seek(0)
            return f.read(len(self._head)) != self._head
        return False

    def _reset(self) -> None:
        self.offset, self._buf, self._head, self._dropping, self._resumed = 0, b"", b"", False, False
        self.resets += 1

    def resume(self, offset: int, ident: tuple, head: bytes, lines: int = 0, bad_lines: int = 0,
               resets: int = 0, last_bad: str = "", dropping: bool = False) -> None:
        """Go on from ``offset`` (a line boundary) of the file ``ident`` (st_dev, st_ino) whose
        first bytes are ``head``, as a reader that had read up to there (scan.Scan.resume)."""
        self.offset, self._ident, self._head, self._buf, self._dropping = offset, tuple(ident), head, b"", dropping
        self.lines, self.bad_lines, self.resets, self.last_bad = lines, bad_lines, resets, last_bad
        self._resumed = True

    def records(self) -> Iterator[dict]:
        """Yield each complete record appended since the last call, in file order."""
        try:
            f = open_regular(self.path)
        except FileNotFoundError:
            self.error = ""
            return
        except OSError as e:
            self.error = str(e) if isinstance(e, NotRegular) else f"{self.path} cannot be read ({e.strerror or e})"
            return
        self.error = ""
        with f:
            st = os.fstat(f.fileno())
            if self._changed(f, st):
                self._reset()
            self._ident = (st.st_dev, st.st_ino)
            end = st.st_size
            if self.offset == 0 and end > self.catchup:
                f.seek(0)
                self._head = f.read(64)
                yield from self._catch_up(f, end)
            elif self._resumed and end - self.offset > self.tail:
                yield from self._catch_up(f, end, begin=self.offset)
            self._resumed = False
            if self.max_append and end - self.offset > self.max_append:
                self.unseen += end - self.max_append - self.offset
                self._skip_to(f, end - self.max_append)
            f.seek(self.offset)
            while self.offset < end:
                data = f.read(min(self.chunk, end - self.offset))
                if not data:
                    break
                self.bytes_read += len(data)
                if not self._head:
                    self._head = data[:64]
                self.offset += len(data)
                yield from self._split(data)

    def _skip_to(self, f, pos: int) -> None:
        """Go on from the first line boundary at or after ``pos``; what lies before is skipped."""
        f.seek(pos)
        nl = f.read(self.max_line).find(b"\n")
        new = pos + nl + 1 if nl >= 0 else pos
        self.skipped_bytes += new - self.offset
        self.offset, self._buf, self._dropping = new, b"", False

    def _last_start(self, f, end: int) -> int:
        """Offset of the line holding the last start record, 0 when there is none (bounded: in the
        last ``window`` + ``tail`` bytes). A backward search over a memory map: no copy of the
        file, page-cache speed."""
        lo = max(0, end - self.window - self.tail) if self.window is not None else 0
        try:
            data = mmap.mmap(f.fileno(), end, access=mmap.ACCESS_READ)
        except (OSError, ValueError):
            return 0
        with data:
            i = end
            while True:
                i = data.rfind(b'"start"', lo, i)
                if i < 0:
                    return 0
                line_start = data.rfind(b"\n", 0, i) + 1
                line_end = data.find(b"\n", i)
                line_end = end if line_end < 0 else line_end
                if line_end - line_start > self.max_line:
                    continue
                try:
                    if kind_of(parse_line(data[line_start:line_end])) == "start":
                        return line_start
                except ValueError:
                    pass

    def _catch_up(self, f, end: int, begin: int | None = None) -> Iterator[dict]:
        """The re-attach read (``begin`` None: from the last start record, its head in full) or
        a resumed one (from ``begin``, a line boundary the fold reached: no head)."""
        resumed = begin is not None
        if begin is None:
            begin = self._last_start(f, end)
        tail_from = max(begin, end - self.tail)
        head_to = min(tail_from, begin + self.head) if not resumed else begin
        f.seek(begin)
        data = f.read(head_to - begin)
        cut = data.rfind(b"\n") + 1
        self.bytes_read += cut
        yield from self._split(data[:cut])
        pos = begin + cut
        if not self.notable:  # head and tail only, from a line boundary
            self.offset = self._pass_over(f, pos, tail_from) if tail_from > pos else pos
            return
        if self.window is not None and tail_from - self.window > pos:
            pos = self._pass_over(f, pos, tail_from - self.window)
        while pos < tail_from:  # the middle: only the notable lines
            f.seek(pos)
            data = f.read(min(self.chunk, tail_from - pos))
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                break
            data = data[:cut]
            for lo, hi in _notable_lines(data):
                yield from self._split(data[lo:hi])
            self.bytes_read += cut
            self.skipped_bytes += cut
            pos += cut
        self.offset = pos  # a line boundary: records() reads the tail from here, every line

    def _pass_over(self, f, pos: int, to: int) -> int:
        """Leave the bytes from ``pos`` to the first line boundary at or after ``to`` unread."""
        f.seek(to - 1)
        nl = f.read(self.max_line + 1).find(b"\n")
        new = to - 1 + nl + 1 if nl >= 0 else to
        self.skipped_bytes += new - pos
        self.unseen += new - pos
        self.unseen_bytes += new - pos
        return new

    def _split(self, data: bytes) -> Iterator[dict]:
        data = self._buf + data
        lines = data.split(b"\n")
        self._buf = lines.pop()
        if len(self._buf) > self.max_line:  # a "line" with no end: garbage, bound the memory
            self._buf, self._dropping = b"", True
            self._bad(b"<line longer than %d bytes>" % self.max_line)
        for raw in lines:
            if self._dropping:  # the tail of an over-long line
                self._dropping = False
                continue
            if not raw or raw.isspace():   # not raw.strip(), without a copy per line
                continue
            self.lines += 1
            try:
                rec = parse_line(raw)
                kind = self.kind = kind_of(rec)
                rec = sanitize(rec, kind)
            except ValueError:
                rec = None
            if rec is None:
                self._bad(raw)
            else:
                yield rec

    def _bad(self, raw: bytes) -> None:
        self.bad_lines += 1
        self.last_bad = raw[:120].decode("utf-8", "replace")


def read_run(path: str | os.PathLike) -> tuple[dict, list, list]:
    """(start record or {}, step records, eval records) of the current run (the records after
    the last start record) in a whole metrics file, streamed and sanitized. For tools that need
    the full history (smoke, plot); the hot paths read tails instead."""
    start, steps, evals = {}, [], []
    for rec in TailReader(str(path), catchup=1 << 62).records():
        k = kind_of(rec)
        if k == "step":
            steps.append(rec)
        elif k == "eval":
            evals.append(rec)
        elif k == "start":
            start, steps, evals = rec, [], []
    return start, steps, evals


def tail_lines(path: str | os.PathLike, n: int, max_bytes: int = 1 << 20) -> list[bytes]:
    """The last ``n`` complete lines of a file, reading at most ``max_bytes`` from its end."""
    try:
        with open_regular(path) as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            start = max(0, size - max_bytes)
            f.seek(start)
            data = f.read(size - start)
    except OSError:
        return []
    lines = data.split(b"\n")
    if start > 0:
        lines = lines[1:]  # the first one is cut
    if lines and lines[-1] == b"":
        lines.pop()
    return lines[-n:] if n > 0 else []
