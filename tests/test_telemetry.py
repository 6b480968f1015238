"""supervise.telemetry.Telemetry: the contract v0.2 writer, alone and in a user's plain loop."""
import json
import math
import os
import subprocess
import sys
from decimal import Decimal

import pytest

from conftest import ROOT, need
from supervised import FAULTS, USER_SCRIPTS, check_verdict, run_supervised, supervised_lines
from supervise.telemetry import Telemetry


def lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


class Scalar:
    """Anything float() accepts, as a tensor or a numpy scalar is."""

    def __init__(self, v):
        self.v = v

    def __float__(self):
        return float(self.v)


@pytest.mark.parametrize("fields, chance", [
    ({"task": "classification", "num_labels": 3}, math.log(3)),
    ({"task": "lm", "vocab_size": 50304}, math.log(50304)),
    ({"task": "regression"}, None),
    ({"task": "classification"}, None),  # no label count, no chance level
], ids=["classification", "lm", "regression", "unknown-labels"])
def test_start_record(tmp_path, monkeypatch, fields, chance):
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    Telemetry(tmp_path, total_steps=100, batch_size=8, **fields).close()
    (start,) = lines(tmp_path / "metrics.jsonl")
    assert start["event"] == "start" and start["t"] == 0 and start["task"] == fields["task"]
    assert start["chance_loss"] == (pytest.approx(chance, abs=1e-5) if chance else None)
    assert start["rank"] == 0 and start["world_size"] == 1 and start["attempt"] == 1
    assert start["argv"] == sys.argv and start["cwd"] and start["time"] > 1.7e9 and start["pid"] > 0
    assert len(start["run_id"]) == 32 and start["total_steps"] == 100 and start["batch_size"] == 8


def test_steps_evals_expect_and_the_sentinel(tmp_path):
    tm = Telemetry(tmp_path, task="lm", vocab_size=100, batch_size=4)
    tm.step(10, Scalar(2.5), lr=Scalar(1e-3), grad_norm=Scalar(0.7), tokens=Scalar(4096))
    tm.step(20, 2.0, lr=1e-3, grad_norm=0.5)
    tm.expect(600, "eval")
    tm.eval(20, loss=Scalar(1.9), eval_auroc=0.8, perplexity=6.7)
    tm.done(eval_loss=1.9, note="best")
    start, s10, s20, expect, ev = lines(tmp_path / "metrics.jsonl")
    assert s10 == {"step": 10, "t": s10["t"], "loss": 2.5, "lr": 1e-3, "grad_norm": 0.7,
                   "tokens": 4096.0}   # no sps: nothing measured yet, so left out (never null)
    assert s20["sps"] > 0 and s20["t"] >= s10["t"]  # measured from batch_size once two steps exist
    assert expect == {"event": "expect", "t": expect["t"], "seconds": 600.0, "why": "eval"}
    assert {k for k in ev if k.startswith("eval_")} == {"eval_loss", "eval_auroc", "eval_perplexity"}
    final = json.loads((tmp_path / "final_val_metrics.json").read_text())
    assert final == {"run_id": start["run_id"], "attempt": 1, "step": 20, "eval_loss": 1.9, "note": "best"}
    beats = lines(tmp_path / "ranks" / "rank-0.jsonl")
    assert [b["step"] for b in beats] == [10, 20]
    assert set(beats[1]) == {"rank", "local_rank", "host", "pid", "step", "t", "time", "sps"} | set(NS)
    assert all({k: b[k] for k in NS} == NS for b in beats) and {k: start[k] for k in NS} == NS


def namespace() -> dict:
    """What this process's /proc says of its PID namespace and boot (contract v0.4), read
    another way than the writer does: the namespace link's text, the boot id's file."""
    out = {}
    try:
        out["pid_ns"] = int(os.readlink("/proc/self/ns/pid").removeprefix("pid:[").rstrip("]"))
        out["boot_id"] = open("/proc/sys/kernel/random/boot_id").read().strip()
    except OSError:   # no /proc namespaces (macOS): both left out of the records
        pass
    return out


NS = namespace()


def test_sps_is_measured_from_a_mark_over_all_ranks(tmp_path):
    """mark(step): training runs from here (start, resume, after a save); sps = samples per
    second across all ranks (batch_size x world_size) since the last step record or mark."""
    import time
    tm = Telemetry(tmp_path, batch_size=4, world_size=2, rank=0)
    tm.mark(100)  # a resumed attempt starts at step 100
    time.sleep(0.05)
    rec = tm.step(110, 1.0)
    tm.close()
    assert rec == lines(tmp_path / "metrics.jsonl")[-1]  # step() returns the record it wrote
    beat = lines(tmp_path / "ranks" / "rank-0.jsonl")[-1]
    assert 0 < beat["sps"] <= 10 * 4 / 0.05 and rec["sps"] == pytest.approx(2 * beat["sps"], rel=1e-3)


@pytest.mark.parametrize("loss, grad_norm, bad", [
    (float("nan"), 1.0, "loss"),
    (Scalar("inf"), 1.0, "loss"),
    (Decimal("NaN"), None, "loss"),
    (0.5, float("nan"), "grad_norm"),
    (0.5, Scalar("-inf"), "grad_norm"),
])
def test_a_non_finite_value_writes_fatal_then_raises(tmp_path, loss, grad_norm, bad):
    with pytest.raises(FloatingPointError, match=f"non-finite {bad}"):
        with Telemetry(tmp_path) as tm:
            tm.step(10, 0.7, grad_norm=1.0)
            tm.step(20, loss, grad_norm=grad_norm)
    recs = lines(tmp_path / "metrics.jsonl")
    assert [r for r in recs if "FATAL" in r] == [recs[-1]]  # once, not again by the context manager
    assert recs[-1]["step"] == 20 and f"non-finite {bad}" in recs[-1]["FATAL"]
    assert [r["step"] for r in recs if "loss" in r] == [10]  # the NaN step itself is not a step record
    assert not (tmp_path / "final_val_metrics.json").exists()


def test_an_exception_in_the_block_writes_its_last_line_as_fatal(tmp_path):
    with pytest.raises(RuntimeError):
        with Telemetry(tmp_path) as tm:
            tm.step(7, 0.6)
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    fatal = lines(tmp_path / "metrics.jsonl")[-1]
    assert fatal["step"] == 7 and fatal["FATAL"] == "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert not (tmp_path / "final_val_metrics.json").exists()


@pytest.mark.parametrize("kwargs, attempts", [
    ({}, [1, 1, 1]),                    # fresh launches: appended, never truncated
    ({"resume": True}, [1, 2, 3]),      # --resume: one more than the start records already there
    ({"attempt": 5}, [5, 5, 5]),        # the caller knows best
])
def test_attempts_append_to_the_same_file(tmp_path, kwargs, attempts):
    ids = []
    for _ in range(3):
        tm = Telemetry(tmp_path, **kwargs)
        tm.step(1, 0.5)
        tm.done()
        ids.append(json.loads((tmp_path / "final_val_metrics.json").read_text())["run_id"])
    starts = [r for r in lines(tmp_path / "metrics.jsonl") if r.get("event") == "start"]
    assert [s["attempt"] for s in starts] == attempts and [s["run_id"] for s in starts] == ids
    assert len(set(ids)) == 3


def test_ranks_from_torchrun_variables(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    with Telemetry(tmp_path, batch_size=8) as worker:
        worker.step(10, 0.5)
        worker.eval(10, loss=0.4)
        worker.fatal(11, "worker saw something")
        worker.done(eval_loss=0.4)
    assert not (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "final_val_metrics.json").exists()
    beat, fatal = lines(tmp_path / "ranks" / "rank-1.jsonl")
    assert beat["rank"] == 1 and beat["local_rank"] == 1 and beat["step"] == 10
    assert fatal["rank"] == 1 and fatal["FATAL"] == "worker saw something"  # a worker's FATAL stays in its file
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    with Telemetry(tmp_path) as chief:
        chief.step(10, 0.5)
    assert lines(tmp_path / "metrics.jsonl")[0]["world_size"] == 2
    assert lines(tmp_path / "ranks" / "rank-0.jsonl")[0]["rank"] == 0


def test_the_marked_block_runs_alone_with_the_standard_library(tmp_path):
    """What a template embeds: the block between the markers, copied into an empty folder."""
    text = (ROOT / "supervise" / "telemetry.py").read_text()
    block = text[text.index("# --- telemetry: begin ---"):text.index("# --- telemetry: end ---")]
    (tmp_path / "alone.py").write_text(block + "\nwith Telemetry('run', task='lm', vocab_size=8) as tm:\n"
                                       "    tm.step(1, 2.0)\n    tm.done(eval_loss=1.0)\n")
    p = subprocess.run([sys.executable, "-I", "-S", "alone.py"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    assert json.loads((tmp_path / "run" / "final_val_metrics.json").read_text())["eval_loss"] == 1.0


SCRIPT = "plain_loop.py"


@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: f.name)
def test_plain_loop_under_the_watchdog(fault, tmp_path):
    need("torch")
    rc, out, err, recs = run_supervised(SCRIPT, fault, tmp_path)
    check_verdict(fault, rc, out, err, recs, tmp_path / "run")
    if fault.name == "healthy":
        steps = [r for r in recs if "loss" in r]
        assert [r["step"] for r in steps] == [10, 20, 30, 40, 50, 60] and steps[-1]["sps"] > 0
        evals = [r for r in recs if "eval_loss" in r]
        assert [r["step"] for r in evals] == [20, 40, 60] and all("eval_perplexity" in r for r in evals)
        assert evals[-1]["eval_loss"] < recs[0]["chance_loss"]


def test_plain_loop_integration_is_five_lines():
    lines_ = supervised_lines(USER_SCRIPTS / SCRIPT)
    assert len(lines_) == 5, lines_
