"""What every front door shares: the one error boundary (``front_door``: a parser whose errors
are one line and exit 2, a ``UsageError`` raised anywhere below turned into one line and exit 2,
a reader that left never a traceback), and the argument types (durations like ``90s``, ``6m``,
``3h``; positive numbers; run directories). Every number is finite and bounded: ``nan``, ``inf``,
``1e999`` and 20-digit values are usage errors here, never an overflow later. Exit codes are
``vocabulary``'s."""
from __future__ import annotations

import argparse
import math
import os
import re
import sys
from typing import Callable

from supervise.vocabulary import EXIT_OK, EXIT_USAGE


_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([smhd]?)\s*$", re.I)
MAX_DURATION = 30 * 86400.0   # seconds: no poll, stall, window or timeout is longer than 30 days
MAX_INT = 10 ** 15            # no count, step, batch or sample number is larger
MAX_FLOAT = 1e15


class UsageError(Exception):
    """Bad input: the message is one line that says what was wrong and how to fix it."""


def front_door(parser: "Parser", body: Callable[[argparse.Namespace], int], argv=None) -> int:
    """The one error boundary of every script: parse ``argv`` (bad usage: one line, exit 2), run
    ``body(args)`` and return its exit code. A ``UsageError`` from anywhere below becomes
    ``PROG: error: <its line>`` on stderr and exit 2, once; a reader that left (``| head -1``)
    is no traceback."""
    args = parser.parse_args(argv)
    try:
        return body(args)
    except UsageError as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except BrokenPipeError:
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except OSError:
            pass
        return EXIT_OK


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error (no usage block), exit code 2. Run as a console command
    (``supervise-watchdog``) it names itself by that command, not by the script's file name."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        command = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
        if command.startswith("supervise-"):
            self.prog = command

    def error(self, message):
        hint = " (see --help)" if "unrecognized" in message or "required" in message else ""
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}{hint}\n")


def duration(text: str) -> float:
    """'90' or '90s' -> 90.0, '6m' -> 360.0, '3h' -> 10800.0; > 0 and at most 30 days."""
    m = _DURATION.match(str(text)) if len(str(text)) <= 40 else None
    if not m and str(text).strip().startswith("-"):
        raise argparse.ArgumentTypeError(f"{_short(text)} must be more than 0 seconds (e.g. 30, 90s, 6m)")
    if not m:
        raise argparse.ArgumentTypeError(
            f"{_short(text)} is not a duration; use seconds or a number with s, m, h (e.g. 90s, 6m, 3h)")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0 seconds")
    if not value <= MAX_DURATION:
        raise argparse.ArgumentTypeError(f"{_short(text)} is longer than 30 days (30d); give a shorter duration")
    return value


def _short(text) -> str:
    text = str(text)
    return repr(text) if len(text) <= 40 else f"{text[:20]!r}... ({len(text)} characters)"


def _number(kind, text, low=None, low_ok=False, high=None):
    """``kind(text)`` checked: finite, ``low`` < value (<= with ``low_ok``), value <= ``high``."""
    name = "an integer" if kind is int else "a number"
    if len(str(text)) > 40:
        raise argparse.ArgumentTypeError(f"{_short(text)} is too long to be {name}")
    try:
        value = kind(text)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"{text!r} is not {name}")
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number; give {name} such as 0.5")
    if low is not None and (value < low or (value == low and not low_ok)):
        raise argparse.ArgumentTypeError(f"{text!r} must be {'at least' if low_ok else 'more than'} {low}")
    high = (MAX_INT if kind is int else MAX_FLOAT) if high is None else high
    if value > high:
        raise argparse.ArgumentTypeError(f"{text!r} is too large; give at most {high:g}")
    return value


def positive_int(text):
    return _number(int, text, 0)


def count(text):
    return _number(int, text, 0, low_ok=True)


def bounded_int(low: int, high: int, low_ok: bool = True):
    """An integer type with explicit bounds, e.g. a seed in [0, 2**32 - 1]."""
    def parse(text):
        return _number(int, text, low, low_ok, high)
    parse.__name__ = "integer"
    return parse


def positive_float(text):
    return _number(float, text, 0.0)


def fraction(text):
    value = _number(float, text, 0.0)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a fraction below 1 (0.25 = 25%)")
    return value


def run_dir_arg(text: str) -> str:
    """A run directory: it may not exist yet (the trainer makes it), but it must not be empty
    (that would be the current directory) nor a file."""
    if not str(text).strip():
        raise argparse.ArgumentTypeError("the run directory is empty; pass the folder that holds (or will hold) "
                                         "metrics.jsonl, e.g. runs/a")
    if "\x00" in text:
        raise argparse.ArgumentTypeError(f"{_short(text)} holds a NUL byte; pass a real folder path")
    if os.path.exists(text) and not os.path.isdir(text):
        raise argparse.ArgumentTypeError(
            f"{_short(text)} is a file, not a run directory; pass the folder that holds (or will hold) metrics.jsonl")
    return text



class CommandParser(Parser):
    """A Parser for ``SCRIPT [options] -- CMD ...``: everything after the first ``--`` is the
    command, as given (its own flags untouched), in ``namespace.command`` ([] when none)."""

    def parse_args(self, args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        command = []
        if "--" in args:
            i = args.index("--")
            args, command = args[:i], args[i + 1:]
        ns = super().parse_args(args, namespace)
        ns.command = command
        return ns

    def error(self, message):
        if "unrecognized arguments" in message:
            message += " (put the command after --: SCRIPT RUN_DIR [options] -- CMD ...)"
        super().error(message)
