"""TRL's SFTTrainer on a tiny Llama from a config, supervised with supervise.hf.TelemetryCallback,
run as users run it (a shell, output appended to RUN_DIR/train.log) beside the real watchdog."""
import json
import math

import pytest

from conftest import need
from supervised import FAULTS, USER_SCRIPTS, check_verdict, run_supervised, supervised_lines

need("trl")
SCRIPT = "sft_tiny_llama.py"


@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: f.name)
def test_sft_run_under_the_watchdog(fault, tmp_path):
    rc, out, err, recs = run_supervised(SCRIPT, fault, tmp_path)
    check_verdict(fault, rc, out, err, recs, tmp_path / "run")
    if fault.name == "healthy":
        start = recs[0]
        assert start["task"] == "lm" and start["vocab_size"] == 13 and start["total_steps"] == 60
        assert start["chance_loss"] == pytest.approx(math.log(13), abs=1e-5)
        steps = [r for r in recs if "loss" in r]
        assert [r["step"] for r in steps] == [10, 20, 30, 40, 50, 60]
        assert all(math.isfinite(r["loss"]) and r["grad_norm"] > 0 for r in steps)
        evals = [r for r in recs if "eval_loss" in r]
        assert [r["step"] for r in evals] == [20, 40, 60]
        assert evals[-1]["eval_loss"] < 0.5 * start["chance_loss"]  # it learned to count
        assert "eval_mean_token_accuracy" in evals[-1]  # every eval metric passes through


def test_sft_integration_is_two_lines():
    lines = supervised_lines(USER_SCRIPTS / SCRIPT)
    assert len(lines) == 2, lines


TORCHRUN = {"variables": {"ACCELERATE_USE_CPU": "1"}, "runner": ("-m", "torch.distributed.run", "--nproc_per_node", "2")}


@pytest.mark.parametrize("fault", [f for f in FAULTS if f.name in ("healthy", "nan")], ids=lambda f: f.name)
def test_sft_under_torchrun_two_ranks(fault, tmp_path):
    """Real DDP (gloo, CPU): rank 0 alone writes metrics.jsonl, every rank its heartbeat file."""
    rc, out, err, recs = run_supervised(SCRIPT, fault, tmp_path, **TORCHRUN)
    run = tmp_path / "run"
    check_verdict(fault, rc, out, err, recs, run)
    starts = [r for r in recs if r.get("event") == "start"]
    assert len(starts) == 1 and starts[0]["world_size"] == 2 and starts[0]["rank"] == 0
    beats = {n: [json.loads(x) for x in (run / "ranks" / f"rank-{n}.jsonl").read_text().splitlines()]
             for n in (0, 1)}
    assert {b["rank"] for b in beats[1]} == {1} and beats[0][0]["pid"] != beats[1][0]["pid"]
    if fault.name == "healthy":
        assert [b["step"] for b in beats[0]] == [b["step"] for b in beats[1]] == [10, 20, 30, 40, 50, 60]
    else:  # each rank raised at the same step: rank 1's FATAL stays in its own file
        assert any("FATAL" in b for b in beats[1])
