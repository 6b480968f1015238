"""What a hang's capture costs the run: how long it takes, and how long it pauses the process.

    python benchmarks/stacks.py [--repeat 5]

A live Python process (a busy loop that stamps time.monotonic() into a file every ~1 ms: it
never hangs, so every gap in its stamps is a pause the capture caused, or the machine) is
captured by ``supervise.observe.stacks.capture`` the two ways: in-process (``Telemetry`` registered
faulthandler; the watchdog sends the signal) and from outside (``py-spy dump``, which stops the
process while it reads it; ``--native`` too when py-spy is installed). For each: the capture's
wall time, and the longest gap in the stamps during the capture against the longest gap before
it (the machine's own noise). Prints figures, asserts nothing.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from supervise.observe import stacks as st  # noqa: E402

TARGET = """
import os, sys, time
sys.path.insert(0, {root!r})
if {integrated}:
    from supervise.telemetry import Telemetry
    tm = Telemetry({run!r})
fd = os.open({stamps!r}, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
def busy():
    while True:
        os.write(fd, b"%.6f\\n" % time.monotonic())
        end = time.monotonic() + 0.001
        while time.monotonic() < end:
            pass
busy()
"""


def stamps(path: Path) -> list:
    out = []
    for line in path.read_bytes().splitlines():
        try:
            out.append(float(line))
        except ValueError:
            pass
    return out


def max_gap(ts: list, lo: float, hi: float) -> float:
    inside = [t for t in ts if lo <= t <= hi]
    return max((b - a for a, b in zip(inside, inside[1:])), default=0.0)


def one(integrated: bool, native: bool, spy) -> tuple:
    with tempfile.TemporaryDirectory() as d:
        run, stamp_file = Path(d) / "run", Path(d) / "stamps"
        run.mkdir()
        p = subprocess.Popen([sys.executable, "-c", TARGET.format(root=str(ROOT), integrated=integrated, run=str(run),
                                                                  stamps=str(stamp_file))])
        try:
            end = time.monotonic() + 30
            while time.monotonic() < end and not (stamp_file.exists() and len(stamps(stamp_file)) >= 500):
                time.sleep(0.05)
            before = time.monotonic()
            found = st.capture(run, [st.Target(p.pid, 0, "rank")], native=native, py_spy=spy)
            after = time.monotonic()
            time.sleep(0.3)
            ts = stamps(stamp_file)
            quiet = max_gap(ts, before - 1.0, before)
            paused = max_gap(ts, before, after + 0.05)
            (proc,) = found.procs
            return after - before, paused, quiet, proc.how or proc.error[:60], p.poll() is None
        finally:
            p.kill()
            p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    spy = st.find_py_spy()
    ways = [("in-process (faulthandler)", True, False)]
    if spy:
        ways += [("py-spy dump", False, False), ("py-spy dump --native", False, True)]
    else:
        print("py-spy is not installed: only the in-process way is measured")
    print(f"{'way':28} {'capture s (median / max)':>26} {'longest gap in the run during it, ms':>38} "
          f"{'before it, ms':>14}  alive after")
    for name, integrated, native in ways:
        got = [one(integrated, native, spy) for _ in range(a.repeat)]
        took = [g[0] for g in got]
        paused = [g[1] * 1000 for g in got]
        quiet = [g[2] * 1000 for g in got]
        print(f"{name:28} {statistics.median(took):12.3f} / {max(took):.3f}  "
              f"{statistics.median(paused):22.1f} / {max(paused):.1f}  {statistics.median(quiet):9.1f} / {max(quiet):.1f}"
              f"  {all(g[4] for g in got)} ({got[0][3]})")


if __name__ == "__main__":
    main()
