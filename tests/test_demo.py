"""The README's main job: the whole procedure on the shipped task, run once healthy and once with a
real fault.

The fault is ``--fault dead``, a SIGKILL of the trainer the launcher detached: the one path that no
other test takes end to end (the watchdog, given no --pid, finds a launched trainer from launch.json,
the trainer dies as an orphan that init reaps, and the line names it from its rank-0 heartbeat).
The demo's other faults are the template's own paths, run elsewhere: ``--fault nan`` is ``--lr 1e4``
on train_torch.py (test_templates.py::test_real_divergence_writes_fatal_and_the_watchdog_reports_it),
``--fault inverted`` is the eval labels flipped (test_templates.py::
test_flipped_eval_labels_wake_the_watchdog_as_inverted, on the very data the demo writes: see below)."""
import re

import pytest

from conftest import ROOT, kind_of, need, run_script


@pytest.mark.parametrize("fault", [None, "dead"], ids=["healthy", "dead"])
def test_demo(fault, tmp_path):
    need("torch")
    # an 8-hour window: the projection (12,000 samples at >= 0.42 sps) fits however busy the machine is
    rc, out, err = run_script("demo.py", "--out", tmp_path / "run", "--window", "8h",
                              *(["--fault", fault] if fault else []), timeout=1800)  # a hang bound: ~13 min with both cores busy
    assert rc == 0, out[-3000:] + err[-2000:]
    for mark in ("2. bench", "FITS", "3. audit", "kept", "4. smoke", "SMOKE PASSED", "launch, one line, detached",
                 "6. watchdog", "7. check-in:", "snapshot: "):
        assert mark in out, (mark, out[-3000:])
    (said,) = re.findall(r"^\[demo\] watchdog exited (\d+): (.*)$", out, re.M)
    code, line = int(said[0]), said[1]
    if fault is None:
        assert code == 0 and line.startswith("OK done: final_val_metrics.json written at step "), line
    else:
        assert "fault: kill -9 " in out, out[-3000:]
        assert code == 7 and kind_of(line) == "dead" and line.startswith("ANOMALY dead: rank 0 (pid "), line
    assert (tmp_path / "run" / "metrics.png").exists()
    assert not (tmp_path / "run" / "eval.csv").exists() and not (tmp_path / "run" / "train.csv").exists()  # no flipped data
    assert "against a window of 8.00 h" in out and "h <= window 8.00 h" in out  # the window reached both steps


def test_the_inverted_fault_is_the_flipped_eval_data_the_template_test_runs(tmp_path):
    """``--fault inverted`` trains on test_templates.py's data: the generated task (4,600 rows, seed 1),
    the first 4,000 to train as they are, the rest to eval with every label flipped."""
    need("torch")
    pd = need("pandas")
    import importlib.util

    from supervise.tools.demo import flipped_data
    args = flipped_data(tmp_path)
    assert args == ["--data", str(tmp_path / "train.csv"), "--eval-data", str(tmp_path / "eval.csv"), "--epochs", "3"]
    spec = importlib.util.spec_from_file_location("train_torch", ROOT / "templates" / "train_torch.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    texts, labels = mod.generated_task(4600, 1)
    train, ev = pd.read_csv(tmp_path / "train.csv"), pd.read_csv(tmp_path / "eval.csv")
    assert list(train["text"]) == texts[:4000] and list(train["label"]) == labels[:4000]
    assert list(ev["text"]) == texts[4000:] and list(ev["label"]) == [1 - y for y in labels[4000:]]
