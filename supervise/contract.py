"""The telemetry contract: record shapes, a writer, a validator and a tail reader.

One JSON object per line in ``RUN_DIR/metrics.jsonl``:

- start (optional, first line): ``{"event": "start", "t": 0, "pid", "total_steps",
  "num_labels", "world_size", "batch_size"}``
- step (every ~10 steps):       ``{"step", "t", "loss", "lr", "grad_norm", "sps"}``
- eval (every ~250 steps):      ``{"step", "eval_auroc", "eval_acc"}`` (+ ``"eval_loss"``)
- fatal (just before raising):  ``{"step", "t", "FATAL": "<reason>"}``

Readers accept what real files hold: ``NaN``/``Infinity`` tokens, ``null``, a torn last line
still being written, stray non-JSON lines. Standard library only: this is on the hot path.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

METRICS = "metrics.jsonl"
SENTINEL = "final_val_metrics.json"
WATCHDOG_STATE = "watchdog.json"
LOG = "train.log"

NUMBER = "number"
INTEGER = "integer"
TEXT = "string"

# The record shapes: field -> type. Extra fields are allowed everywhere.
START_FIELDS = {"event": TEXT, "t": NUMBER, "pid": INTEGER, "total_steps": INTEGER,
                "num_labels": INTEGER, "world_size": INTEGER, "batch_size": INTEGER}
STEP_FIELDS = {"step": INTEGER, "t": NUMBER, "loss": NUMBER, "lr": NUMBER,
               "grad_norm": NUMBER, "sps": NUMBER}
EVAL_FIELDS = {"step": INTEGER, "eval_auroc": NUMBER, "eval_acc": NUMBER}
EVAL_OPTIONAL = {"eval_loss": NUMBER}
FATAL_FIELDS = {"step": INTEGER, "t": NUMBER, "FATAL": TEXT}
SHAPES = {"start": START_FIELDS, "step": STEP_FIELDS, "eval": EVAL_FIELDS, "fatal": FATAL_FIELDS}
# Values that the rules exist to catch: a non-finite or null value here is valid in shape.
MAY_BE_NONFINITE = {"loss", "grad_norm", "eval_loss", "eval_auroc", "eval_acc", "lr", "sps"}


def kind_of(rec: dict) -> str | None:
    """Which record this is: 'start', 'fatal', 'eval', 'step', or None."""
    if rec.get("event") == "start":
        return "start"
    if "FATAL" in rec:
        return "fatal"
    if "eval_auroc" in rec:
        return "eval"
    if "loss" in rec:
        return "step"
    return None


def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def is_finite(v) -> bool:
    return is_number(v) and math.isfinite(v)


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

    ``require`` names step-record fields that must be present and finite-typed here (smoke
    asks for ``grad_norm`` and ``sps``)."""
    if not isinstance(rec, dict):
        return [f"not a JSON object but {type(rec).__name__}"]
    kind = kind_of(rec)
    if kind is None:
        return ["not a start, step, eval or FATAL record (keys: %s)" % ", ".join(sorted(rec)[:8])]
    fields = dict(SHAPES[kind])
    if kind == "eval":
        fields.update({k: v for k, v in EVAL_OPTIONAL.items() if k in rec})
    problems = []
    for name, want in fields.items():
        if name not in rec:
            if kind != "start" or name in ("event", "t"):
                problems.append(f"{kind} record lacks field '{name}'")
        elif not _type_ok(rec[name], want, name):
            problems.append(f"{kind} field '{name}' = {rec[name]!r} is not a {want}")
    for name in require if kind == "step" else ():
        if name in rec and rec[name] is None:
            problems.append(f"step field '{name}' is null")
        elif name not in fields and name not in rec:
            problems.append(f"step record lacks field '{name}'")
    return problems


def parse_line(raw: bytes | str):
    """One line -> dict, or raise ValueError saying why. NaN/Infinity tokens are accepted."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    rec = json.loads(text)
    if not isinstance(rec, dict):
        raise ValueError(f"a JSON {type(rec).__name__}, not an object")
    return rec


def validate_file(path: str | os.PathLike, require: tuple[str, ...] = ()) -> list[str]:
    """Every problem in a metrics file as 'line N: ...' (a torn last line included)."""
    problems = []
    with open(path, "rb") as f:
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


class MetricsWriter:
    """Appends records, one ``os.write`` per line on an O_APPEND descriptor: a reader sees
    whole lines or a torn tail, never two writers' bytes interleaved in one line."""

    def __init__(self, path: str | os.PathLike):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.path = str(path)
        self.t0 = time.monotonic()
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, rec: dict) -> None:
        rec.setdefault("t", round(time.monotonic() - self.t0, 3))
        os.write(self.fd, dumps(rec).encode())

    def start(self, **fields) -> None:
        self.write({"event": "start", "t": 0, "pid": os.getpid(), **fields})

    def step(self, step: int, loss, lr, grad_norm, sps, **extra) -> None:
        self.write({"step": step, "t": round(time.monotonic() - self.t0, 3), "loss": loss,
                    "lr": lr, "grad_norm": grad_norm, "sps": sps, **extra})

    def eval(self, step: int, eval_auroc, eval_acc, **extra) -> None:
        self.write({"step": step, "eval_auroc": eval_auroc, "eval_acc": eval_acc, **extra})

    def fatal(self, step: int, reason: str) -> None:
        self.write({"step": step, "t": round(time.monotonic() - self.t0, 3), "FATAL": reason})

    def close(self) -> None:
        os.close(self.fd)


def atomic_write_json(path: str | os.PathLike, obj) -> None:
    """Write JSON to a temporary file in the same folder, then rename it over ``path``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=1, default=str)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_json(path: str | os.PathLike, limit: int = 1 << 20):
    """A small JSON file -> object, or None when it is missing, too big or unreadable."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            return None
        return json.loads(data)
    except (OSError, ValueError):
        return None


@dataclass
class TailReader:
    """Reads only what was appended to a file since the last call.

    Keeps its byte offset, buffers a torn last line until its newline, counts non-JSON lines
    and skips them, and starts over when the file is truncated or replaced (a new inode, a
    shorter size, or different first bytes)."""

    path: str
    chunk: int = 4 << 20
    max_line: int = 1 << 20
    offset: int = 0
    lines: int = 0
    bad_lines: int = 0
    resets: int = 0
    last_bad: str = ""
    bytes_read: int = 0
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
        self.offset, self._buf, self._head, self._dropping = 0, b"", b"", False
        self.resets += 1

    def records(self) -> Iterator[dict]:
        """Yield each complete record appended since the last call, in file order."""
        try:
            f = open(self.path, "rb")
        except OSError:
            return
        with f:
            st = os.fstat(f.fileno())
            if self._changed(f, st):
                self._reset()
            self._ident = (st.st_dev, st.st_ino)
            end = st.st_size
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
            if not raw.strip():
                continue
            self.lines += 1
            try:
                yield parse_line(raw)
            except ValueError:
                self._bad(raw)

    def _bad(self, raw: bytes) -> None:
        self.bad_lines += 1
        self.last_bad = raw[:120].decode("utf-8", "replace")


def read_run(path: str | os.PathLike) -> tuple[dict, list, list]:
    """(start record or {}, step records, eval records) of a whole metrics file, streamed.
    For tools that need the full history (smoke, plot); the hot paths read tails instead."""
    start, steps, evals = {}, [], []
    for rec in TailReader(str(path)).records():
        k = kind_of(rec)
        if k == "step":
            steps.append(rec)
        elif k == "eval":
            evals.append(rec)
        elif k == "start":
            start = rec
    return start, steps, evals


def tail_lines(path: str | os.PathLike, n: int, max_bytes: int = 1 << 20) -> list[bytes]:
    """The last ``n`` complete lines of a file, reading at most ``max_bytes`` from its end."""
    try:
        with open(path, "rb") as f:
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
