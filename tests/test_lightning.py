"""A Lightning Trainer (sanity check on, gradient clipping on) supervised with
supervise.lightning.TelemetryCallback, run as users run it beside the real watchdog."""
import dataclasses
import json
import math

import pytest

from conftest import need
from supervised import FAULTS, USER_SCRIPTS, check_verdict, run_supervised, supervised_lines

need("lightning")
SCRIPT = "lightning_lm.py"


@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: f.name)
def test_lightning_run_under_the_watchdog(fault, tmp_path):
    rc, out, err, recs = run_supervised(SCRIPT, fault, tmp_path)
    check_verdict(fault, rc, out, err, recs, tmp_path / "run")
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
        said = [r["why"] for r in recs if r.get("event") == "expect"]   # the silences announced (issue 26)
        assert "save" in said and "eval" in said, said   # every_n_train_steps saves on their own schedule
        assert list((run_dir := tmp_path / "run" / "stacks" / ".live").glob("pid-*.txt")), run_dir  # faulthandler


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


@pytest.mark.parametrize("fault", [f for f in FAULTS if f.name in ("healthy", "nan")], ids=lambda f: f.name)
def test_lightning_ddp_two_processes(fault, tmp_path):
    """Lightning's own DDP launcher (gloo, CPU): rank 0 alone writes metrics.jsonl, every rank its heartbeat."""
    fault = dataclasses.replace(fault, args=fault.args + ("--devices", "2"))
    rc, out, err, recs = run_supervised(SCRIPT, fault, tmp_path)
    run = tmp_path / "run"
    check_verdict(fault, rc, out, err, recs, run)
    starts = [r for r in recs if r.get("event") == "start"]
    assert len(starts) == 1 and starts[0]["world_size"] == 2 and starts[0]["rank"] == 0
    beats = {n: [json.loads(x) for x in (run / "ranks" / f"rank-{n}.jsonl").read_text().splitlines()]
             for n in (0, 1)}
    assert {b["rank"] for b in beats[1]} == {1} and beats[0][0]["pid"] != beats[1][0]["pid"]
    if fault.name == "healthy":
        assert [b["step"] for b in beats[0]] == [b["step"] for b in beats[1]] == [10, 20, 30, 40, 50, 60]
    else:
        assert any("FATAL" in b for b in beats[1])


def test_a_resumed_fit_is_attempt_two_in_the_same_file(tmp_path):
    import lightning as L
    import torch

    from supervise.lightning import TelemetryCallback

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(4, 2)

        def training_step(self, batch, i):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(256, 4), torch.randint(0, 2, (256,)))
    run = tmp_path / "run"

    def fit(steps, ckpt=None):
        trainer = L.Trainer(max_steps=steps, logger=False, enable_progress_bar=False, enable_model_summary=False,
                            accelerator="cpu", devices=1, default_root_dir=tmp_path,
                            callbacks=[TelemetryCallback(run, task="classification", num_labels=2)])
        trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=8), ckpt_path=ckpt)
        return trainer

    first = fit(20)
    ckpt = tmp_path / "after20.ckpt"
    first.save_checkpoint(ckpt)
    fit(30, ckpt)
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    starts = [r for r in recs if r.get("event") == "start"]
    assert [s["attempt"] for s in starts] == [1, 2] and starts[1]["chance_loss"] == pytest.approx(math.log(2), 1e-5)
    assert [r["step"] for r in recs if "loss" in r] == [10, 20, 30]
    assert json.loads((run / "final_val_metrics.json").read_text())["run_id"] == starts[1]["run_id"]
