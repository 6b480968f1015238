"""Reading a training log the cheap way: a bounded tail, with progress-bar noise dropped."""
from __future__ import annotations

import re

from .contract import tail_lines

# MISSION.md: HF progress bars and weight-loading chatter bury the real error.
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
