"""The telemetry's share of step time in both templates, measured in one process.

    python benchmarks/telemetry_overhead.py [--steps 200] [--rounds 2]

Two figures per template: (1) the time spent inside the telemetry code itself (timed around
every call) as a share of training time, the robust one; (2) wall time of runs with and
without the telemetry, alternated, as a cross-check (this one carries the machine's noise).
"""
import argparse
import contextlib
import importlib.util
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.update(HF_HUB_DISABLE_PROGRESS_BARS="1", TRANSFORMERS_VERBOSITY="error", TOKENIZERS_PARALLELISM="false")


def load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "templates" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Clock:
    def __init__(self):
        self.spent = 0.0

    def wrap(self, fn):
        def timed(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.spent += time.perf_counter() - t0
        return timed


PUBLIC = ("step", "eval", "expect", "done")


def run(mod, steps, telemetry: bool, clock: Clock):
    """One run of a template. Both embed the same ``Telemetry`` class: with telemetry, every
    call of its public methods is timed; without, they do nothing (same loop, same checks)."""
    argv = ["x", "--out", tempfile.mkdtemp(), "--max-steps", str(steps), "--eval-steps", str(steps)]
    cls = mod.Telemetry
    saved = {name: getattr(cls, name) for name in PUBLIC}
    for name, fn in saved.items():
        setattr(cls, name, clock.wrap(fn) if telemetry else (lambda self, *a, **kw: None))
    old = sys.argv
    sys.argv = argv
    t0 = time.perf_counter()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            mod.main()
    finally:
        sys.argv = old
        for name, fn in saved.items():
            setattr(cls, name, fn)
    return time.perf_counter() - t0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    for name in ("train_hf", "train_torch"):
        mod = load(name)
        with_t, without_t, shares = [], [], []
        run(mod, 20, True, Clock())  # warm up imports and kernels
        for _ in range(a.rounds):
            c = Clock()
            with_t.append(run(mod, a.steps, True, c))
            shares.append(c.spent / with_t[-1])
            without_t.append(run(mod, a.steps, False, Clock()))
        w, wo = statistics.median(with_t), statistics.median(without_t)
        print(f"{name}: telemetry code = {statistics.median(shares):.3%} of run time "
              f"({a.steps} steps, logging every 10); target < 1%")
        print(f"{name}: wall with {w:.2f}s, without {wo:.2f}s, difference {(w - wo) / wo:+.1%} (noise included)")


if __name__ == "__main__":
    main()
