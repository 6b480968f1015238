"""audit.py's throughput on a real corpus built here: top-level functions and classes cut from
the Python standard library sources on this machine (pyenv's 2.7 tree included, which fails
ast.parse at a realistic rate). Serial against the pool, with and without black, in one run.

    python benchmarks/audit_throughput.py [--rows 30000] [--black-rows 6000] [--workers 2]

black is ~50x slower per row, so it runs on the first --black-rows rows of the same corpus.
"""
import argparse
import glob
import os
import random
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from supervise.tools.audit import check_all  # noqa: E402

TOP = re.compile(r"^(?:@.*\n)*(?:def|class|async def) ", re.M)  # decorators travel with their def


def corpus(limit: int, seed: int = 0) -> list[str]:
    files = []
    for root in sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/*/lib/python*"))):
        files += glob.glob(os.path.join(root, "**", "*.py"), recursive=True)
    files = [f for f in files if "site-packages" not in f]
    random.Random(seed).shuffle(files)
    rows = []
    for f in files:
        try:
            text = Path(f).read_text(errors="replace")
        except OSError:
            continue
        starts = [m.start() for m in TOP.finditer(text)]
        rows += [text[a:b] for a, b in zip(starts, starts[1:] + [len(text)])]
        if len(rows) >= limit:
            break
    return rows[:limit]


def measure(rows, how, workers):
    t0 = time.perf_counter()
    res = check_all([(r, how, None, 5.0) for r in rows], workers)
    return len(rows) / (time.perf_counter() - t0), sum(not ok for ok, *_ in res) / len(rows)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=30000)
    p.add_argument("--black-rows", type=int, default=6000)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    a = p.parse_args()
    rows = corpus(a.rows)
    py2 = sum(1 for r in rows if "print " in r)
    print(f"corpus: {len(rows):,} top-level functions/classes from the stdlib trees here ({py2:,} hold 'print ')")
    import io
    import contextlib
    for how, part in ((None, rows), ("black", rows[:a.black_rows])):
        with contextlib.redirect_stderr(io.StringIO()):
            serial, invalid = measure(part, how, 1)
            pool, _ = measure(part, how, a.workers)
        name = "ast.parse only" if how is None else "ast.parse + black"
        print(f"{name} ({len(part):,} rows): invalid rate {invalid:.1%}; serial {serial:,.0f} rows/s, pool of {a.workers} "
              f"{pool:,.0f} rows/s: speedup {pool / serial:.2f}x (target >= 1.8x on 2 cores)")


if __name__ == "__main__":
    main()
