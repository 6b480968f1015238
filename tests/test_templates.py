"""Both templates, really run on the CPU, each copied alone into an empty folder."""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, need, read_json, start_script
from supervise.contract import validate_file

torch = need("torch")
need("transformers")

ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
       "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false"}
TEMPLATES = ["train_hf.py", "train_torch.py"]
FINAL_KEYS = {"run_id", "attempt", "step", "eval_auroc", "eval_acc", "eval_loss", "best_checkpoint", "best_step",
              "best_auroc", "world_size", "seconds"}


def copy_alone(name, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy(ROOT / "templates" / name, folder / name))


def launch(script: Path, *args, wait=True, timeout=900):  # a hang bound: a full CPU run took > 300 s with both cores busy
    cmd = [sys.executable, "-u", script.name, *map(str, args)]
    if not wait:
        return subprocess.Popen(cmd, cwd=script.parent, env=ENV, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, cwd=script.parent, env=ENV, capture_output=True, text=True, timeout=timeout)


def load_module(script: Path):
    spec = importlib.util.spec_from_file_location(script.stem, script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module", params=TEMPLATES)
def full_run(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param.replace(".py", ""))
    script = copy_alone(request.param, folder)
    p = launch(script, "--out", "run")
    assert p.returncode == 0, p.stderr[-3000:]
    return script, folder / "run"


def test_full_run_keeps_the_contract(full_run):
    script, run = full_run
    assert validate_file(run / "metrics.jsonl", require=("grad_norm", "sps")) == []
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    start = recs[0]
    assert start["event"] == "start" and start["world_size"] == 1 and start["num_labels"] == 2
    assert start["attempt"] == 1 and len(start["run_id"]) == 32 and start["task"] == "classification"
    assert start["argv"] == [script.name, "--out", "run"] and start["cwd"] == str(script.parent)
    steps = [r for r in recs if "loss" in r]
    assert len(steps) >= 30 and all(r["grad_norm"] > 0 and r["sps"] > 0 for r in steps)
    assert start["total_steps"] - 10 < steps[-1]["step"] <= start["total_steps"]
    assert steps[-1]["loss"] < 0.35  # far below chance (0.69)
    final = read_json(run / "final_val_metrics.json")
    assert set(final) == FINAL_KEYS  # one set of keys in both templates
    assert final["eval_auroc"] > 0.9 and final["run_id"] == start["run_id"] and final["step"] == start["total_steps"]
    assert 1 <= len(list((run / "checkpoints").iterdir())) <= 2
    assert read_json(run / "hparams.json")["lr"] > 0  # the resolved config, for a relaunch line
    beats = [json.loads(x) for x in (run / "ranks" / "rank-0.jsonl").read_text().splitlines()]
    assert [b["step"] for b in beats] == [r["step"] for r in steps]  # a heartbeat per logged step


def test_best_checkpoint_reloads_and_reproduces_its_auroc(full_run):
    script, run = full_run
    final = read_json(run / "final_val_metrics.json")
    best = run.parent / final["best_checkpoint"] if not os.path.isabs(final["best_checkpoint"]) \
        else Path(final["best_checkpoint"])
    evals = {r["step"]: r["eval_auroc"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
             if "eval_auroc" in r}
    mod = load_module(script)
    texts, labels = mod.generated_task(mod.SAMPLES + mod.EVAL_SAMPLES, mod.SEED)
    ev_x, ev_y = texts[mod.SAMPLES:], labels[mod.SAMPLES:]
    if script.name == "train_hf.py":
        from transformers import AutoModelForSequenceClassification, AutoTokenizer
        step = int(best.name.split("-")[-1])
        tok = AutoTokenizer.from_pretrained(best)
        model = AutoModelForSequenceClassification.from_pretrained(best).eval()
        enc = tok(ev_x, truncation=True, max_length=mod.MAX_LEN, padding="max_length", return_tensors="pt")
        with torch.no_grad():
            logits = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits
        from sklearn.metrics import roc_auc_score
        auroc = roc_auc_score(ev_y, logits.softmax(-1)[:, 1].numpy())
    else:
        ckpt = torch.load(best)
        step = ckpt["step"]
        model = mod.Classifier(len(ckpt["vocab"]), ckpt["dim"], ckpt["num_labels"])
        model.load_state_dict(ckpt["model"], strict=True)
        auroc = mod.evaluate(model, mod.encode(ev_x, ckpt["vocab"], mod.MAX_LEN), ev_y, torch.device("cpu"))["eval_auroc"]
    assert auroc == pytest.approx(evals[step], abs=1e-4)
    assert auroc == pytest.approx(final["eval_auroc"], abs=1e-4)


@pytest.mark.parametrize("name,lr", [("train_hf.py", "1e20"), ("train_torch.py", "1e4")])
def test_real_divergence_writes_fatal_and_the_watchdog_reports_it(name, lr, tmp_path):
    script = copy_alone(name, tmp_path)
    p = launch(script, "--out", "run", "--lr", lr, "--warmup-steps", "0") if name == "train_hf.py" \
        else launch(script, "--out", "run", "--lr", lr)
    assert p.returncode != 0
    assert "FloatingPointError: non-finite" in p.stderr.strip().splitlines()[-1]
    recs = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    fatal = [r for r in recs if "FATAL" in r]
    assert len(fatal) == 1 and recs[-1] is fatal[0]
    last_ok = max([r["step"] for r in recs if "loss" in r] or [0])
    assert fatal[0]["step"] - last_ok <= 10  # within one logging interval
    w = subprocess.run([sys.executable, str(ROOT / "scripts" / "watchdog.py"), tmp_path / "run", "--poll", "0.2"],
                       capture_output=True, text=True, timeout=30)
    assert w.returncode == 7 and w.stdout.startswith("ANOMALY nan: FATAL = 'non-finite"), w.stdout


def write_csv(path, texts, labels):
    import pandas as pd
    pd.DataFrame({"text": texts, "label": labels}).to_csv(path, index=False)


@pytest.mark.parametrize("name", TEMPLATES)
def test_flipped_eval_labels_wake_the_watchdog_as_inverted(name, tmp_path):
    script = copy_alone(name, tmp_path)
    mod = load_module(script)
    texts, labels = mod.generated_task(4600, 1)
    write_csv(tmp_path / "train.csv", texts[:4000], labels[:4000])
    write_csv(tmp_path / "eval.csv", texts[4000:], [1 - y for y in labels[4000:]])
    (tmp_path / "run").mkdir()
    trainer = launch(script, "--out", "run", "--data", "train.csv", "--eval-data", "eval.csv", "--epochs", "3",
                     wait=False)
    try:
        wd = start_script("watchdog.py", tmp_path / "run", "--poll", "0.3", "--pid", trainer.pid)
        out, err = wd.communicate(timeout=240)
    finally:
        trainer.kill()
        trainer.communicate()
    assert wd.returncode == 7, out + err
    assert out.startswith("ANOMALY inverted_labels: eval_auroc = ") and "flip them" in out


@pytest.mark.parametrize("name", TEMPLATES)
@pytest.mark.parametrize("labels,line", [
    ([1] * 50, "error: label column 'label' in train holds only [1]; every class 0..1 must be present "
               "(check the split or the sampling)"),
    ([0, 1, 2] * 20, "error: label column 'label' in train holds 2; labels must be integers in [0, 2) "
                     "(set --num-labels or map the labels)"),
])
def test_bad_labels_stop_at_start_up_with_one_line(name, labels, line, tmp_path):
    script = copy_alone(name, tmp_path)
    write_csv(tmp_path / "d.csv", [f"text {i}" for i in range(len(labels))], labels)
    p = launch(script, "--out", "run", "--data", "d.csv")
    assert p.returncode != 0
    assert p.stderr.strip().splitlines() == [line]
    assert not (tmp_path / "run" / "final_val_metrics.json").exists()


@pytest.mark.parametrize("full_run", ["train_hf.py"], indirect=True)  # --model PATH_OR_NAME is the HF template's
def test_hf_template_loads_a_saved_model(full_run, tmp_path):
    script, run = full_run
    saved = tmp_path / "saved"
    best = read_json(run / "final_val_metrics.json")["best_checkpoint"]
    shutil.copytree(run.parent / best, saved)
    mine = copy_alone("train_hf.py", tmp_path / "job")
    p = launch(mine, "--out", "run", "--model", saved, "--max-steps", "20", "--eval-steps", "10", "--lr", "1e-4")
    assert p.returncode == 0, p.stderr[-2000:]
    assert read_json(tmp_path / "job" / "run" / "final_val_metrics.json")["eval_auroc"] > 0.9  # it started trained


def test_torchrun_two_processes_write_one_metrics_file(tmp_path):
    script = copy_alone("train_torch.py", tmp_path)
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                        "--master_port", "29517", script.name, "--out", "run", "--max-steps", "60",
                        "--eval-steps", "30"], cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    recs = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    starts = [r for r in recs if r.get("event") == "start"]
    assert len(starts) == 1 and starts[0]["world_size"] == 2  # rank 0 alone writes
    steps = [r["step"] for r in recs if "loss" in r]
    assert steps == sorted(set(steps)) and steps[-1] == 60
    assert read_json(tmp_path / "run" / "final_val_metrics.json")["world_size"] == 2
    for rank in (0, 1):  # every rank beats, rank 0 too
        beats = [json.loads(x) for x in (tmp_path / "run" / "ranks" / f"rank-{rank}.jsonl").read_text().splitlines()]
        assert [b["step"] for b in beats] == steps and {b["rank"] for b in beats} == {rank}


def section(text, title):
    """The lines from a '# ---...--- <title>' banner to the next banner."""
    lines = text.splitlines()
    i = next(n for n, ln in enumerate(lines) if ln.startswith("# ---") and ln.endswith(title))
    j = next(n for n in range(i + 1, len(lines)) if lines[n].startswith("# -----"))
    return "\n".join(lines[i:j])


def test_the_templates_share_one_shape():
    """One data section (inputs, label handling), one set of flags, one config block layout."""
    import re
    texts = {n: (ROOT / "templates" / n).read_text() for n in TEMPLATES}
    hf, pt = texts["train_hf.py"], texts["train_torch.py"]
    assert section(hf, "data (same in both templates)") == section(pt, "data (same in both templates)")
    flags = {n: re.findall(r'add_argument\("(--[a-z-]+)"', t) for n, t in texts.items()}
    assert flags["train_hf.py"] == flags["train_torch.py"]
    assert {"--resume", "--batch-size", "--grad-accum", "--lr", "--keep", "--out", "--smoke"} <= set(flags["train_hf.py"])
    for t in texts.values():
        assert "def die(msg):" in t and "hparams.json" in t


RUNNER = """import runpy, sys
mode, script, root = sys.argv[1:4]
if mode == "copy":
    sys.modules["supervise"] = None  # as where the package is not installed: the template's own copies
else:
    sys.path.insert(0, root)
sys.argv = [script, *sys.argv[4:]]
g = runpy.run_path(script, run_name="__main__")
print("integration:", *sorted({g[n].__module__ for n in ("Telemetry", "TrainerTelemetry") if n in g}))
"""


@pytest.mark.parametrize("name", TEMPLATES)
def test_the_installed_package_and_the_copy_write_the_same_run(name, tmp_path):
    """Where supervise is importable a template runs its Telemetry (and supervise.hf's
    TrainerTelemetry); copied alone, the verbatim copies: the same records, the same losses."""
    runs = {}
    for mode, want in (("copy", "__main__"), ("package", "supervise.hf supervise.telemetry" if name == "train_hf.py"
                                                   else "supervise.telemetry")):
        script = copy_alone(name, tmp_path / mode)
        p = subprocess.run([sys.executable, "-c", RUNNER, mode, script.name, str(ROOT), "--out", "run", "--samples",
                            "400", "--max-steps", "20", "--eval-steps", "10", "--logging-steps", "5"],
                           cwd=script.parent, env=ENV, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        assert f"integration: {want}\n" in p.stdout, p.stdout[-500:]
        run = script.parent / "run"
        assert validate_file(run / "metrics.jsonl", require=("grad_norm", "sps")) == []
        runs[mode] = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()], \
            read_json(run / "final_val_metrics.json")
    (copy, copy_final), (pkg, pkg_final) = runs["copy"], runs["package"]
    assert [sorted(r) for r in copy] == [sorted(r) for r in pkg]  # the same records, field for field
    assert [(r["step"], r["loss"]) for r in copy if "loss" in r] == \
        [(r["step"], pytest.approx(r["loss"], rel=1e-5)) for r in pkg if "loss" in r]
    assert all(r["sps"] > 0 for r in copy + pkg if "loss" in r)  # the first record's too (Telemetry.mark)
    assert set(copy_final) == set(pkg_final) == FINAL_KEYS
