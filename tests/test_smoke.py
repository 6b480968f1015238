"""smoke.py on real template runs: passes on a good pipeline, fails with the right row otherwise."""
import shutil
import sys

import pytest

from conftest import ROOT, need, run_script

need("torch")
ROW = {"contract": "contract", "loss": "loss < chance", "auroc": "auroc rises", "checkpoint": "checkpoint",
       "sentinel": "sentinel", "v5": "v5 arguments"}


def rows(out):
    return {line[6:22].strip(): line[:4] for line in out.splitlines() if line[:4] in ("PASS", "FAIL", "SKIP")}


def smoke_run(d, template):
    script = shutil.copy(ROOT / "templates" / template, d)
    # 10,000 x 2 samples in 8 h needs 0.7 sps: the projection fits however busy the machine is
    return run_script("smoke.py", d / "run", "--full-samples", "10000", "--epochs", "2", "--window", "8h",
                      "--", sys.executable, "-u", script, "--out", d / "run", "--smoke", timeout=600)


@pytest.fixture(scope="module")
def torch_smoke(tmp_path_factory):
    d = tmp_path_factory.mktemp("smoke")
    rc, out, err = smoke_run(d, "train_torch.py")
    return d, rc, out


def check_passed(rc, out, reload):
    assert rc == 0, out
    r = rows(out)
    assert set(r.values()) == {"PASS"} and len(r) == 10 and "verdict" in r, out
    assert "killed after the checkpoint at step 20, then relaunched with --resume: the new attempt's first " \
           "step record is step 30" in out  # the resume row
    assert reload in out
    assert out.strip().splitlines()[-1].startswith("SMOKE PASSED")
    assert "h <= window 8.00 h" in out


def test_smoke_passes_on_the_torch_template(torch_smoke):
    d, rc, out = torch_smoke
    check_passed(rc, out, "reloads with load_state_dict(strict=True)")


def test_smoke_passes_on_the_hf_template(tmp_path):
    need("transformers")
    rc, out, _ = smoke_run(tmp_path, "train_hf.py")
    check_passed(rc, out, "reloads (from_pretrained) and a forward pass gives (1, 2) finite logits")


def test_an_existing_run_is_checked_without_a_command(torch_smoke):
    d, _, _ = torch_smoke
    rc, out, _ = run_script("smoke.py", d / "run", "--script", d / "train_torch.py", timeout=300)
    assert rc == 0 and "command" not in rows(out), out


def test_corrupt_line_fails_the_contract_row(torch_smoke, tmp_path):
    d, _, _ = torch_smoke
    run = tmp_path / "run"
    shutil.copytree(d / "run", run)
    with open(run / "metrics.jsonl", "a") as f:
        f.write("Epoch 1: 40%|#### | 9.8it/s\n")
    rc, out, _ = run_script("smoke.py", run, timeout=300)
    assert rc == 7 and rows(out)["contract"] == "FAIL" and ": not JSON" in out


def test_v4_arguments_in_the_script_fail_their_row(torch_smoke, tmp_path):
    d, _, _ = torch_smoke
    bad = tmp_path / "train_v4.py"
    bad.write_text((ROOT / "templates" / "train_hf.py").read_text().replace("eval_strategy=", "evaluation_strategy="))
    rc, out, _ = run_script("smoke.py", d / "run", "--script", bad, timeout=300)
    assert rc == 7 and rows(out)["v5 arguments"] == "FAIL"
    assert "passes evaluation_strategy=, removed in transformers v5" in out


def write_csv(path, texts, labels):
    path.write_text("text,label\n" + "".join(f"{t},{y}\n" for t, y in zip(texts, labels)))


@pytest.mark.parametrize("case,args,row,needle", [
    ("lr_zero", ["--lr", "0"], "loss < chance", "the model learns nothing"),
    ("no_checkpoints", ["--keep", "0"], "checkpoint", "no checkpoint under"),
    ("flipped_labels", ["flipped"], "auroc rises", "the labels are inverted: flip them"),
])
def test_broken_pipelines_fail_the_right_row(case, args, row, needle, tmp_path):
    script = shutil.copy(ROOT / "templates" / "train_torch.py", tmp_path)
    if args == ["flipped"]:
        sys.path.insert(0, str(tmp_path))
        import importlib
        mod = importlib.import_module("train_torch")
        texts, labels = mod.generated_task(2400, 3)
        write_csv(tmp_path / "train.csv", texts[:2000], labels[:2000])
        write_csv(tmp_path / "eval.csv", texts[2000:], [1 - y for y in labels[2000:]])
        args = ["--data", tmp_path / "train.csv", "--eval-data", tmp_path / "eval.csv"]
    rc, out, _ = run_script("smoke.py", tmp_path / "run", "--", sys.executable, "-u", script, "--out",
                            tmp_path / "run", "--smoke", *args, timeout=600)
    assert rc == 7, out
    assert rows(out)[row] == "FAIL" and needle in out, out
    assert out.strip().splitlines()[-1].startswith("SMOKE FAILED")


@pytest.mark.parametrize("args,needle", [
    (["{file}"], "is a file, not a run directory"),
    (["{missing}"], "does not exist; give the command to run after --"),
    (["{dir}", "--window", "soon"], "is not a duration"),
])
def test_bad_usage(args, needle, tmp_path):
    (tmp_path / "f").write_text("x")
    args = [a.format(file=tmp_path / "f", missing=tmp_path / "nope", dir=tmp_path) for a in args]
    rc, out, err = run_script("smoke.py", *args, timeout=300)
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1
