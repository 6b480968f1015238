"""bench.py: real steps of a tiny model, the projection, the verdict, and the OOM retry."""
import json
import sys

import pytest

from conftest import ROOT, need, run_script

torch = need("torch")
need("transformers")
TINY = ("--seq-len", "16", "--batch", "8", "--steps", "4", "--warmup", "1")


def test_fits(tmp_path):
    rc, out, err = run_script("bench.py", *TINY, "--samples", "1000", "--window", "1h", "--eval-samples", "100",
                              timeout=600)  # torch's import alone can take a minute on a busy machine
    assert rc == 0, err
    assert "samples/s: median" in out and out.strip().splitlines()[-1] == "FITS"
    assert "bench: step 5/5 batch 8" in err  # progress on stderr


def test_does_not_fit_gives_the_subsample(tmp_path):
    rc, out, _ = run_script("bench.py", *TINY, "--samples", "100000000", "--epochs", "2", "--window", "10s", "--json",
                            timeout=600)
    assert rc == 7
    facts = json.loads(out)
    assert facts["fits"] is False and 0 < facts["max_samples"] < 100000000
    assert facts["train_s"] == pytest.approx(100000000 * 2 / facts["sps"])
    assert facts["fraction"] == pytest.approx(facts["max_samples"] / 100000000, rel=1e-3)


def test_out_of_memory_halves_the_batch(monkeypatch):
    """No GPU here: the OOM comes from a step that raises torch's own OutOfMemoryError above batch 4."""
    from supervise.tools import bench
    real = bench.time_steps

    def limited(model, vocab, batch, *rest):
        if batch > 4:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(model, vocab, batch, *rest)

    monkeypatch.setattr(bench, "time_steps", limited)
    m = bench.measure_model(seq_len=16, batch=32, steps=3, warmup=0, device="cpu")
    assert m.batch == 4 and m.oom_batches == [32, 16, 8]
    text = bench.report(m, bench.project(m, 1000, 1, 0, None, None), samples=1000, epochs=1.0, precision="fp32",
                        seq_len=16)
    assert "largest batch that fits = 4" in text


def test_command_mode_reads_the_scripts_own_sps(tmp_path):
    cmd = f"{sys.executable} -u {ROOT / 'tests' / 'fake_trainer.py'} {tmp_path} --records 8 --dt 0.01 --sps 250"
    rc, out, err = run_script("bench.py", "--cmd", cmd, "--run-dir", tmp_path, "--samples", "1000000", "--window", "2h",
                              timeout=600)
    assert rc == 0, err
    assert "samples/s: median 250.0" in out and "1,000,000 x 1 epochs / 250.0 sps = 1.11 h" in out


@pytest.mark.parametrize("args,needle", [
    (["--cmd", "true"], "--cmd needs --run-dir"),
    (["--window=-3h"], "must be more than 0"),
    (["--cmd", "true", "--run-dir", "{tmp}"], "wrote no step record"),
])
def test_bad_usage(args, needle, tmp_path):
    rc, out, err = run_script("bench.py", *[a.format(tmp=tmp_path) for a in args], timeout=600)
    errors = [line for line in err.splitlines() if not line.startswith("bench: ")]  # progress lines aside
    assert rc == 2 and len(errors) == 1 and needle in errors[0], err


def test_lm_mode_times_a_causal_lm_built_from_a_config():
    rc, out, err = run_script("bench.py", "--task", "lm", *TINY, "--samples", "1000", "--window", "1h", "--json",
                              timeout=600)
    assert rc == 0, err
    facts = json.loads(out)
    assert facts["sps"] > 0 and facts["fits"] is True and facts["checkpoint_bytes"] > 0
    from supervise.tools.bench import build_model
    model, vocab = build_model(None, 2, 16, "lm")
    assert type(model).__name__ == "LlamaForCausalLM" and vocab == 1000
