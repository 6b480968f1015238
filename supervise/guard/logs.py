"""Log dumps: ``cat``/``head``/``tail`` of a training log larger than the context can take is
refused with check-in's line (or a bounded tail) as the fix. Standard library only: hot path."""
from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import Optional

from supervise.guard.shell import Call, command_parts, deny, split_env
from supervise.vocabulary import BUNDLE

LOG_FILE = re.compile(r"(\.log|\.out|\.err|\.txt)$|(^|/)nohup\.out$")
BIG = 256 << 10
MAX_TAIL = 200  # lines of a log that head or tail may print
MAX_TAIL_BYTES = 32 << 10  # bytes of a log that head -c or tail -c may print: about MAX_TAIL lines of 160


def _size(call: Call, path: str) -> int:
    p = Path(os.path.expanduser(path))
    p = p if p.is_absolute() else Path(call.cwd) / p
    try:
        return p.stat().st_size
    except OSError:
        return -1


# the multipliers GNU head and tail accept after a count (-c 10M, -n 1K)
COUNT_SUFFIX = {"": 1, "b": 512, "K": 1024, "KiB": 1024, "kB": 1000, "KB": 1000, "M": 1 << 20, "MiB": 1 << 20,
                "MB": 10 ** 6, "G": 1 << 30, "GiB": 1 << 30, "GB": 10 ** 9}
COUNT = re.compile(r"^([+-]?)(\d+)([A-Za-z]*)$")
OLD_COUNT = re.compile(r"^-\d+$")  # tail -1000, head -300: the old form of -n


def head_tail_count(args: list[str], short: str, long: str) -> Optional[tuple[str, int]]:
    """(its sign, its value) of head's or tail's count option in ``args``: ``short`` "n" and ``long``
    "--lines" for lines (also the old form -1000), "c" and "--bytes" for bytes, as -n 5, -n5, --lines=5,
    --lines 5, with a sign (+N: tail from the Nth on; -N: head all but the last N) and a multiplier
    (10M, 1K); None when it is not given or cannot be read."""
    for i, a in enumerate(args):
        if a in ("-" + short, long):
            value = args[i + 1] if i + 1 < len(args) else ""
        elif a.startswith("-" + short) and len(a) > 2:
            value = a[2:]
        elif a.startswith(long + "="):
            value = a[len(long) + 1:]
        elif short == "n" and OLD_COUNT.match(a):
            value = a[1:]
        else:
            continue
        m = COUNT.match(value)
        return (m[1], int(m[2]) * COUNT_SUFFIX[m[3]]) if m and m[3] in COUNT_SUFFIX else None
    return None


def _checkin_fix(path: str) -> str:
    """What to run instead of dumping the log ``path``: check-in of its folder, or its filtered tail."""
    return ("python " + str(BUNDLE / "scripts" / "checkin.py") + f" {shlex.quote(os.path.dirname(path) or '.')} (or "
            f"tail -n 20 metrics.jsonl, or grep -avE \"it/s|Materializing|Loading weights\" {shlex.quote(path)} | "
            "tail -n 50)")


def _head_tail_dump(call: Call, exe: str, args: list[str], log: str) -> Optional[str]:
    """The deny reason when ``exe`` (head or tail) prints more of the log ``log`` than the context can
    take: more than MAX_TAIL lines, more than MAX_TAIL_BYTES bytes, or all of it from a line or byte on
    (tail -n +1, tail -c +1, head -n -5), unless the file is known to be no bigger than MAX_TAIL_BYTES."""
    lines, nbytes = head_tail_count(args, "n", "--lines"), head_tail_count(args, "c", "--bytes")
    count, unit = (nbytes, "byte") if nbytes else (lines, "line")
    if count is None:
        return None
    sign, n = count
    to_the_end = sign == ("+" if exe == "tail" else "-")  # tail from the Nth on; head all but the last N
    if not to_the_end and n <= (MAX_TAIL_BYTES if unit == "byte" else MAX_TAIL):
        return None
    size = _size(call, log)
    if 0 <= size <= MAX_TAIL_BYTES:
        return None  # a small file: all of it is a short read
    of = f" ({size // 1024:,} KiB)" if size > 0 else ""
    if to_the_end:
        flag = f"{exe} {'-c' if unit == 'byte' else '-n'} {sign}{n}"
        what = (f"{flag} prints {log}{of} from {unit} {n} to its end" if exe == "tail" else
                f"{flag} prints all of {log}{of} but its last {n} {unit}s")
        return deny("no_log_dumps", f"{what}: dumping it floods the context.", _checkin_fix(log))
    if unit == "byte":
        return deny("no_log_dumps", f"{n:,} bytes of {log} flood the context (the bound is "
                     f"{MAX_TAIL_BYTES >> 10} KiB, about {MAX_TAIL} lines).", _checkin_fix(log))
    return deny("no_log_dumps", f"{n} lines of {log} flood the context; read the tail through the progress-bar "
                 "filter.", f"grep -avE \"it/s|Materializing|Loading weights\" {shlex.quote(log)} | tail -n 50")


def rule_no_log_dumps(call: Call) -> Optional[str]:
    if call.tool != "Bash":
        return None
    for words, op in command_parts(call) or []:
        if op in ("|", "|&"):
            continue  # its output is filtered further down the pipe
        _, words = split_env(words)
        if not words:
            continue
        exe = os.path.basename(words[0])
        if exe not in ("cat", "less", "more", "bat", "head", "tail"):
            continue
        args = words[1:]
        files = [a for a in args if not a.startswith("-") and not a.lstrip("+").isdigit()]
        if exe in ("cat", "less", "more", "bat"):
            big = [f for f in files if _size(call, f) > BIG]
            if big:
                return deny("no_log_dumps", f"{big[0]} is {_size(call, big[0]) // 1024} KiB: dumping it floods "
                             "the context.", _checkin_fix(big[0]))
        if exe in ("head", "tail") and "-f" not in args:
            logs = [f for f in files if LOG_FILE.search(f)]
            reason = _head_tail_dump(call, exe, args, logs[0]) if logs else None
            if reason:
                return reason
    return None
