"""A phone-friendly PNG of metrics.jsonl: loss with the chance line, eval AUROC with the 0.70
line, grad norm on a log scale with its alarm bands, sps with the -25% line, and the anomaly
marked where the watchdog reported one. A renderer: the series are the metrics file's records,
everything else (thresholds, chance level, verdict) is one ``judge.assess.assess``, check-in's own with --plot. matplotlib (Agg) is
an optional extra."""
from __future__ import annotations

import os
import statistics
import tempfile
from pathlib import Path
from typing import Optional

from supervise.cli import Parser, UsageError, front_door, run_dir_arg
from supervise.contract import is_finite, read_run, why_unreadable
from supervise.judge.assess import assess
from supervise.vocabulary import EXIT_OK, METRICS

MAX_POINTS = 4000


def plot(run_dir, look: Optional[tuple] = None) -> str:
    """Write RUN_DIR/metrics.png atomically; return its path, or a line saying what is missing.
    ``look``: (observer, observation, verdict) of the look the caller rendered (check-in's), so the
    PNG marks the same verdict [one ``judge.assess.assess``]."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed (pip install 'supervising-training-runs[plot]' or pip install matplotlib)"
    run_dir = Path(run_dir)
    unreadable = why_unreadable(run_dir / METRICS)
    if unreadable:
        return f"no plot: {unreadable}"
    _start, steps, evals = read_run(run_dir / METRICS)   # the series drawn: every record, strided
    if not steps and not evals:
        return f"no plot: {run_dir / METRICS} holds no step or eval record yet"
    png = run_dir / "metrics.png"
    if png.is_dir() or not os.access(run_dir, os.W_OK):   # refused before the look, which keeps its scan
        return f"no plot: cannot write {png}: {'it is a directory' if png.is_dir() else 'permission denied'}"
    stride = max(1, len(steps) // MAX_POINTS)
    steps = steps[::stride]
    # the thresholds, chance level and verdict are the watchdog's own: one look by its engine
    observer, _obs, verdict = look or assess(run_dir)
    th, chance, chance_name = observer.th, observer.run.chance, observer.run.chance_name()
    wd_step = verdict.anomaly.step if verdict.anomaly else None

    fig, ax = plt.subplots(4, 1, figsize=(7.2, 10.8), dpi=150, sharex=True)
    xs = [r["step"] for r in steps]

    def series(name):
        return [r.get(name) if is_finite(r.get(name)) else float("nan") for r in steps]

    ax[0].plot(xs, series("loss"), lw=1.2)
    if chance is not None:
        ax[0].axhline(chance, color="grey", ls="--", lw=1, label=f"chance {chance_name}")
    ax[0].set_ylabel("loss")
    ax[1].plot([e["step"] for e in evals], [e.get("eval_auroc") for e in evals], "o-", color="tab:green")
    ax[1].axhline(th.min_auroc, color="red", ls="--", lw=1, label=f"{th.min_auroc:g}")
    ax[1].set_ylim(0, 1.02)
    ax[1].set_ylabel("eval AUROC")
    grads = [g if g and g > 0 else float("nan") for g in series("grad_norm")]
    ax[2].plot(xs, grads, lw=1, color="tab:purple")
    ax[2].set_yscale("log")
    ax[2].axhspan(th.grad_high, max(th.grad_high * 10, max([g for g in grads if g == g] or [1]) * 2), color="red", alpha=0.1)
    ax[2].axhspan(th.grad_low / 10, th.grad_low, color="red", alpha=0.1)
    ax[2].set_ylabel("grad norm")
    sps = series("sps")
    ax[3].plot(xs, sps, lw=1, color="tab:orange")
    base = [s for r, s in zip(steps, sps) if r["step"] <= th.baseline_steps and s == s]
    if base:
        ax[3].axhline(statistics.median(base) * (1 - th.throughput_drop), color="red", ls="--", lw=1,
                      label=f"-{th.throughput_drop:.0%}")
    ax[3].set_ylabel("samples/s")
    ax[3].set_xlabel("step")
    if verdict.anomaly is not None:
        for a in ax:
            a.axvline(wd_step, color="red", lw=2, alpha=0.6)
        ax[0].set_title(f"ANOMALY {verdict.anomaly.kind} at step {wd_step}",
                        color="red", fontsize=11)
    else:
        ax[0].set_title(f"{run_dir.name}: step {max(xs or [0])}", fontsize=11)
    for a in ax:
        a.grid(alpha=0.3)
        if a.get_legend_handles_labels()[0]:
            a.legend(loc="best", fontsize=8)
    fig.tight_layout()
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=".metrics.", suffix=".png", dir=run_dir)
        os.close(fd)
        fig.savefig(tmp, format="png")
        os.replace(tmp, run_dir / "metrics.png")
    except OSError as e:
        return f"no plot: cannot write {run_dir / 'metrics.png'}: {e.strerror or e}"
    finally:
        plt.close(fig)
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)
    return str(run_dir / "metrics.png")


def main(argv=None) -> int:
    p = Parser(prog="plot.py", description="Write RUN_DIR/metrics.png, a phone-friendly snapshot of metrics.jsonl.")
    p.add_argument("run_dir", metavar="RUN_DIR", type=run_dir_arg)
    return front_door(p, lambda a: _main(a.run_dir), argv)


def _main(run_dir: str) -> int:
    if not Path(run_dir).is_dir():
        raise UsageError(f"{run_dir} is not a run directory; pass the folder holding metrics.jsonl")
    out = plot(run_dir)
    if not out.endswith(".png"):
        raise UsageError(f"{out.removeprefix('no plot: ')}")
    print(out)
    return EXIT_OK
