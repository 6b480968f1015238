"""Reading a training log the cheap way: a bounded tail, progress-bar noise dropped, and the
knowledge of what a failure looks like in it (standard library only; the watchdog's hot path).

- ``oom_line(lines)``: the last line naming an out-of-memory error.
- ``last_error(lines)``: the real error: torchrun's root cause when its failure block is there,
  torchrun's own death on a half-written error file (and the ranks' error before it) when it
  died first, else the last line of the last traceback that is not another rank's fallout.
- ``root_cause(lines, error_files=())``: torchrun's "Root Cause (first observed failure)" block as
  a ``RootCause`` (rank, local rank, host, exit code, signal, error file, pid, time, message).
- ``is_fallout(line)``: a line that is the consequence of another rank's failure (NCCL/gloo
  timeouts, "Connection closed by peer", SIGTERM sent by the launcher): never reported as a cause.
- ``killed_reason(pid, before, after, kernel_lines)``: whether a SIGKILL was the OOM killer's.
"""
from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, NamedTuple, Optional

from supervise.contract import tail_lines

# HF progress bars and weight-loading chatter bury the real error (references/gotchas.md).
NOISE = re.compile(r"it/s|s/it|Materializing|Loading weights|^\s*\d+%\|")


def clean(raw_lines) -> list[str]:
    """Drop progress-bar lines; a carriage-return line keeps only its last segment."""
    out = []
    for raw in raw_lines:
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        if "\r" in text:
            text = text.rstrip("\r").rsplit("\r", 1)[-1]
        if not text.strip() or NOISE.search(text):
            continue
        out.append(text.rstrip())
    return out


def log_tail(path, n: int = 200, max_bytes: int = 256 << 10) -> list[str]:
    """The last ``n`` meaningful lines of a log, reading at most ``max_bytes`` of it."""
    return clean(tail_lines(path, n * 4, max_bytes))[-n:]


OOM_MARKERS = ("out of memory", "outofmemoryerror", "memoryerror", "std::bad_alloc",
               "can't allocate memory", "cannot allocate memory", "oom-kill", "cublas_status_alloc_failed",
               "exceeded job memory limit", "exceeded memory limit")  # the last two: slurmstepd's


def oom_line(lines) -> Optional[str]:
    """The last line of ``lines`` that names an out-of-memory error, or None."""
    return next((ln.strip() for ln in reversed(lines) if any(m in ln.lower() for m in OOM_MARKERS)), None)


# torchrun prefixes each worker's output with "[rank1]: " (or "[default1]:" with --tee).
RANK_PREFIX = re.compile(r"^\[(?:rank|default)(\d+)\]:\s?")
# torchrun's failure report frames itself with lines of '=' and '-'.
BANNER = re.compile(r"^\s*(?:={10,}|-{10,})\s*$")

# Consequences of another rank's failure: the surviving ranks time out in a collective, lose
# their peer, or are terminated by the launcher. Reported as a cause only when nothing else is.
FALLOUT = re.compile("|".join((
    r"Connection closed by peer", r"Connection reset by peer", r"Broken pipe",
    r"remote worker crash", r"remote process exited", r"peer .*(?:closed|died|exited)",
    r"Timed out waiting", r"[Tt]imed out .*(?:recv|send|connect|collective|rendezvous|store)",
    r"Watchdog caught collective operation timeout", r"collective operation timeout",
    r"Some NCCL operations have failed or timed out", r"NCCL communicator was aborted",
    r"ncclRemoteError", r"ProcessGroupNCCL.*(?:[Tt]imeout|abort)", r"ProcessGroupGloo.*[Tt]imed? ?out",
    r"DistNetworkError", r"DistBackendError.*(?:[Tt]imeout|closed|reset|abort)",
    r"terminated by SIGTERM", r"closing signal SIGTERM", r"Signal 15 \(SIGTERM\) received",
    r"SignalException: Process \d+ got signal: 15", r"exitcode\s*:\s*-15\b",
    r"ChildFailedError",
)))


def is_fallout(line: str) -> bool:
    """True when ``line`` reports another rank's failure from the outside (a timeout in a
    collective, a closed connection, the launcher's SIGTERM), not a cause of its own."""
    return bool(FALLOUT.search(line or ""))


# A failure of the machine, the network or the scheduler, not of the script's own code: a relaunch
# as it is may pass (references/recovery.md's crash row). A device-side assert is the code's.
ENVIRONMENT = re.compile("|".join((
    r"\bNCCL\b", r"\b[Gg]loo\b", r"ProcessGroup(?:NCCL|Gloo)", r"DistNetworkError", r"DistStoreError",
    r"DistBackendError", r"Connection (?:reset|closed|refused|timed out)", r"Broken pipe",
    r"CUDA error(?!: device-side assert)", r"cudaError(?!Assert)", r"CUBLAS_STATUS_(?:EXECUTION_FAILED|INTERNAL_ERROR)",
    r"\bECC\b", r"\bXid\b", r"GPU is lost", r"fell off the bus",
    r"\[Errno (?:5|110|112|113|116|121)\]", r"Stale file handle", r"Input/output error", r"Remote I/O error",
    r"Transport endpoint is not connected", r"No route to host", r"Host is down",
    r"\bSIG(?:KILL|TERM|HUP|INT|BUS)\b", r"Signals\.SIG(?:KILL|TERM|HUP|INT|BUS)",
)))


def is_environment(text: str) -> bool:
    """True when an error names the machine, the network or a signal from outside (NCCL or gloo,
    CUDA, ECC, Xid, a network file system's OSError, SIGKILL/SIGTERM), not the script's own code."""
    return bool(ENVIRONMENT.search(text or ""))


def _tracebacks(lines: list[str]) -> list[tuple[int, str]]:
    """(index, last line) of each traceback in ``lines``, one output stream at a time: torchrun
    interleaves the ranks' "[rankN]: " lines, so each prefix is followed on its own."""
    streams: dict[str, list[tuple[int, str]]] = {}
    for i, ln in enumerate(lines):
        m = RANK_PREFIX.match(ln)
        streams.setdefault(m.group(1) if m else "", []).append((i, ln[m.end():] if m else ln))
    out = []
    for stream in streams.values():
        out += _stream_tracebacks(stream)
    return sorted(out)


def _stream_tracebacks(stream: list[tuple[int, str]]) -> list[tuple[int, str]]:
    out = []
    k, n = 0, len(stream)
    tb = "Traceback (most recent call last)"
    while k < n:
        if not stream[k][1].startswith(tb):
            k += 1
            continue
        j, last, body = k + 1, None, None
        while j < n and not stream[j][1].startswith(tb):
            i, ln = stream[j]
            if BANNER.match(ln):
                break  # torchrun's failure report starts here
            if ln.strip():
                if not ln.startswith((" ", "\t")):
                    if last is not None:
                        break  # the first unindented line after the exception line: other output
                    last = (i, ln.strip())
                body = (i, ln.strip())
            j += 1
        if last or body:
            out.append(last or body)
        k = j
    return out


def last_error(lines) -> Optional[str]:
    """The real error in ``lines``: torchrun's root cause when its failure block is there (the
    first failing rank's message, not the launcher's ``ChildFailedError`` or its '=====' banner),
    else the last line of the last traceback that is not fallout (another rank's timeout or
    closed connection), else the last traceback line at all; else an argparse-style
    ``prog: error: ...`` line among the last ones; None without either."""
    lines = [ln.rstrip() for ln in lines]
    cause = root_cause(lines)
    if cause is not None:
        return cause.summary()
    reply = next((i for i in range(len(lines) - 1, -1, -1) if REPLY_FAILED.search(lines[i])), None)
    if reply is not None:
        return _reply_failed(lines, reply)
    errors = [text for _, text in _tracebacks(lines)]
    if not errors:  # argparse and sys.exit('...') end a script without a traceback
        return next((ln.strip() for ln in reversed(lines[-USAGE_TAIL:]) if _USAGE_ERROR.match(ln.strip())), None)
    real = [e for e in errors if not is_fallout(e)]
    return (real or errors)[-1]


USAGE_TAIL = 5
# torchrun's own crash: it read a rank's error file while that rank was still writing it (torch writes
# it in place; a rank stopped mid-write leaves it empty) and died of the JSONDecodeError, before its
# failure report: the error that follows is the launcher's, not the script's
REPLY_FAILED = re.compile(r"Failed to parse reply file: (\S+)")
_LOCAL_RANK_DIR = re.compile(r"attempt_\d+/(\d+)/[^/]+$")


def _reply_failed(lines: list, at: int) -> str:
    """``torchrun failed reading local rank 0's error file ...; the ranks' own error: X``: X the
    last rank traceback before the launcher's (not fallout when one is not), else that error file
    as it reads now."""
    path = REPLY_FAILED.search(lines[at])[1]
    local = _LOCAL_RANK_DIR.search(path)
    before = [text for _, text in _tracebacks(lines[:at])]
    own = [e for e in before if not is_fallout(e)] or before
    said = (own[-1] if own else None) or _read_error_file(path) or \
        "none printed (a rank killed by SIGKILL or another signal prints none)"
    after = next((t for _, t in reversed(_tracebacks(lines[at:]))), "")
    return (f"torchrun failed reading local rank {local[1] if local else '?'}'s error file before its failure "
            f"report ({after or 'a torch race'}: read half-written); the ranks' own error: {said}")
_USAGE_ERROR = re.compile(r"^[\w.\-/]+: error: \S")   # "train.py: error: unrecognized arguments: --resume"


# --- torchrun's root-cause block --------------------------------------------------------------

ROOT_HEAD = "Root Cause (first observed failure):"
_FIELD = re.compile(r"^\s{1,4}(time|host|rank|exitcode|error_file|traceback)\s*:\s?(.*)$")
_RANK = re.compile(r"(-?\d+)\s*\(local_rank:\s*(-?\d+)\)")
_EXIT = re.compile(r"(-?\d+)\s*\(pid:\s*(\d+)\)\s*(?:\((SIG\w+)\))?")
ERROR_FILE_MAX = 256 << 10


@dataclass(frozen=True)
class RootCause:
    """torchrun's "Root Cause (first observed failure)": which rank failed first, and why."""

    rank: Optional[int]
    local_rank: Optional[int]
    host: str
    exitcode: Optional[int]
    signal: Optional[str]          # "SIGKILL", "SIGSEGV", ... when the worker died of a signal
    error_file: Optional[str]      # None when torchrun printed <N/A>
    pid: Optional[int]
    time: str
    message: Optional[str]         # the failing rank's own error, when the log or error file has it
    fallout: bool = False          # the first observed failure is itself a timeout / lost peer

    def summary(self, killed: Optional[str] = None) -> str:
        """One line: ``rank 1 (local_rank 1, pid 5831 on node-a) exitcode -9 (SIGKILL): ...``.
        ``killed`` (from ``killed_reason``) replaces the message of a SIGKILL."""
        who = f"rank {self.rank if self.rank is not None else '?'}"
        where = ", ".join(x for x in (f"local_rank {self.local_rank}" if self.local_rank is not None else "",
                                      f"pid {self.pid}" if self.pid else "") if x)
        if self.host:
            where = f"{where} on {self.host}" if where else f"on {self.host}"
        head = f"{who} ({where})" if where else who
        code = f" exitcode {self.exitcode}" if self.exitcode is not None else ""
        sig = f" ({self.signal})" if self.signal else ""
        msg = self.message
        if self.signal == "SIGKILL":
            msg = killed or KILLED_NOT_OOM
        elif not msg and self.signal:
            msg = f"killed by {self.signal}"
        text = f"{head}{code}{sig}: {msg}" if msg else f"{head}{code}{sig}"
        if self.fallout:
            text += " (itself fallout: another rank hung or died first; the rank heartbeats name it)"
        return text


def _read_error_file(path) -> Optional[str]:
    """The message of a torchelastic error file (json), read only if it is a regular file and
    at most ERROR_FILE_MAX bytes are read; None when absent or unreadable."""
    try:
        fd = os.open(str(path), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except (OSError, ValueError):
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, ERROR_FILE_MAX)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        doc = json.loads(data.decode("utf-8", "replace"))
    except ValueError:
        return None
    msg = doc.get("message") if isinstance(doc, dict) else None
    if isinstance(msg, dict):
        msg = msg.get("message")
    if not isinstance(msg, str) or not msg.strip():
        return None
    return msg.strip().splitlines()[-1].strip()


_ENTRY = re.compile(r"^\s*\[\d+\]:\s*$")   # "[0]:", the head of one failure in torchrun's block
FAILURES_HEAD = "Failures:"


def root_cause(lines, error_files: Iterable = ()) -> Optional[RootCause]:
    """Parse the last "Root Cause (first observed failure)" block torchrun printed in ``lines``.

    The failing rank's message comes, in order, from: the error file the block names (read when
    it still exists: regular file, bounded read), any of ``error_files`` (e.g. the launch's
    ``$TORCHELASTIC_ERROR_FILE``, into which torchrun copies the child's), the traceback printed in
    the block (workers decorated with ``@record``), the rank's own ``[rankN]:`` traceback earlier
    in ``lines``. When the first observed failure is itself fallout (rank 0 aborted on the lost
    peer before torchrun saw the peer's SIGKILL) and the block's "Failures:" list holds a rank
    that failed on its own, that rank is the cause; else the first rank whose own traceback in
    ``lines`` is not fallout. Returns None when there is no such block, or
    while it is half written (no closing banner and no traceback field yet: the fields come in one
    order, the traceback last)."""
    lines = [ln.rstrip("\n") for ln in lines]
    try:
        head = max(i for i, ln in enumerate(lines) if ln.strip() == ROOT_HEAD)
    except ValueError:
        return None
    root = _failure(lines, head + 1, head, error_files)
    if root is None or not root.fallout:
        return root
    try:
        failures = max(i for i, ln in enumerate(lines[:head]) if ln.strip() == FAILURES_HEAD)
    except ValueError:
        failures = None
    if failures is not None:
        others = [_failure(lines, i + 1, head, error_files) for i in range(failures + 1, head) if _ENTRY.match(lines[i])]
        own = [c for c in others if c is not None and not c.fallout and c.signal != "SIGTERM"]
        if own:
            return own[0]
    start = max((i + 1 for i, ln in enumerate(lines[:head]) if ln.strip() == ROOT_HEAD), default=0)
    return _own_traceback(lines[start:failures if failures is not None else head], root) or root


def _own_traceback(lines: list, root: RootCause) -> Optional[RootCause]:
    """The first rank whose own ``[rankN]:`` traceback in ``lines`` is not fallout, when torchrun's
    first observed failure (``root``) is: under load torchrun can see rank 0 abort on the lost
    peer while the rank that raised is still exiting, and then stops that one without listing it.
    The rank's exitcode and pid are unknown then; host and local rank follow from ``root`` (the
    log holds this node's workers, numbered contiguously)."""
    first: dict[int, tuple[int, str]] = {}
    for i, text in _tracebacks(lines):
        m = RANK_PREFIX.match(lines[i])
        if m and not is_fallout(text) and int(m.group(1)) != root.rank:
            first.setdefault(int(m.group(1)), (i, text))
    if not first:
        return None
    rank, (_, message) = min(first.items(), key=lambda kv: kv[1][0])
    local = None
    if root.rank is not None and root.local_rank is not None and rank - root.rank + root.local_rank >= 0:
        local = rank - root.rank + root.local_rank
    return RootCause(rank=rank, local_rank=local, host=root.host, exitcode=None, signal=None, error_file=None,
                     pid=None, time=root.time, message=message)


def _failure(lines: list, start: int, head: int, error_files: Iterable) -> Optional[RootCause]:
    """One failure of torchrun's block: its fields from ``lines[start:]`` up to the next banner
    or entry; ``lines[:head]`` hold the ranks' own output. None while it is half written."""
    fields: dict[str, str] = {}
    tb: list[str] = []
    in_tb = closed = False
    for ln in lines[start:]:
        if BANNER.match(ln) or (_ENTRY.match(ln) and fields):
            closed = True
            break
        if in_tb:  # the traceback is the block's last field: the rest is its text
            if ln.strip():
                tb.append(ln)
            continue
        m = _FIELD.match(ln)
        if m:
            in_tb = m.group(1) == "traceback"
            fields.setdefault(m.group(1), m.group(2).strip())
            if in_tb and m.group(2).strip():
                tb.append("  " + m.group(2).strip())
    if not closed and not fields.get("traceback"):
        return None   # torchrun is still writing the block: read it whole on the next poll
    rank = local_rank = exitcode = pid = None
    signal = None
    m = _RANK.search(fields.get("rank", ""))
    if m:
        rank, local_rank = int(m.group(1)), int(m.group(2))
    m = _EXIT.search(fields.get("exitcode", ""))
    if m:
        exitcode, pid, signal = int(m.group(1)), int(m.group(2)), m.group(3)
    error_file = fields.get("error_file") or None
    if error_file and error_file.startswith("<"):
        error_file = None

    message = None
    for path in ([error_file] if error_file else []) + [str(p) for p in error_files if p]:
        message = _read_error_file(path)
        if message:
            break
    if not message and tb:
        block_tb = [ln[2:] if ln.startswith("  ") else ln for ln in tb]
        if block_tb[0].startswith("Traceback"):
            found = _tracebacks(block_tb)
            message = found[-1][1] if found else None
        elif not block_tb[0].startswith(("To enable traceback", "Signal ")):
            message = block_tb[-1].strip()
    if not message and rank is not None:
        own = [RANK_PREFIX.sub("", ln, count=1) for ln in lines[:head]
               if (m2 := RANK_PREFIX.match(ln)) and int(m2.group(1)) == rank]
        found = [text for _, text in _tracebacks(own)]
        real = [t for t in found if not is_fallout(t)]   # a chained teardown error comes after the cause
        message = (real or found)[-1] if found else None
    return RootCause(rank=rank, local_rank=local_rank, host=fields.get("host", ""), exitcode=exitcode,
                     signal=signal, error_file=error_file, pid=pid, time=fields.get("time", ""),
                     message=message, fallout=bool(message) and is_fallout(message))


# --- SIGKILL: the OOM killer's, or someone else's ---------------------------------------------

KILLED_NOT_OOM = "killed by SIGKILL (not shown to be OOM)"
_CGROUP_ROOT = Path("/sys/fs/cgroup")
_KERNEL_OOM = re.compile(r"(?:Out of memory|Memory cgroup out of memory|oom-kill|oom_reaper|Killed process)", re.I)


class Killed(NamedTuple):
    oom: bool
    text: str


def cgroup_dir(pid: Optional[int] = None, root: Path = _CGROUP_ROOT) -> Optional[Path]:
    """The memory cgroup folder of ``pid`` (this process when None): cgroup v2's unified
    hierarchy, or v1's memory controller. Read it while the process lives; None if unknown."""
    try:
        text = Path(f"/proc/{pid or 'self'}/cgroup").read_text()
    except OSError:
        return None
    v1 = v2 = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
        elif "memory" in parts[1].split(","):
            v1 = parts[2]
    for base, rel in ((root, v2), (root / "unified", v2), (root / "memory", v1)):
        if rel is None:
            continue
        d = base / rel.lstrip("/")
        if (d / "memory.events").is_file() or (d / "memory.oom_control").is_file():
            return d
    return None


def oom_kills(cgroup: Optional[Path]) -> Optional[int]:
    """The cgroup's ``oom_kill`` counter (v2 ``memory.events``, v1 ``memory.oom_control``);
    None when neither file is readable. Read it before and after a death and compare."""
    if cgroup is None:
        return None
    for name in ("memory.events", "memory.oom_control"):
        try:
            text = (Path(cgroup) / name).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
    return None


def kernel_oom_lines(pid: Optional[int] = None, runner=None, timeout: float = 2.0) -> list[str]:
    """The kernel log's OOM-killer lines (``dmesg``, when this user may read it), those naming
    ``pid`` when given; [] when dmesg is missing, refused or slow. ``runner``: subprocess.run's
    stand-in (imported here: a look that finds no death never pays for it)."""
    import subprocess
    try:
        p = (runner or subprocess.run)(["dmesg"], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return []
    if getattr(p, "returncode", 1) != 0:
        return []
    out = [ln for ln in (p.stdout or "").splitlines() if _KERNEL_OOM.search(ln)]
    if pid is not None:
        mine = re.compile(rf"(?:process|pid)[=: ]\s*{pid}\b", re.I)
        out = [ln for ln in out if mine.search(ln)]
    return out


def killed_reason(pid: Optional[int], before: Optional[int] = None, after: Optional[int] = None,
                  kernel_lines: Iterable[str] = ()) -> Killed:
    """Whether a process that died of SIGKILL was killed for memory. OOM only when the kernel or
    the cgroup says so: the cgroup's ``oom_kill`` counter rose (``before`` -> ``after`` from
    ``oom_kills``), or a kernel OOM line names ``pid`` (``kernel_oom_lines``). Otherwise the
    text is ``killed by SIGKILL (not shown to be OOM)``."""
    if before is not None and after is not None and after > before:
        return Killed(True, f"killed by the OOM killer (cgroup oom_kill {before} -> {after})")
    kernel = [ln.strip() for ln in kernel_lines if ln.strip()]
    if pid is not None:
        mine = re.compile(rf"(?:process|pid)[=: ]\s*{pid}\b", re.I)
        kernel = [ln for ln in kernel if mine.search(ln)]
    if kernel:
        return Killed(True, f"killed by the OOM killer (kernel: {kernel[-1][:160]})")
    return Killed(False, KILLED_NOT_OOM)


# --- a full disk ------------------------------------------------------------------------------
# What a full disk prints, reproduced on a full tmpfs (torch 2.13, safetensors 0.8, numpy):
#   json.dump / open().write:     OSError: [Errno 28] No space left on device
#   safetensors (HF save_pretrained): SafetensorError: Error while serializing: I/O error: No space
#                                 left on device (os error 28)
#   torch.save (zip writer):      RuntimeError: basic_ios::clear: iostream error, then
#                                 RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534
#                                 (older torch, as reported in many trackers: "[enforce fail at inline_container.cc:471] .
#                                 PytorchStreamWriter failed writing file data/3: file write failed"; pytorch#175248: some
#                                 builds abort with "terminate called after throwing an instance of 'std::__ios_failure'")
#   torch.save (legacy format):   RuntimeError: write(): fd 3 failed with No space left on device
#   numpy.save:                   OSError: 1000000 requested and 131056 written
#   a quota (EDQUOT; not reproduced here): OSError: [Errno 122] Disk quota exceeded
ENOSPC = re.compile("|".join((
    r"No space left on device", r"\bENOSPC\b", r"Errno 28\b", r"os error 28\b", r"[Dd]isk quota exceeded",
    r"\bEDQUOT\b", r"Errno 122\b", r"PytorchStreamWriter failed writing file", r"std::__ios_failure",
    r"inline_container\.cc.*unexpected pos \d+ vs \d+", r"\d+ requested and \d+ written",
)))


def enospc_line(lines) -> Optional[str]:
    """The last line of ``lines`` saying the disk (or the quota) is full, or None."""
    return next((ln.strip() for ln in reversed(lines) if ENOSPC.search(ln)), None)
