"""How soon the default (learned) stall limit names a hang, and whether it ever calls a healthy
run's eval or checkpoint pause a stall: both ways, with the integrations' ``expect()`` and
without it.

    python benchmarks/stall_limit.py [--seeds 6] [--hours 3]
    python benchmarks/stall_limit.py --real [--rhythms 1,5,10,30] [--reps 2] [--slow-reps 1] [--parallel 6]

``--real`` (issue 35) runs real trainers instead (``benchmarks/rhythm_loop.py``: a run under way,
then real steps of --every s, half a forward pass in Python, half a wait for the batch) under the
real ``scripts/watchdog.py RUN --poll 5`` (the defaults otherwise), both ways in the one run:
``before`` with ``--hang-window 0`` (the clock alone, the behaviour before the frames' evidence),
``after`` with the default. Per rhythm: hangs between steps (after record 29, an eval due, and
after record 27, none due: alternate repetitions), hangs halfway through the unannounced eval due
at record 30 (3 steps long), and healthy runs (an unannounced eval of 3 steps, an unannounced
save of max(2 steps, 25 s), a forward pass of 3 steps in Python, then the sentinel). It prints
seconds from the hang's start to the watchdog's exit with a stall line naming the hung frame
(median / max, count) and the healthy runs that ended in an anomaly (false hangs). A 30 s rhythm
takes ~9 minutes a run before; all runs go --parallel at a time.

Record streams are simulated in record time (no sleeping: the figures do not depend on this
machine's speed) and fed to the real ``rules.StallClock`` with the real ``Thresholds``, record by
record, as the watchdog folds them. A healthy run logs a step record every L s (jitter x0.85-1.15,
one gap in a hundred x2-3: a hiccup), pauses at each epoch's end (5-15 s, the DataLoader starting
again), and every ~10 min evaluates for E s then saves a checkpoint for S s; "with expect()" the
pauses are announced as ``supervise.hf.TrainerTelemetry`` announces them (an eval from the second
one on, max(60, 2 x the last eval); every save, max(120, 3 x the last save)), "without" nothing is.

- false stalls: healthy runs in which some silence outlasted the limit the watchdog held then
  (with the deadline wake every such silence is seen; with a fixed poll only those a poll
  lands in);
- time to verdict: a hang begins right after a step record at a random moment after the third
  eval (between evals: most hangs), or inside an eval (the eval never ends); seconds from the
  last record to the verdict, the capture of the stacks not included (<= 4 s more).

Configurations: ``before`` is the previous clock (one longest gap, eval pauses included) with a
fixed 30 s poll and --min-stall 120; the others are the current clock (steps and eval pauses kept
apart) with the watchdog waking at the stall deadline, for several --min-stall / --stall-factor.
"""
from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import sys
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from supervise.observe.records import StallClock  # noqa: E402
from supervise.thresholds import Thresholds  # noqa: E402

POLL = 30.0


class LongestGapClock:
    """The clock before issue 26: --stall-factor x the longest gap between any two records."""

    def __init__(self, th: Thresholds):
        self.th, self.longest_gap, self.expect, self._last_t, self.steps, self.evals = th, 0.0, None, None, 0, 0

    def update(self, rec, kind):
        t = rec.get("t")
        if kind in ("step", "eval", "fatal") and t is not None:
            if self._last_t is not None and t > self._last_t and self.expect is None:
                self.longest_gap = max(self.longest_gap, t - self._last_t)
            self._last_t = t
        self.steps += kind == "step"
        self.evals += kind == "eval"
        self.expect = rec if kind == "expect" else (None if kind is not None else self.expect)

    def limit(self):
        th, after = self.th, self.th.max_stall
        if th.stall_factor > 0 and self.longest_gap > 0 and self.steps >= 20 and self.evals >= 1:
            after = min(after, max(th.min_stall, th.stall_factor * self.longest_gap))
        if self.expect is not None:
            after = max(after, self.expect["seconds"] + th.min_stall)
        return after, ""


@dataclasses.dataclass(frozen=True)
class Config:
    name: str
    clock: type
    min_stall: float
    stall_factor: float = 5.0
    wake: bool = True          # the watchdog looks again at the stall deadline (judge's recheck_in)


CONFIGS = [
    Config("before: one longest gap, min 120s, poll 30s", LongestGapClock, 120.0, wake=False),
    Config("split gaps + deadline wake, min 120s", StallClock, 120.0),
    Config("split gaps + deadline wake, min 60s", StallClock, 60.0),
    Config("split gaps + deadline wake, min 45s", StallClock, 45.0),
    Config("split gaps + deadline wake, min 30s", StallClock, 30.0),
    Config("split gaps + deadline wake, min 45s, x4", StallClock, 45.0, 4.0),
]


def stream(rng: random.Random, every: float, eval_s: float, save_s: float, hours: float, announce: bool,
           hiccups: float = 0.01, own_saves: bool = False):
    """(t, kind, record, where): a healthy run's records in order; ``where`` is 'step', 'eval'
    (the record that ends an eval) or 'expect'. ``own_saves``: the checkpoint is saved every
    ~25 min on its own schedule, between step records, instead of right after each eval."""
    t, step, out = 0.0, 0, []
    out.append((0.0, "start", {"event": "start", "t": 0}, "start"))
    eval_every = max(20, round(600 / every))      # records between evals: ~10 min
    save_every = max(20, round(1500 / every))     # records between saves of their own: ~25 min
    epoch_s = 3000.0
    next_epoch = epoch_s
    records, last_eval, last_save = 0, 0.0, 0.0
    while t < hours * 3600:
        gap = every * rng.uniform(0.85, 1.15) * (rng.uniform(2, 3) if rng.random() < hiccups else 1.0)
        if t >= next_epoch:
            gap += rng.uniform(5, 15)
            next_epoch += epoch_s
        if own_saves and records and records % save_every == 0:
            sv = save_s * rng.uniform(0.8, 1.25)
            if announce:
                out.append((t + 0.01, "expect", {"event": "expect", "t": round(t + 0.01, 3),
                                                  "seconds": max(120.0, 3 * last_save), "why": "save"}, "expect"))
            gap += sv
            last_save = max(last_save, sv)
        t += gap
        step += 10
        records += 1
        out.append((t, "step", {"step": step, "t": round(t, 3), "loss": 0.5}, "step"))
        if records % eval_every == 0:
            e = eval_s * rng.uniform(0.8, 1.25)
            if announce and last_eval:
                out.append((t + 0.01, "expect", {"event": "expect", "t": round(t + 0.01, 3),
                                                  "seconds": max(60.0, 2 * last_eval), "why": "eval"}, "expect"))
            t += e
            last_eval = e
            out.append((t, "eval", {"step": step, "t": round(t, 3), "eval_loss": 0.4}, "eval"))
            if own_saves:
                continue
            s = save_s * rng.uniform(0.8, 1.25)
            if announce:
                out.append((t + 0.01, "expect", {"event": "expect", "t": round(t + 0.01, 3),
                                                  "seconds": max(120.0, 3 * last_save), "why": "save"}, "expect"))
            t += s
            last_save = max(last_save, s)
    return out


def run(cfg: Config, recs, rng: random.Random, hangs: int = 6) -> tuple:
    """(false stall seen?, [s to verdict for hangs between evals], [s for hangs inside an eval])."""
    th = Thresholds(min_stall=cfg.min_stall, stall_factor=cfg.stall_factor)
    clock = cfg.clock(th)
    phase = rng.uniform(0, POLL)
    false = False
    between, inside, evals_seen = [], [], 0
    candidates = []
    prev_t: Optional[float] = None
    for i, (t, kind, rec, where) in enumerate(recs):
        if prev_t is not None and kind != "start":
            limit, _ = clock.limit()
            if t - prev_t > limit and _seen(cfg, prev_t + limit, t, phase):
                false = True
        clock.update(rec, kind)
        prev_t = t
        evals_seen += kind == "eval"
        if kind == "step" and evals_seen >= 3:
            nxt = recs[i + 1] if i + 1 < len(recs) else None
            candidates.append((i, nxt is not None and nxt[1] in ("eval", "expect")))
    for i, before_eval in rng.sample(candidates, min(hangs, len(candidates))) + \
            [c for c in candidates if c[1]][:2]:
        clock = cfg.clock(th)
        for t, kind, rec, _ in recs[:i + 1]:
            clock.update(rec, kind)
        last = recs[i][0]
        if before_eval:   # the eval begins (announced when it is) and never ends
            nxt = recs[i + 1]
            if nxt[1] == "expect":
                clock.update(nxt[2], "expect")
                last = nxt[0]
        limit, _ = clock.limit()
        took = _verdict_after(cfg, last, limit, phase) - recs[i][0]
        (inside if before_eval else between).append(took)
    return false, between, inside


def _seen(cfg: Config, deadline: float, next_t: float, phase: float) -> bool:
    """A watchdog looked while the silence was past the limit: with the wake, at the deadline;
    with a fixed poll, when a poll lands between the deadline and the next record."""
    if cfg.wake:
        return next_t > deadline + 0.25
    first = phase + POLL * max(0, -(-(deadline - phase) // POLL))
    return first < next_t


def _verdict_after(cfg: Config, last: float, limit: float, phase: float) -> float:
    deadline = last + limit
    if cfg.wake:
        return deadline + 0.25
    return phase + POLL * max(0, -(-(deadline - phase) // POLL))


# ---------------------------------------------------------------------------- real processes (issue 35)
ROOT = Path(__file__).resolve().parents[1]
LOOP = ROOT / "benchmarks" / "rhythm_loop.py"
WATCHDOG = ROOT / "scripts" / "watchdog.py"


@dataclasses.dataclass
class Job:
    mode: str                  # before (--hang-window 0: the clock alone) | after (the frames' evidence too)
    every: float               # s per step
    where: str                 # step | eval | healthy
    rep: int
    run_dir: Path = None
    trainer: object = None
    watchdog: object = None
    began: float = 0.0
    rc: Optional[int] = None
    line: str = ""
    ended: float = 0.0
    hang_at: Optional[float] = None

    @property
    def name(self):
        return f"{self.mode}-L{self.every:g}-{self.where}-{self.rep}"


def _start(job: Job, base: Path) -> None:
    import subprocess
    job.run_dir = base / job.name
    job.run_dir.mkdir(parents=True)
    log = open(job.run_dir / "train.log", "ab")
    # the history ends with an eval at step record 24 (evals every 6): a hang inside an eval comes in the eval that
    # is due at record 30; a hang between steps after record 29 (an eval due: the clock allows the eval pause)
    # for even reps, after record 27 (none due: the steps' rhythm) for odd ones
    steps = {"eval": 6, "step": 5 if job.rep % 2 == 0 else 3, "healthy": 2}[job.where]
    argv = [sys.executable, "-u", str(LOOP), str(job.run_dir), "--every", f"{job.every:g}", "--steps", str(steps)]
    argv += ["--healthy"] if job.where == "healthy" else ["--hang", job.where]
    job.trainer = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    import time
    end = time.time() + 60
    while time.time() < end and not (job.run_dir / "metrics.jsonl").exists():
        time.sleep(0.1)
    flags = ["--poll", "5"] + (["--hang-window", "0"] if job.mode == "before" else [])
    job.watchdog = subprocess.Popen([sys.executable, str(WATCHDOG), str(job.run_dir), *flags],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    job.began = time.time()


def _finish(job: Job) -> None:
    import os
    import signal
    import time
    job.ended = time.time()
    job.rc = job.watchdog.returncode
    job.line = (job.watchdog.stdout.read() or "").strip().splitlines()[-1:] or [""]
    job.line = job.line[0]
    try:
        os.killpg(job.trainer.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    job.trainer.wait()
    try:
        job.hang_at = float((job.run_dir / "hang_at").read_text())
    except (OSError, ValueError):
        job.hang_at = None


def real(a) -> None:
    """Real trainers (benchmarks/rhythm_loop.py) under the real watchdog with its defaults
    (--poll 5, no --max-stall), both ways: seconds from the hang's start (RUN_DIR/hang_at) to
    the watchdog's exit with its line; healthy runs (an unannounced eval of 3 steps, a save of
    max(2 steps, 25 s), a forward pass of 3 steps) that ended in an anomaly are false hangs."""
    import re
    import shutil
    import tempfile
    import time
    rhythms = [float(x) for x in a.rhythms.split(",")]
    modes = a.modes.split(",")
    jobs = []
    for mode in modes:
        for L in rhythms:
            reps = a.slow_reps if L >= 30 else a.reps
            for where in ("step", "eval"):
                jobs += [Job(mode, L, where, r) for r in range(reps)]
            if a.healthy:
                jobs += [Job(mode, L, "healthy", r) for r in range(a.healthy_reps)]
    jobs.sort(key=lambda j: (-j.every, j.where != "healthy", j.mode))   # the longest first
    base = Path(tempfile.mkdtemp(prefix="stall-real-"))
    todo, running, done = list(jobs), [], []
    t0 = time.time()
    print(f"{len(jobs)} runs, {a.parallel} at a time, in {base}", flush=True)
    try:
        while todo or running:
            while todo and len(running) < a.parallel:
                job = todo.pop(0)
                _start(job, base)
                running.append(job)
            time.sleep(0.5)
            for job in list(running):
                timed_out = time.time() - job.began > a.timeout
                if timed_out:
                    job.watchdog.kill()
                    job.watchdog.wait()
                if job.watchdog.poll() is not None:
                    _finish(job)
                    running.remove(job)
                    done.append(job)
                    print(f"  {time.time() - t0:6.0f}s {job.name}: rc {job.rc} {job.line[:160]}", flush=True)
    finally:
        for job in running:
            job.watchdog.kill()
            _finish(job)
        if not a.keep:
            shutil.rmtree(base, ignore_errors=True)
    frame = {"step": "fetch_batch", "eval": "next_eval_batch"}
    print(f"\nreal processes, the watchdog's defaults (--poll 5, no --max-stall); seconds from the hang's start to the "
          f"verdict, median / max (n); wall {time.time() - t0:.0f}s")
    head = f"{'':8} {'where':16} " + " ".join(f"{f'L={L:g}s':>17}" for L in rhythms)
    print(head)
    for mode in modes:
        for where in ("step", "eval"):
            cells = []
            for L in rhythms:
                mine = [j for j in done if j.mode == mode and j.every == L and j.where == where]
                took, wrong = [], 0
                for j in mine:
                    began = j.hang_at
                    ok = j.rc == 7 and "ANOMALY stall:" in j.line and frame[where] in j.line
                    if began is None or not ok:
                        wrong += 1
                        continue
                    took.append(j.ended - began)
                cell = f"{statistics.median(took):4.0f} / {max(took):4.0f} ({len(took)})" if took else "-"
                cells.append(cell + (f" {wrong} bad" if wrong else ""))
            label = {"step": "between steps", "eval": "inside an eval"}[where]
            print(f"{mode:8} {label:16} " + " ".join(f"{c:>17}" for c in cells))
        if a.healthy:
            healthy = [j for j in done if j.mode == mode and j.where == "healthy"]
            false = [j for j in healthy if j.rc != 0]
            print(f"{mode:8} {'false hangs':16} {len(false)} of {len(healthy)} healthy runs"
                  + "".join(f"; {j.name}: {re.sub(r'Stacks:.*', '', j.line)[:140]}" for j in false))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--hours", type=float, default=3.0)
    ap.add_argument("--hiccups", type=float, default=0.01, help="the share of step gaps that run 2-3x long")
    ap.add_argument("--real", action="store_true", help="real trainers under the real watchdog, before and after the "
                    "frames' evidence (issue 35) instead of the simulated record streams")
    ap.add_argument("--rhythms", default="1,5,10,30", help="--real: s per step, comma-separated")
    ap.add_argument("--modes", default="before,after", help="--real: before (--hang-window 0), after (the default)")
    ap.add_argument("--reps", type=int, default=2, help="--real: hangs per rhythm and place")
    ap.add_argument("--slow-reps", type=int, default=1, help="--real: hangs per place at rhythms of 30 s and more")
    ap.add_argument("--parallel", type=int, default=6, help="--real: runs at a time")
    ap.add_argument("--timeout", type=float, default=900.0, help="--real: s a watchdog may take")
    ap.add_argument("--healthy-reps", type=int, default=1, help="--real: healthy runs per rhythm")
    ap.add_argument("--no-healthy", dest="healthy", action="store_false", help="--real: no healthy runs")
    ap.add_argument("--keep", action="store_true", help="--real: keep the run folders")
    a = ap.parse_args()
    if a.real:
        return real(a)
    intervals = (1.0, 2.0, 5.0, 10.0)
    pauses = ((30.0, 20.0), (120.0, 90.0))   # (eval, save) seconds
    print(f"{a.seeds} runs of {a.hours:g} h per cell and (eval, save) in {pauses} s; L = seconds between step "
          f"records ({a.hiccups:.0%} of gaps 2-3x long); an eval every ~10 min; times: s from the last record to "
          "the verdict (median / max over the hangs)")
    for own, announce in ((False, False), (False, True), (True, False), (True, True)):
        print(f"\n== {'with' if announce else 'without'} expect(), the save "
              f"{'every ~25 min on its own' if own else 'right after each eval'} ==")
        streams = {(L, p): [stream(random.Random(hash((L, p, s, announce, own)) & 0xFFFF), L, p[0], p[1], a.hours,
                                   announce, a.hiccups, own) for s in range(a.seeds)] for L in intervals for p in pauses}
        head = f"{'configuration':44} " + " ".join(f"{f'L={L:g}s':>13}" for L in intervals) + \
            f" {'hang in eval':>13} {'false stalls':>13}"
        print(head)
        for cfg in CONFIGS:
            cells, inside_all, falses, runs = [], [], 0, 0
            for L in intervals:
                took = []
                for p in pauses:
                    for i, recs in enumerate(streams[(L, p)]):
                        false, between, inside = run(cfg, recs, random.Random(i))
                        falses += false
                        runs += 1
                        took += between
                        inside_all += inside
                cells.append(f"{statistics.median(took):5.0f} / {max(took):5.0f}")
            print(f"{cfg.name:44} " + " ".join(f"{c:>13}" for c in cells) +
                  f" {statistics.median(inside_all):5.0f} / {max(inside_all):5.0f} {f'{falses} of {runs}':>13}")


if __name__ == "__main__":
    main()
