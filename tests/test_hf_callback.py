"""supervise.hf.TelemetryCallback on the real HF Trainer, tiny models built from configs, on CPU."""
import json
import math

import pytest

from conftest import need

torch = need("torch")
transformers = need("transformers")
from transformers import (BertConfig, BertForSequenceClassification, Trainer, TrainerCallback,  # noqa: E402
                          TrainingArguments)

from supervise.hf import TelemetryCallback  # noqa: E402


class Pairs(torch.utils.data.Dataset):
    """Label 1 when token 3 occurs in the sequence: learnable in a few dozen steps."""

    def __init__(self, n, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randint(4, 30, (n, 8), generator=g)
        self.y = torch.randint(0, 2, (n,), generator=g)
        self.x[self.y == 1, 0] = 3

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "attention_mask": torch.ones(8, dtype=torch.long), "labels": self.y[i]}


def tiny_bert():
    torch.manual_seed(0)
    return BertForSequenceClassification(BertConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1,
                                                    num_attention_heads=2, intermediate_size=32,
                                                    max_position_embeddings=16, num_labels=2))


class NaNWeightsAt(TrainerCallback):
    """The failure under test: every weight turns NaN at the end of optimizer step `step`."""

    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, model=None, **kw):
        if state.global_step == self.step:
            with torch.no_grad():
                for p in model.parameters():
                    p.fill_(float("nan"))


class OutsideLoss(Trainer):
    """Computes the loss outside the model, as DPO and GRPO do: the model output carries none."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        out = model(**inputs)
        loss = torch.nn.functional.cross_entropy(out.logits, labels)
        return (loss, out) if return_outputs else loss


def records(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("trainer_cls", [Trainer, OutsideLoss], ids=["model-loss", "loss-outside-model"])
def test_default_args_nan_at_step_25_stops_with_fatal_within_10_steps(tmp_path, trainer_cls):
    run = tmp_path / "run"
    args = TrainingArguments(output_dir=str(tmp_path / "out"))  # every other argument at its default
    assert args.logging_nan_inf_filter is True and args.logging_steps == 500
    trainer = trainer_cls(model=tiny_bert(), args=args, train_dataset=Pairs(800),
                          callbacks=[TelemetryCallback(run), NaNWeightsAt(25)])  # the 1 added line
    with pytest.raises(FloatingPointError, match="non-finite"):
        trainer.train()
    recs = records(run)
    fatal = [r for r in recs if "FATAL" in r]
    assert len(fatal) == 1 and 25 < fatal[0]["step"] <= 35, fatal
    assert trainer.state.global_step <= 35  # training really stopped there
    assert [r["step"] for r in recs if "loss" in r] == [10, 20]  # every 10 steps, all finite
    assert not (run / "final_val_metrics.json").exists()  # no sentinel after an exception


def test_healthy_run_writes_steps_every_eval_metric_and_the_sentinel(tmp_path):
    run = tmp_path / "run"

    def metrics(p):
        return {"acc": float((p.predictions.argmax(-1) == p.label_ids).mean())}

    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=60, eval_strategy="steps",
                             eval_steps=20, logging_steps=20, learning_rate=5e-3, report_to="none")
    trainer = Trainer(model=tiny_bert(), args=args, train_dataset=Pairs(400), eval_dataset=Pairs(64, seed=1),
                      compute_metrics=metrics, callbacks=[TelemetryCallback(run)])
    trainer.train()
    recs = records(run)
    start = recs[0]
    assert start["event"] == "start" and start["task"] == "classification" and start["num_labels"] == 2
    assert start["chance_loss"] == pytest.approx(math.log(2), abs=1e-5)
    assert start["total_steps"] == 60 and start["batch_size"] == 8 and start["world_size"] == 1
    assert start["attempt"] == 1 and len(start["run_id"]) == 32
    steps = [r for r in recs if "loss" in r]
    assert [r["step"] for r in steps] == [10, 20, 30, 40, 50, 60]
    assert all(math.isfinite(r["loss"]) and r["lr"] is not None for r in steps)
    assert all(r["grad_norm"] > 0 for r in steps if r["step"] % 20 == 0)  # the Trainer's pre-clip norm
    assert all(r["sps"] > 0 for r in steps[1:])
    evals = [r for r in recs if any(k.startswith("eval_") for k in r)]
    assert [r["step"] for r in evals] == [20, 40, 60]
    assert all({"eval_loss", "eval_acc"} <= set(r) for r in evals)
    assert any(r.get("event") == "expect" and r["why"] == "eval" for r in recs)  # after the first eval
    final = json.loads((run / "final_val_metrics.json").read_text())
    assert final["run_id"] == start["run_id"] and final["step"] == 60 and "eval_acc" in final
    beats = [json.loads(x) for x in (run / "ranks" / "rank-0.jsonl").read_text().splitlines()]
    assert [b["step"] for b in beats] == [10, 20, 30, 40, 50, 60] and beats[0]["rank"] == 0
    live = [json.loads(p.read_text().splitlines()[0]) for p in (run / "stacks" / ".live").glob("pid-*.txt")]
    assert any(h["registered"] and h["rank"] == 0 for h in live), live   # a hang's stacks: faulthandler (issue 26)


def test_a_resumed_trainer_is_attempt_two_in_the_same_file(tmp_path):
    run = tmp_path / "run"
    out = tmp_path / "out"
    args = TrainingArguments(output_dir=str(out), max_steps=20, save_steps=10, report_to="none")
    Trainer(model=tiny_bert(), args=args, train_dataset=Pairs(200), callbacks=[TelemetryCallback(run)]).train()
    args = TrainingArguments(output_dir=str(out), max_steps=30, save_steps=10, report_to="none")
    Trainer(model=tiny_bert(), args=args, train_dataset=Pairs(200),
            callbacks=[TelemetryCallback(run)]).train(resume_from_checkpoint=str(out / "checkpoint-20"))
    starts = [r for r in records(run) if r.get("event") == "start"]
    assert [s["attempt"] for s in starts] == [1, 2] and starts[0]["run_id"] != starts[1]["run_id"]
    assert [r["step"] for r in records(run) if "loss" in r] == [10, 20, 30]
    assert json.loads((run / "final_val_metrics.json").read_text())["run_id"] == starts[1]["run_id"]


def test_a_misspelt_argument_fails_at_construction_not_mid_run(tmp_path):
    with pytest.raises(TypeError, match=r"unknown arguments \['num_label'\]"):
        TelemetryCallback(tmp_path, num_label=2)
