"""The README's main job: the whole procedure on the shipped task, healthy and with real faults."""
import pytest

from conftest import need, run_script

need("torch")


@pytest.mark.parametrize("fault,verdict", [
    (None, "watchdog exited 0: OK done: final_val_metrics.json written"),
    ("dead", "watchdog exited 7: ANOMALY dead: rank 0 (pid "),
    ("nan", "watchdog exited 7: ANOMALY nan: FATAL = 'non-finite loss"),
    ("inverted", "watchdog exited 7: ANOMALY inverted_labels: eval_auroc = "),
])
def test_demo(fault, verdict, tmp_path):
    # an 8-hour window: the projection (12,000 samples at >= 0.42 sps) fits however busy the machine is
    rc, out, err = run_script("demo.py", "--out", tmp_path / "run", "--window", "8h",
                              *(["--fault", fault] if fault else []), timeout=1800)  # a hang bound: ~13 min with both cores busy
    assert rc == 0, out[-3000:] + err[-2000:]
    for mark in ("1. bench", "FITS", "2. audit", "kept", "3. smoke", "SMOKE PASSED", "launch, one line, detached",
                 "6. watchdog", verdict, "snapshot: "):
        assert mark in out, (mark, out[-3000:])
    assert (tmp_path / "run" / "metrics.png").exists()
    assert "against a window of 8.00 h" in out and "h <= window 8.00 h" in out  # the window reached both steps
