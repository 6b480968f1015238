"""How soon the default (learned) stall limit names a hang, and whether it ever calls a healthy
run's eval or checkpoint pause a stall: both ways, with the integrations' ``expect()`` and
without it.

    python benchmarks/stall_limit.py [--seeds 6] [--hours 3]

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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--hours", type=float, default=3.0)
    ap.add_argument("--hiccups", type=float, default=0.01, help="the share of step gaps that run 2-3x long")
    a = ap.parse_args()
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
