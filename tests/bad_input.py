"""Replaying bad input against a script: what every tests/test_bad_input_<script>.py asserts.

A case runs the real script in a working folder that holds a file of the user's; the script
must answer with its exit code and (for a refusal) exactly one line on stderr that says what
was wrong, print no traceback, leave the user's files as they were, and answer within a bound
generous enough for a busy machine (the bound catches a hang or a quadratic blow-up, not speed).
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BOUND = 300.0  # seconds: a hang or a blow-up, never a slow machine
LONG_DIGITS = "9" * 20


@dataclass
class Result:
    rc: int
    out: str
    err: str
    seconds: float

    def error_lines(self, progress: str = "") -> list[str]:
        """stderr lines, progress lines (starting with ``progress``) aside."""
        return [ln for ln in self.err.splitlines() if ln.strip() and not (progress and ln.startswith(progress))]


def snapshot(folder: Path) -> dict:
    """path -> sha256 (or 'dir' / 'link -> target') of everything under ``folder``."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            p = Path(root) / name
            rel = str(p.relative_to(folder))
            if p.is_symlink():
                out[rel] = f"link -> {os.readlink(p)}"
            elif p.is_dir():
                out[rel] = "dir"
            elif p.is_file():
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
            else:
                out[rel] = "special"
    return out


def user_folder(tmp_path: Path) -> Path:
    """A working folder holding a user's file and a user's folder, as a real repository would."""
    work = tmp_path / "work"
    (work / "data").mkdir(parents=True)
    (work / "precious.txt").write_text("the user's notes\n")
    (work / "data" / "train.csv").write_text("text,label\na,0\n")
    return work


def replay(script: str, args, cwd: Path, bound: float = BOUND, stdin: str | None = None) -> Result:
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / script), *map(str, args)], cwd=cwd, input=stdin,
                       capture_output=True, text=True, timeout=bound)
    return Result(p.returncode, p.stdout, p.stderr, time.monotonic() - t0)


def assert_refused(r: Result, needle: str, progress: str = "", bound: float = BOUND) -> None:
    """Exit 2, one line on stderr that holds ``needle``, no traceback, within ``bound``."""
    lines = r.error_lines(progress)
    assert "Traceback" not in r.err, r.err[-3000:]
    assert r.rc == 2, (r.rc, r.out[-2000:], r.err[-2000:])
    assert len(lines) == 1, r.err[-3000:]
    assert needle in lines[0], (needle, lines[0])
    assert r.seconds < bound


STEP = '{"step": %d, "t": %s, "loss": 0.5, "lr": 0.001, "grad_norm": 1.0, "sps": 100}\n'


def steps(t="1") -> str:
    """Five valid step records (``t`` as given: a string to test untrusted values)."""
    return "".join(STEP % (i * 10, t) for i in range(1, 6))


def make_run_dir(work: Path, name: str, metrics=None, files=None) -> Path:
    """``work/runs/NAME`` holding ``metrics.jsonl`` and any other ``files`` (name -> text)."""
    d = work / "runs" / name
    d.mkdir(parents=True)
    if metrics is not None:
        (d / "metrics.jsonl").write_text(metrics)
    for fname, text in (files or {}).items():
        (d / fname).write_text(text)
    return d


def make_not_regular(path: Path, kind: str) -> None:
    """Put something that is not a regular file at ``path``: a fifo, a link_to_fifo, a
    link_to_dev_zero or a directory."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link_to_fifo":
        os.mkfifo(path.with_name("pipe"))
        path.symlink_to(path.with_name("pipe"))
    elif kind == "link_to_dev_zero":
        path.symlink_to("/dev/zero")
    else:
        path.mkdir()
