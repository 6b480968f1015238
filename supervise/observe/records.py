"""The record rules: one small class per kind a record can show, and the fold of a run's records.

Record rules see every record of the current run in order (``update(rec) -> Anomaly | None``)
and ``RecordRules`` keeps their first hit, so what they report never depends on when a poll
lands. Which classes run, in which order of report, and whether a kind is an alarm or a warning
is ``judge.RULES``'s to say (its ``record`` column); the process, rank, scheduler and time rules
are pure functions of one ``Observation`` and live there too. Messages have the one shape of
``vocabulary.anomaly``; thresholds are ``thresholds.Thresholds``. Standard library only: this
is on the hot path.
"""
from __future__ import annotations

import math
import re
from collections import deque
from typing import Optional

from supervise.contract import is_finite, kind_of
from supervise.observe.logs import is_fallout
from supervise.thresholds import Thresholds
from supervise.vocabulary import Anomaly, anomaly, secs, shown


def median(values):
    """statistics.median (any iterable of numbers), without importing statistics (fractions,
    decimal, random: a check-in's start-up): the middle value, or the mean of the two middle ones."""
    data = sorted(values)
    n = len(data)
    if n == 0:
        raise ValueError("no median for empty data")
    i = n // 2
    return data[i] if n % 2 else (data[i - 1] + data[i]) / 2


def chance(n: Optional[int]) -> Optional[float]:
    """The loss of a model that predicts the prior over ``n`` equally likely classes/tokens."""
    return math.log(n) if n and n >= 2 else None


# ---------------------------------------------------------------------------------------------
# The current run: facts derived once, shared by the record rules
SAMPLE_FACTOR = 1.0   # x the median step gap: the silence after which the stacks are sampled (a hang's evidence)
SAMPLE_MIN = 10.0     # s: never sooner (a fast rhythm's ordinary jitter is no reason to look)


class StallClock:
    """The learned stall, in one place (like NVRx's TimeoutsCalc): fed every record's time in
    order, it answers what silence is a stall now, and why. Until the run has shown its rhythm
    (--stall-factor needs 20 step records and an eval) the answer is --max-stall. Then it keeps
    two rhythms apart: the longest gap between step records (the training's own), and the
    longest gap next to an eval record (the eval itself, a save after it). A silence is a stall
    after --stall-factor x the gap it may be: the pause's while an eval is due (the last record
    is an eval, the evals' period in steps or in time has come round, or no second eval has
    shown the period yet), else the steps'; never under --min-stall, never over --max-stall. So
    a hang between evals is named within a few step gaps, and an eval or the save after it is
    never one. An ``expect`` record (an announced eval or save) extends the answer to its
    seconds + --min-stall until the next record; that silence never counts as a gap. A silence
    the watchdog's stacks showed a checkpoint save in (``hold``) is a stall only after --max-stall,
    like an announced save, for as long as that silence lasts."""

    def __init__(self, th: Thresholds):
        self.th = th
        self.step_gap = 0.0         # s: the longest gap between two step records (record time t)
        self.pause_gap = 0.0        # s: the longest gap that begins or ends at an eval record
        self.expect: Optional[dict] = None
        self._last_t: Optional[float] = None
        self._last_kind: Optional[str] = None
        self._last_step: Optional[int] = None
        self._stride: Optional[int] = None      # steps between the last two step records
        self._interval: Optional[float] = None  # s between the last two step records
        self._evals: deque = deque(maxlen=3)    # (step, t) of the last three eval records
        self.steps = self.evals = 0
        self.held: Optional[tuple] = None       # (quiet_since, why): a silence shown to be a save
        self._intervals: deque = deque(maxlen=16)   # s between consecutive step records, the latest

    @property
    def longest_gap(self) -> float:
        return max(self.step_gap, self.pause_gap)

    def update(self, rec: dict, kind: Optional[str]) -> None:
        t, step = rec.get("t"), rec.get("step")
        t = t if is_finite(t) else None
        if kind in ("step", "eval", "fatal") and t is not None:
            if self._last_t is not None and t > self._last_t and self.expect is None:
                gap = t - self._last_t
                if kind == "eval" or self._last_kind == "eval":
                    self.pause_gap = max(self.pause_gap, gap)
                else:
                    self.step_gap = max(self.step_gap, gap)
                    if kind == "step" and self._last_kind == "step":
                        self._interval = gap
                        self._intervals.append(gap)
            self._last_t, self._last_kind = t, kind
        if kind == "step" and isinstance(step, int):
            if self._last_step is not None and step > self._last_step:
                self._stride = step - self._last_step
            self._last_step = step
        if kind == "eval" and isinstance(step, int) and t is not None:
            self._evals.append((step, t))
        self.steps += kind == "step"
        self.evals += kind == "eval"
        if kind == "expect":
            self.expect = rec
        elif kind is not None:
            self.expect = None

    def pause_due(self) -> bool:
        """Whether the silence now may be an eval or a save: the last record is an eval; the
        evals' period has come round (in steps: the last two evals' distance, which is all
        that counts once three evals kept it; else in steps or in record time); or no second
        eval has shown the period yet."""
        if self._last_kind == "eval" or len(self._evals) < 2:
            return True
        evals = list(self._evals)
        (s1, t1), (s2, t2) = evals[-2:]
        by_step = s2 > s1 and self._last_step is not None and self._last_step + (self._stride or 0) >= s2 + (s2 - s1)
        if len(evals) == 3 and s2 - s1 == s1 - evals[0][0] > 0:
            return by_step   # evals every N steps, kept: the step says when the next one comes
        return by_step or (t2 > t1 and self._last_t is not None
                           and self._last_t + (self._interval or 0.0) >= t2 + 0.9 * (t2 - t1))

    def soonest(self) -> float:
        """The shortest stall ``limit`` can answer from here on, whatever records come (gaps only
        grow): --min-stall or --stall-factor x the longest step gap, at most --max-stall. A watchdog
        that looks at least this often meets the first learned deadline too, and the step rhythm's
        after an eval pause."""
        th = self.th
        if th.stall_factor <= 0:
            return th.max_stall
        return min(th.max_stall, max(th.min_stall, th.stall_factor * self.step_gap))

    def sample_after(self) -> float:
        """The silence after which the watchdog samples the run's stacks for hang evidence
        (stacks.FrameWatch): SAMPLE_FACTOR x the median of the latest 16 gaps between consecutive
        step records, never under SAMPLE_MIN (10 s); SAMPLE_MIN before two step records."""
        if not self._intervals:
            return SAMPLE_MIN
        return max(SAMPLE_MIN, SAMPLE_FACTOR * median(self._intervals))

    def hold(self, quiet_since: float, why: str) -> None:
        """The silence that began at ``quiet_since`` (wall clock) is a save the stacks showed (``why``)."""
        self.held = (quiet_since, why)

    def limit(self, quiet_since: Optional[float] = None) -> tuple:
        """(seconds of silence that are a stall now, why: '' or ' (learned: ...)'); ``quiet_since``:
        when the silence now began (a held silence keeps --max-stall while it lasts)."""
        th = self.th
        after, why = th.max_stall, ""
        shown = self.steps >= 20 and self.evals >= 1  # a run without evals keeps --max-stall (a save is silent too)
        if th.stall_factor > 0 and self.longest_gap > 0 and shown:
            due = self.pause_due() and self.pause_gap > self.step_gap
            gap = self.pause_gap if due else self.step_gap
            learned = max(th.min_stall, th.stall_factor * gap)
            if gap > 0 and learned < after:
                after, why = learned, (f" (learned: {th.stall_factor:g} x the longest {'eval pause' if due else 'gap'} "
                                       f"{secs(gap)})")
        if self.expect is not None:
            announced = self.expect["seconds"] + th.min_stall
            if announced > after:
                after, why = announced, f" (announced: {self.expect.get('why') or 'a pause'} of {secs(self.expect['seconds'])})"
        if self.held is not None and quiet_since is not None and self.held[0] == quiet_since and after < th.max_stall:
            after, why = th.max_stall, f" ({self.held[1]})"
        return after, why


# ---------------------------------------------------------------------------------------------
class Run:
    """What the records of the current attempt (after its last start record) have said."""

    RECENT = 64

    def __init__(self, th: Thresholds, start: Optional[dict] = None, num_labels_given: bool = False):
        self.th = th
        self.start = start or {}
        self.num_labels_given = num_labels_given
        self.steps: deque = deque(maxlen=max(self.RECENT, th.sustain, th.spike_window + th.sustain))
        self.last_step = 0
        self.n_steps = self.n_evals = self.unknown = 0
        self.last_eval: Optional[dict] = None
        self.best_eval: Optional[dict] = None
        self.evals: deque = deque(maxlen=8)     # the latest eval records, for check-in's trend
        self.fatal: Optional[dict] = None
        self.stall = StallClock(th)
        self.first_t: Optional[float] = None    # record time of the first and the last step record
        self.first_step: Optional[int] = None
        self.last_t: Optional[float] = None
        self._memo: dict = {}                   # (name, n) -> window, for the newest step record
        # the newest values of the fields the rules' windows read at every record, and the step
        # record count at the newest non-finite one of each (0: none): a window in O(n)
        self._cap = min(2 * max(th.sustain, 1), self.steps.maxlen)
        self._cols: dict = {"loss": [], "sps": []}
        self._bad: dict = {"loss": 0, "sps": 0}
        self._windows: dict = {}                # name -> window(name, --sustain) of the newest record
        self._fixed: dict = {}                  # what the start record fixes for the attempt (chance), once

    @property
    def task(self) -> str:
        task = self.start.get("task")
        return task if isinstance(task, str) and task else "classification"

    @property
    def num_labels(self) -> Optional[int]:
        """Which class count applies: --num-labels when given, else the start record's, else
        the default; for an LM the vocabulary; None for tasks without a chance level."""
        if self.task == "lm":
            return self.start.get("vocab_size") or None
        if self.task != "classification":
            return None
        n = self.start.get("num_labels")
        if not self.num_labels_given and n and n >= 2:
            return n
        return self.th.num_labels

    @property
    def chance(self) -> Optional[float]:
        fixed = self._fixed
        if "chance" not in fixed:
            fixed["chance"] = chance(self.num_labels)
        return fixed["chance"]

    def chance_name(self) -> str:
        return f"ln({self.num_labels})" + (" (vocab)" if self.task == "lm" else "")

    def add(self, rec: dict, kind: Optional[str]) -> None:
        step = rec.get("step")
        if step is not None and step > self.last_step:
            self.last_step = step
        self.stall.update(rec, kind)
        if kind == "step":
            self._add_step(rec)
        elif kind == "fatal":
            self.fatal = self.fatal or rec
        elif kind == "eval":
            self.n_evals += 1
            self.last_eval = rec
            self.evals.append(rec)
            auroc = rec.get("eval_auroc")
            if is_finite(auroc) and (self.best_eval is None or auroc > self.best_eval.get("eval_auroc", -1)):
                self.best_eval = rec
        elif kind is None:
            self.unknown += 1

    def _add_step(self, rec: dict) -> None:
        n_steps = self.n_steps = self.n_steps + 1
        self.steps.append(rec)
        self._memo = {}
        n, cap, bad, windows = self.th.sustain, self._cap, self._bad, {}
        for name, col in self._cols.items():
            v = rec.get(name)
            col.append(v)
            if len(col) > cap:
                del col[0]
            if not is_finite(v):
                bad[name] = n_steps
            if 0 < n <= cap:  # the --sustain window every step rule reads: built here, once
                vals = col[-n:]
                if bad[name] <= n_steps - len(vals):
                    srt, k = sorted(vals), len(vals) // 2   # median(), inline: twice a record
                    windows[name] = (vals, True, srt[k] if len(vals) % 2 else (srt[k - 1] + srt[k]) / 2)
                else:
                    windows[name] = (vals, False, None)
        self._windows = windows
        t = rec.get("t")
        if t is not None:
            if self.first_t is None:
                self.first_t, self.first_step = t, rec["step"]
            self.last_t = t

    @property
    def steps_per_s(self) -> Optional[float]:
        """Steps per second of record time over the attempt's step records, None before two."""
        if self.first_t is None or self.last_t is None or self.last_t <= self.first_t:
            return None
        return (self.last_step - self.first_step) / (self.last_t - self.first_t)

    def recent(self, name: str, n: int) -> list:
        """The last ``n`` step records' values of ``name`` (all of them, finite or not). The
        rules ask for the same few windows at every record: each is built once per record (the
        list is shared: read it, never change it)."""
        col = self._cols.get(name)
        if col is not None and 0 < n and (n <= self._cap or self._cap == self.steps.maxlen):
            return col[-n:]   # the same values: the column holds the newest min(_cap, len(steps))
        key = ("recent", name, n)
        got = self._memo.get(key)
        if got is None:
            steps, size = self.steps, len(self.steps)
            got = self._memo[key] = [steps[i].get(name) for i in range(max(0, size - n), size)] if n > 0 else []
        return got

    def window(self, name: str, n: int) -> tuple:
        """(``recent(name, n)``, whether every value is finite, their median when they all are
        and there are some, else None), built once per record: the rules share it."""
        if n == self.th.sustain and name in self._windows:
            return self._windows[name]
        key = (name, n)
        got = self._memo.get(key)
        if got is None:
            vals = self.recent(name, n)
            bad = self._bad.get(name)
            fin = bad <= self.n_steps - len(vals) if bad is not None and n <= self._cap else all(map(is_finite, vals))
            got = self._memo[key] = (vals, fin, median(vals) if fin and vals else None)
        return got

    def lr_note(self) -> str:
        lr = self.steps[-1].get("lr") if self.steps else None
        return f" (lr = {shown(lr)})" if is_finite(lr) else ""


# ---------------------------------------------------------------------------------------------
# Record rules: each sees every record of the run in order; the engine keeps the first hit
# ---------------------------------------------------------------------------------------------
class RecordRule:
    kind = ""
    on = ("step",)   # record kinds the rule looks at

    def __init__(self, th: Thresholds, run: Run):
        self.th, self.run = th, run

    def update(self, rec: dict) -> Optional[Anomaly]:
        raise NotImplementedError


_NONFINITE = re.compile(r"non-finite|\bnan\b|\binf(inity)?\b", re.I)


class Nan(RecordRule):
    """A non-finite loss, learning rate or grad norm in a step record, a non-finite eval loss, or
    a FATAL that says so (the writers raise on the first NaN and write only the FATAL). A null
    (a NaN through a strict JSON encoder) counts as non-finite for the loss, and for another
    field once the run has reported it as a number: a field never reported is not measured."""
    kind = "nan"
    on = ("step", "eval", "fatal")
    FIELDS = ("loss", "lr", "grad_norm", "eval_loss")
    FIX = ("Abort: lower the learning rate, check the inputs for NaN/Inf and keep "
           "gradient clipping on, then restart from the last good checkpoint")

    def __init__(self, th, run):
        super().__init__(th, run)
        self.measured = {"loss": True}   # the fields this run has reported as a finite number (loss: always)

    def update(self, rec):
        if "FATAL" in rec:
            if not _NONFINITE.search(rec["FATAL"]):
                return None
            step = rec.get("step") if rec.get("step") is not None else self.run.last_step
            return anomaly("nan", f"FATAL = {rec['FATAL'][:160]!r} says a value is not finite", step, self.FIX)
        for name in self.FIELDS:
            if name not in rec:
                continue
            v = rec[name]
            if is_finite(v):
                self.measured[name] = True
            elif v is not None or name in self.measured:
                return anomaly("nan", f"{name} = {'null' if v is None else shown(v)} is not finite", rec["step"],
                               self.FIX)
        return None


class Fatal(RecordRule):
    kind = "fatal"
    on = ("fatal",)

    def update(self, rec):
        if is_fallout(rec["FATAL"]):
            return None  # a peer died first ("connection reset"): its root cause follows from the log
        step = rec.get("step")
        return anomaly("fatal", f"FATAL = {rec['FATAL'][:200]!r} written",
                       step if step is not None else self.run.last_step,
                       "The training script stopped itself: fix the reason it gives, then relaunch")


class InvertedLabels(RecordRule):
    kind = "inverted_labels"
    on = ("eval",)

    def update(self, rec):
        auroc = rec.get("eval_auroc")
        if not is_finite(auroc) or auroc > 1 - self.th.min_auroc:
            return None
        return anomaly("inverted_labels", f"eval_auroc = {shown(auroc)} <= {shown(1 - self.th.min_auroc)}", rec["step"],
                       "The model ranks the classes backwards: the labels are inverted, flip them "
                       "(label = 1 - label) or score the other class's probability")


class StuckAuroc(RecordRule):
    kind = "stuck_auroc"
    on = ("eval",)

    def update(self, rec):
        if "eval_auroc" not in rec or rec["step"] < self.th.min_auroc_step:
            return None
        auroc = rec["eval_auroc"]
        if is_finite(auroc) and auroc >= self.th.min_auroc:
            return None
        return anomaly("stuck_auroc", f"eval_auroc = {shown(auroc)} < {shown(self.th.min_auroc)}", rec["step"],
                       "Still near chance after the warm-up: check the label column and the text/label "
                       "alignment (a shuffled or constant label), then the learning rate")


def _median_finite(values) -> Optional[float]:
    vals = [v for v in values if is_finite(v)]
    return median(vals) if vals else None


class ChanceLoss(RecordRule):
    kind = "chance_loss"

    def update(self, rec):
        if rec["step"] < self.th.chance_step:
            return None
        c, n = self.run.chance, self.th.sustain
        losses, finite, med = self.run._windows["loss"]   # window("loss", --sustain), built by Run.add
        if c is None or len(losses) < n or not finite:
            return None
        if abs(med - c) > self.th.chance_margin * c:
            return None
        return anomaly("chance_loss", f"median loss of the last {n} = {shown(med)} within {self.th.chance_margin:.0%} "
                       f"of {self.run.chance_name()} = {c:.4g}", rec["step"],
                       "The model predicts the prior: check that the learning rate is not 0 or tiny"
                       f"{self.run.lr_note()}, the labels vary, and the loss sees the model's outputs")


class _Sustained(RecordRule):
    """A grad-norm condition held by the last --sustain step records."""

    def holds(self, v: float) -> bool:
        raise NotImplementedError

    def values(self):
        if self.th.sustain < 1:
            return None
        newest = self.run.steps[-1].get("grad_norm") if self.run.steps else None
        if not (is_finite(newest) and self.holds(newest)):
            return None  # the newest is one of the window: the condition does not hold for all
        vals = self.run.recent("grad_norm", self.th.sustain)
        if len(vals) < self.th.sustain:
            return None
        return vals if all(is_finite(v) and self.holds(v) for v in vals) else None


class GradExplode(_Sustained):
    kind = "grad_explode"

    def holds(self, v):
        return v > self.th.grad_high

    def update(self, rec):
        vals = self.values()
        if vals is None:
            return None
        return anomaly("grad_explode", f"grad_norm = {shown(min(vals))} > {shown(self.th.grad_high)} for {len(vals)} records",
                       rec["step"], f"Gradients are exploding: halve the learning rate{self.run.lr_note()} (or "
                       "lengthen the warm-up) and keep max_grad_norm=1.0, then restart from the last checkpoint")


class GradCollapse(_Sustained):
    kind = "grad_collapse"

    def holds(self, v):
        return v < self.th.grad_low

    def update(self, rec):
        vals = self.values()
        if vals is None:
            return None
        med = _median_finite(self.run.recent("loss", self.th.sustain))
        if med is not None and med <= self.th.converged_loss:
            return None  # converged, not collapsed
        return anomaly("grad_collapse", f"grad_norm = {shown(max(vals))} < {shown(self.th.grad_low)} for {len(vals)} records",
                       rec["step"], "Gradients vanished: check for frozen parameters, a learning rate decayed "
                       "to 0, or saturated outputs")


class Diverged(RecordRule):
    """The loss far above where it should be, and finite: a learning rate that is too high.

    Holds when the median of the last --sustain losses is above --diverge-factor times the
    chance loss the start record declares (a loss that rose from the start: its best median came
    from the rising records), or when the last 2 x --sustain losses rose at every record to
    --diverge-factor times where they began (a task without a chance level), or when all of the
    last --sustain losses are above --diverge-factor times max(chance, the run's best median).
    A healthy run's early spikes recover: none of the three holds for them."""
    kind = "diverged"

    def __init__(self, th, run):
        super().__init__(th, run)
        self.best: Optional[float] = None   # the run's best (lowest) rolling median loss

    def _declared_chance(self) -> Optional[float]:
        """The chance loss when the start record (or --num-labels) says what it is: never the
        default label count guessed for a record without a task (it may be an LM's loss)."""
        start, run = self.run.start, self.run
        fixed = run._fixed
        if "declared_chance" not in fixed:
            fixed["declared_chance"] = run.chance if (run.task == "lm" and start.get("vocab_size")) or (
                run.task == "classification" and (start.get("num_labels") or run.num_labels_given)) else None
        return fixed["declared_chance"]

    def _fix(self) -> str:
        return (f"The loss diverged and stays finite: halve the learning rate{self.run.lr_note()}, or add "
                "warm-up and clipping, and restart from the last checkpoint before the rise")

    def update(self, rec):
        n, k = self.th.sustain, self.th.diverge_factor
        if n < 1:
            return None
        losses, finite, med = self.run._windows["loss"]   # window("loss", --sustain), built by Run.add
        if len(losses) < n or not finite:
            return None
        improved = self.best is None or med < self.best
        if improved:
            self.best = med
        c = self._declared_chance()
        if c and med > k * c:
            return anomaly("diverged", f"median loss of the last {n} = {shown(med)} > {shown(k * c)} ({k:g} x chance "
                           f"{self.run.chance_name()} = {c:.4g})", rec["step"], self._fix())
        steps = self.run.steps
        first = steps[-2 * n].get("loss") if len(steps) >= 2 * n else None   # rise[0], read before the list
        rise = self.run.recent("loss", 2 * n) if is_finite(first) and first > 0 and losses[-1] > k * first else ()
        if (len(rise) == 2 * n and all(map(is_finite, rise)) and rise[0] > 0 and rise[-1] > k * rise[0]
                and all(b > a for a, b in zip(rise, rise[1:]))):
            return anomaly("diverged", f"loss rising at each of the last {2 * n} records = {shown(rise[0])} -> "
                           f"{shown(rise[-1])} > {k:g} x where it began", rec["step"], self._fix())
        if improved:
            return None
        ref = max(self.run.chance or 0.0, self.best)
        limit = k * ref
        if ref <= 0 or min(losses) <= limit:
            return None
        return anomaly("diverged", f"median loss of the last {n} = {shown(med)} > {shown(limit)} "
                       f"({k:g} x max(chance {shown(self.run.chance or 0.0)}, best median "
                       f"{shown(self.best)}))", rec["step"], self._fix())


class LossSpike(RecordRule):
    """A loss above --spike-factor x the rolling mean of the records before it, held for
    --sustain records (single spikes are ignored; Megatron/OLMo-style ratio to a rolling mean)."""
    kind = "loss_spike"

    def __init__(self, th, run):
        super().__init__(th, run)
        self.normal: deque = deque(maxlen=max(1, th.spike_window))
        self.held: list = []

    def update(self, rec):
        loss = rec.get("loss")
        if not is_finite(loss):
            return None
        if len(self.normal) == self.normal.maxlen:
            mean = math.fsum(self.normal) / len(self.normal)   # statistics.fmean
            if mean > 0 and loss > self.th.spike_factor * mean:
                self.held.append(loss)
                if len(self.held) >= self.th.sustain:
                    return anomaly("loss_spike", f"loss = {shown(min(self.held))} > {self.th.spike_factor:g} x rolling "
                                   f"mean {shown(mean)} for {len(self.held)} records", rec["step"],
                                   f"A sustained loss spike: lower the learning rate{self.run.lr_note()}, check "
                                   "the data around this step for a bad shard, and restart from the last "
                                   "checkpoint before it")
                return None
        if self.held:
            self.held = []
        self.normal.append(loss)
        return None


class Overfit(RecordRule):
    """Eval loss rising --overfit-evals times in a row while the train loss falls."""
    kind = "overfit"
    on = ("eval",)

    def __init__(self, th, run):
        super().__init__(th, run)
        self.evals: deque = deque(maxlen=max(2, th.overfit_evals + 1))   # (eval_loss, train median)

    def update(self, rec):
        ev = rec.get("eval_loss")
        if not is_finite(ev):
            return None
        self.evals.append((ev, _median_finite(self.run.recent("loss", self.th.sustain))))
        n = self.th.overfit_evals
        if n < 1 or len(self.evals) < n + 1:
            return None
        pts = list(self.evals)[-(n + 1):]
        rising = all(b[0] > a[0] for a, b in zip(pts, pts[1:]))
        train = [p[1] for p in pts]
        falling = None not in train and train[-1] < train[0]
        if not (rising and falling):
            return None
        return anomaly("overfit", f"eval_loss = {shown(pts[-1][0])} > {shown(pts[0][0])} rising for {n} evals while "
                       f"the train loss fell {shown(train[0])} -> {shown(train[-1])}", rec["step"],
                       "The model overfits: keep the best checkpoint, stop early, or add regularization "
                       "(weight decay, dropout, more data)")


class Throughput(RecordRule):
    """Median sps of the last --sustain records below the baseline floor for
    --throughput-window seconds of record time (t). The baseline skips the warm-up; it is the
    records up to --baseline-steps after the step the rule began at (0, or where a --from-now
    watchdog started: its baseline anew)."""
    kind = "throughput"

    def __init__(self, th, run):
        super().__init__(th, run)
        self.origin = run.last_step
        self.baseline: list = []
        self.first_sps: list = []
        self.since: Optional[tuple] = None   # (t, step) when the drop began
        self._floor: Optional[tuple] = None  # ((len(baseline), len(first_sps)), floor()): once per baseline

    def floor(self) -> Optional[tuple]:
        base = self.baseline or self.first_sps[1:]
        if not base:
            return None
        key = (len(self.baseline), len(self.first_sps))   # the lists only grow: their lengths say when
        if self._floor is None or self._floor[0] != key:
            med = median(base)
            self._floor = (key, (med, med * (1 - self.th.throughput_drop)))
        return self._floor[1]

    def update(self, rec):
        step, sps, t = rec["step"], rec.get("sps"), rec.get("t")
        if step - self.origin <= self.th.baseline_steps:
            if is_finite(sps) and sps > 0:
                (self.baseline if step - self.origin > self.th.warmup_steps else self.first_sps).append(sps)
            return None
        f = self.floor()
        recent, finite, med = self.run._windows["sps"]   # window("sps", --sustain), built by Run.add
        if f is None or t is None or len(recent) < self.th.sustain or not finite:
            self.since = None
            return None
        base, floor = f
        if med >= floor:
            self.since = None
            return None
        if self.since is None:
            self.since = (t, step)
            return None
        held = t - self.since[0]
        if held < self.th.throughput_window:
            return None
        return anomaly("throughput", f"median sps = {shown(med)} < {shown(floor)} ({self.th.throughput_drop:.0%} below the "
                       f"baseline {shown(base)}) for {secs(held)} >= {secs(self.th.throughput_window)} since step "
                       f"{self.since[1]}", step,
                       "Throughput collapsed: check nvidia-smi for another process or thermal throttling, "
                       "a starved dataloader (num_workers), or swapping")


class RecordRules:
    """The record rules over the current run. ``add(rec)`` folds one record; a start record
    begins a new run (attempt) and forgets the old one's findings: its FATAL is history.
    ``classes``: the RecordRule classes to run (``judge.RECORD_RULES``, the rule table's record
    column); ``hits``: kind -> the first hit of each, alarms and warnings alike (the judge tells
    them apart)."""

    def __init__(self, th: Thresholds, classes, num_labels_given: bool = False):
        self.th, self.classes, self.num_labels_given = th, tuple(classes), num_labels_given
        self.starts = 0
        self.attempts: list = []   # [start record, its first logged step or None], oldest first
        self._new(None)

    def _new(self, start: Optional[dict]) -> None:
        self.run = Run(self.th, start, self.num_labels_given)
        self.rebase()

    def rebase(self) -> None:
        """Forget the first hits and the rules' own state (their baselines, windows), keeping the
        run's facts (its start, steps, evals, rhythm): what comes next is judged anew (a
        watchdog's --from-now, after an alarm that needs no relaunch)."""
        self.rules = [cls(self.th, self.run) for cls in self.classes]
        self.hits = {}
        self._on = {k: [r for r in self.rules if k in r.on] for k in ("step", "eval", "fatal")}

    def add(self, rec: dict, kind: Optional[str] = "?") -> None:
        """Fold one record (``kind``: its ``kind_of`` when the caller has it)."""
        if kind == "?":
            kind = kind_of(rec)
        if kind == "start":
            self.starts += 1
            self.attempts = self.attempts[-15:] + [[rec, None]]
            self._new(rec)
            return
        if kind == "step" and self.attempts and self.attempts[-1][1] is None:
            self.attempts[-1][1] = rec["step"]   # (a start record returned above)
        self.run.add(rec, kind)
        hits = self.hits
        for rule in self._on.get(kind, ()):
            if rule.kind not in hits:
                found = rule.update(rec)
                if found is not None:
                    hits[rule.kind] = found
