"""The learned stall (rules.StallClock) and the watchdog's wake at the stall deadline (issue 26:
hangs found sooner by default, never an eval or a save called a stall). The figures of both ways,
with expect() and without, come from benchmarks/stall_limit.py."""
import dataclasses
import re

import pytest

from conftest import anomaly_line, run_script
from supervise.judge.table import judge
from supervise.observe.observation import Observation, Proc, Records
from supervise.observe.records import StallClock
from supervise.thresholds import Thresholds

TH = Thresholds()


def fed(records, th=TH) -> StallClock:
    clock = StallClock(th)
    for rec in records:
        kind = "expect" if rec.get("event") == "expect" else "eval" if "eval_loss" in rec else "step"
        clock.update(rec, kind)
    return clock


def run(evals=3, every=2.0, eval_s=60.0, steps_per_eval=25, stride=10):
    """Step records every ``every`` s (``stride`` steps apart), an eval of ``eval_s`` s after
    every ``steps_per_eval`` of them (at the same step), ``evals`` times, then 5 more steps."""
    t, step, out = 0.0, 0, []
    for e in range(evals):
        for _ in range(steps_per_eval):
            t, step = t + every, step + stride
            out.append({"step": step, "t": t, "loss": 0.5})
        t += eval_s
        out.append({"step": step, "t": t, "eval_loss": 0.4})
    for _ in range(5):
        t, step = t + every, step + stride
        out.append({"step": step, "t": t, "loss": 0.5})
    return out


def test_before_the_rhythm_shows_the_limit_is_max_stall():
    clock = fed(run(evals=0))
    assert clock.limit() == (TH.max_stall, "")


def test_between_evals_the_step_rhythm_decides_and_an_eval_due_gets_its_pause():
    recs = run(evals=3)
    clock = fed(recs)
    assert clock.step_gap == 2.0 and clock.pause_gap == 60.0
    assert clock.limit() == (45.0, " (learned: 5 x the longest gap 2.0s)")   # --min-stall 45s, 5 x 2s below it
    last = recs[-1]["step"]   # 800; evals at 250, 500, 750: the next at 1000
    t = recs[-1]["t"]
    clock = fed(recs + [{"step": s, "t": t + 2.0 * k, "loss": 0.5} for k, s in enumerate(range(last + 10, 1001, 10), 1)])
    assert clock.pause_due() and clock.limit() == (300.0, " (learned: 5 x the longest eval pause 60s)")
    clock = fed(recs[:-5])   # the last record is an eval: a save may follow it
    assert clock.pause_due() and clock.limit()[0] == 300.0


def test_until_a_second_eval_shows_the_period_every_silence_may_be_a_pause():
    clock = fed(run(evals=1))
    assert clock.pause_due() and clock.limit()[0] == 300.0


def test_an_announced_pause_outlasts_the_learned_limit():
    clock = fed(run(evals=3) + [{"event": "expect", "t": 500.0, "seconds": 600.0, "why": "save"}])
    assert clock.limit() == (600.0 + TH.min_stall, " (announced: save of 600s)")


def test_a_long_step_gap_is_learned_as_the_steps_rhythm():
    recs = run(evals=3)
    recs.insert(30, {"step": recs[29]["step"] + 5, "t": recs[29]["t"] + 20.0, "loss": 0.5})
    recs = [r if i <= 30 else dict(r, t=r["t"] + 20.0) for i, r in enumerate(recs)]
    assert fed(recs).step_gap == 20.0 and fed(recs).limit()[0] == 100.0


@pytest.mark.parametrize("recs, factor, soonest", [
    ([], 5.0, TH.min_stall),                                          # nothing yet: --min-stall
    (run(evals=3), 5.0, TH.min_stall),                                # 2 s steps: 10 s, under --min-stall
    ([{"step": 10 * i, "t": 30.0 * i, "loss": 0.5} for i in range(5)], 5.0, 150.0),   # 30 s steps
    ([{"step": 10 * i, "t": 300.0 * i, "loss": 0.5} for i in range(5)], 5.0, TH.max_stall),
    (run(evals=3), 0.0, TH.max_stall),                                # learning off: --max-stall
], ids=["nothing", "fast-steps", "slow-steps", "capped", "off"])
def test_the_soonest_limit_is_never_above_what_the_clock_answers(recs, factor, soonest):
    clock = fed(recs, th=dataclasses.replace(TH, stall_factor=factor))
    assert clock.soonest() == soonest and clock.soonest() <= clock.limit()[0]


def obs(**kw):
    base = dict(now=1000.0, watch_started=0.0, records=Records(n_steps=30, last_step=300),
                processes=(Proc(1, "sleeping"),), quiet_since=990.0, stall_after=45.0)
    return Observation(**{**base, **kw})


def test_the_watchdog_wakes_at_the_stall_deadline():
    assert judge(obs(), TH).recheck_in == pytest.approx(35.25)    # 990 + 45 - 1000, and a hair
    assert judge(obs(quiet_since=900.0, stall_after=200.0), TH).recheck_in == pytest.approx(100.25)
    early = dict(records=Records(), watch_started=990.0, started=990.0)   # no step record yet: the soonest it may learn
    assert judge(obs(**early), TH).recheck_in == 360.0
    assert judge(obs(**early, stall_soonest=3.0), TH).recheck_in == 3.0
    assert judge(obs(quiet_since=900.0, stall_after=200.0, stall_soonest=4.0), TH).recheck_in == 4.0  # records may come
    assert judge(obs(processes=(Proc(1, "gone"),)), TH).state == "anomaly"


FAST = ("--poll", "0.2", "--startup-grace", "5")


def test_a_hang_between_unannounced_evals_is_named_at_the_step_rhythm(tmp_path, trainer):
    """Evals of 10 s, unannounced: the pause limit is >= 50 s; a hang between evals is named at
    --min-stall (3 s here), long before it."""
    trainer(tmp_path, "--records", 60, "--dt", 0.1, "--eval-every", 100, "--eval-pause", 10, "--hang-at", 270)
    rc, out, err = run_script("watchdog.py", tmp_path, *FAST, "--min-stall", 3, "--no-stacks", timeout=120)
    m = anomaly_line(out)
    assert rc == 7 and m["kind"] == "stall" and int(m["step"]) == 260, out + err
    assert "(learned: 5 x the longest gap" in out, out


def test_an_unannounced_eval_is_no_stall(tmp_path, trainer):
    trainer(tmp_path, "--records", 40, "--dt", 0.1, "--eval-every", 100, "--eval-pause", 10)
    rc, out, err = run_script("watchdog.py", tmp_path, *FAST, "--min-stall", 3, timeout=180)
    assert rc == 0 and out.startswith("OK done: "), out + err


def test_at_the_default_poll_the_first_learned_deadline_is_met(tmp_path, trainer):
    """--poll 30 (the default) and a rhythm of 0.1 s steps: the hang 3 s into the run is named at
    the learned limit (--min-stall 3 s), not at the next 30 s poll."""
    trainer(tmp_path, "--records", 60, "--dt", 0.1, "--eval-every", 100, "--hang-at", 270)
    rc, out, err = run_script("watchdog.py", tmp_path, "--startup-grace", "5", "--min-stall", 3, "--no-stacks",
                              timeout=120)
    m = anomaly_line(out)
    assert rc == 7 and m["kind"] == "stall" and int(m["step"]) == 260, out + err
    age, limit = (float(x) for x in re.search(r"metrics age = ([\d.]+)s > ([\d.]+)s \(learned", out).groups())
    assert limit < age < 15.0, out   # a poll later would say ~27 s
