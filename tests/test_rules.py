"""The rules as pure functions: precedence, one shape of message, and the healthy look-alikes."""
import re

import pytest

from supervise.rules import KINDS, RULES, Process, Thresholds, Window, evaluate

TH = Thresholds()
SHAPE = re.compile(r"^ANOMALY (?P<kind>[a-z_]+): .+ (=|is) .+ at step \d+\. [A-Z].+\.$")


def steps(n, start=10, every=10, **over):
    return tuple({"step": start + i * every, "t": i, "loss": 0.3, "lr": 1e-4, "grad_norm": 1.0,
                  "sps": 100.0, **over} for i in range(n))


def win(**kw):
    base = dict(now=1000.0, started=0.0, watch_started=0.0, steps=steps(5), metrics_mtime=999.0,
                last_step=50, processes=(Process(1, "running"),))
    base.update(kw)
    return Window(**base)


CASES = [
    ("nan", win(first_nonfinite=steps(1, loss=float("nan"))[0])),
    ("fatal", win(fatal={"step": 40, "FATAL": "boom"})),
    ("oom", win(processes=(Process(1, "gone"),), log_tail=("RuntimeError: CUDA out of memory.",))),
    ("crash", win(processes=(Process(1, "zombie"),), log_tail=("Traceback (most recent call last):",
                                                              '  File "x.py", line 1', "KeyError: 'label'"))),
    ("dead", win(processes=(Process(1, "gone"),))),
    ("stall", win(processes=(Process(1, "stopped"),))),
    ("stall", win(metrics_mtime=1000.0 - 361)),
    ("no_telemetry", win(steps=(), now=301.0)),
    ("inverted_labels", win(first_inverted={"step": 20, "eval_auroc": 0.2})),
    ("stuck_auroc", win(last_eval={"step": 500, "eval_auroc": 0.6})),
    ("chance_loss", win(steps=steps(5, start=400, loss=0.70))),
    ("grad_explode", win(steps=steps(5, grad_norm=51.0))),
    ("grad_collapse", win(steps=steps(5, grad_norm=1e-4))),
    ("throughput", win(steps=steps(5, start=300, sps=70.0), baseline_sps=(100.0,) * 20)),
    ("gpu_idle", win(gpu_util=0.0, gpu_idle_for=301.0, now=1000.0)),
    ("timeout", win(now=10801.0, metrics_mtime=10800.0)),
]


@pytest.mark.parametrize("kind,window", CASES, ids=[f"{k}-{i}" for i, (k, _) in enumerate(CASES)])
def test_each_kind_fires_with_one_message_shape(kind, window):
    found = evaluate(window, TH)
    assert found is not None and found.kind == kind
    assert SHAPE.match(found.message), found.message
    assert found.message.startswith(f"ANOMALY {kind}: ")


HEALTHY = [
    ("one grad spike", win(steps=steps(4) + steps(1, start=60, grad_norm=1e4))),
    ("four high grads", win(steps=steps(4, grad_norm=80.0))),
    ("grad at 50 exactly", win(steps=steps(5, grad_norm=50.0))),
    ("chance loss before chance-step", win(steps=steps(5, start=100, loss=0.69))),
    ("loss above chance band", win(steps=steps(5, start=400, loss=0.9))),
    ("low auroc before warm-up", win(last_eval={"step": 400, "eval_auroc": 0.55})),
    ("auroc 0.31 is not inverted", win(first_inverted=None, last_eval={"step": 20, "eval_auroc": 0.31})),
    ("throughput dip of 20%", win(steps=steps(5, start=300, sps=80.0), baseline_sps=(100.0,) * 20)),
    ("throughput window overlaps baseline", win(steps=steps(5, start=180, sps=10.0), baseline_sps=(100.0,) * 5)),
    ("silent start inside the grace", win(steps=(), now=299.0)),
    ("old metrics but a fresh watchdog", win(metrics_mtime=0.0, watch_started=900.0)),
    ("gpu idle inside the grace", win(gpu_util=0.0, gpu_idle_for=301.0, now=300.0)),
    ("no gpu", win(gpu_util=None)),
    ("tiny grads on a solved task", win(steps=steps(5, grad_norm=1e-4, loss=1e-4))),
]


@pytest.mark.parametrize("name,window", HEALTHY, ids=[n for n, _ in HEALTHY])
def test_healthy_look_alikes_do_not_fire(name, window):
    assert evaluate(window, TH) is None


@pytest.mark.parametrize("window,kind", [
    (win(first_nonfinite=steps(1, loss=None)[0], processes=(Process(1, "gone"),)), "nan"),
    (win(fatal={"step": 3, "FATAL": "x"}, processes=(Process(1, "gone"),),
         log_tail=("MemoryError",)), "fatal"),
    (win(processes=(Process(1, "gone"),), log_tail=("Traceback (most recent call last):",
                                                    "torch.OutOfMemoryError: CUDA out of memory")), "oom"),
    (win(processes=(Process(1, "gone"),), metrics_mtime=0.0), "dead"),
    (win(first_inverted={"step": 600, "eval_auroc": 0.1}, last_eval={"step": 600, "eval_auroc": 0.1}),
     "inverted_labels"),
])
def test_most_specific_kind_wins(window, kind):
    assert evaluate(window, TH).kind == kind


def test_rules_cover_every_kind():
    assert set(RULES) == set(KINDS) and len(KINDS) == len(set(KINDS))


def test_every_threshold_is_documented():
    for name, default, unit, doc, _ in Thresholds.describe():
        assert unit and len(doc) > 15, name
