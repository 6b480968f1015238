"""A Lightning Trainer (sanity check on, gradient clipping on) supervised with
supervise.lightning.TelemetryCallback, run as users run it beside the real watchdog."""
import math

import pytest

from supervised import FAULTS, USER_SCRIPTS, check_verdict, run_supervised, supervised_lines

pytest.importorskip("lightning")
SCRIPT = "lightning_lm.py"


@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: f.name)
def test_lightning_run_under_the_watchdog(fault, tmp_path):
    rc, out, recs = run_supervised(SCRIPT, fault, tmp_path)
    check_verdict(fault, rc, out, recs, tmp_path / "run")
    if fault.name == "healthy":
        start = recs[0]
        assert start["task"] == "lm" and start["total_steps"] == 60 and start["batch_size"] == 16
        steps = [r for r in recs if "loss" in r]
        assert [r["step"] for r in steps] == [10, 20, 30, 40, 50, 60]
        # the pre-clip norm: gradient_clip_val=1.0 would cap a post-clip norm at 1
        assert all(math.isfinite(r["loss"]) and r["grad_norm"] > 1.0 for r in steps)
        evals = [r for r in recs if "eval_loss" in r]
        assert [r["step"] for r in evals] == [20, 40, 60]  # never the sanity check's (step 0)
        assert all("eval_acc" in r for r in evals) and evals[-1]["eval_loss"] < evals[0]["eval_loss"]


def test_lightning_integration_is_two_lines():
    lines = supervised_lines(USER_SCRIPTS / SCRIPT)
    assert len(lines) == 2, lines


@pytest.mark.parametrize("key, name", [
    ("val_loss", "loss"), ("val/loss", "loss"), ("val/acc/top1", "acc_top1"), ("validation_auroc", "auroc"),
    ("eval_perplexity", "perplexity"), ("train_loss", None), ("loss", None), ("interval", None),
])
def test_validation_metric_names(key, name):
    from supervise.lightning import eval_name

    assert eval_name(key) == name
