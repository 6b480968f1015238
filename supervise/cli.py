"""What every front door shares: a parser whose errors are one line and exit 2, and the
argument types (durations like ``90s``, ``6m``, ``3h``; positive numbers; run directories)."""
from __future__ import annotations

import argparse
import os
import re

EXIT_OK, EXIT_USAGE, EXIT_ANOMALY = 0, 2, 7

_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([smhd]?)\s*$", re.I)


class UsageError(Exception):
    """Bad input: the message is one line that says what was wrong and how to fix it."""


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error (no usage block), exit code 2."""

    def error(self, message):
        hint = " (see --help)" if "unrecognized" in message or "required" in message else ""
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}{hint}\n")


def duration(text: str) -> float:
    """'90' or '90s' -> 90.0, '6m' -> 360.0, '3h' -> 10800.0; > 0 required."""
    m = _DURATION.match(str(text))
    if not m and str(text).strip().startswith("-"):
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0 seconds (e.g. 30, 90s, 6m)")
    if not m:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration; use seconds or a number with s, m, h (e.g. 90s, 6m, 3h)")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0 seconds")
    return value


def _number(kind, text, low=None, low_ok=False):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a{'n integer' if kind is int else ' number'}")
    if low is not None and (value < low or (value == low and not low_ok)):
        raise argparse.ArgumentTypeError(f"{text!r} must be {'at least' if low_ok else 'more than'} {low}")
    return value


def positive_int(text):
    return _number(int, text, 0)


def count(text):
    return _number(int, text, 0, low_ok=True)


def positive_float(text):
    return _number(float, text, 0.0)


def fraction(text):
    value = _number(float, text, 0.0)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a fraction below 1 (0.25 = 25%)")
    return value


def run_dir_arg(text: str) -> str:
    """A run directory: it may not exist yet (the trainer makes it), but it must not be a file."""
    if os.path.exists(text) and not os.path.isdir(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is a file, not a run directory; pass the folder that holds (or will hold) metrics.jsonl")
    return text


