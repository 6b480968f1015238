"""checkin.py against bad input: every case one answer, exit 0 or 2, never a traceback or a hang."""
import json
import subprocess
import sys

import pytest

from conftest import SCRIPTS, run_script
from supervise.contract import atomic_write_json

START = '{"event": "start", "t": 0, "pid": 1, "total_steps": 100, "batch_size": 8}\n'
STEP = '{"step": %d, "t": %d, "loss": 0.4, "lr": 0.0001, "grad_norm": 1.0, "sps": 100}\n'


def steps(n):
    return "".join(STEP % (10 * i, i) for i in range(1, n + 1))


CASES = [
    ("string t", START + '{"step": 10, "t": "soon", "loss": 0.4, "sps": 1}\n', None),
    ("FATAL 42", START + '{"step": 10, "t": 1, "FATAL": 42}\n', None),
    ("string batch_size", '{"event": "start", "t": 0, "batch_size": "eight", "total_steps": "x"}\n' + steps(3), None),
    ("huge numbers", START.replace("100", "1e400") + '{"step": 1e400, "t": 1e400, "loss": 1e400}\n', None),
    ("deep nesting", "[" * 100000 + "]" * 100000 + "\n" + steps(2), None),
    ("watchdog.json is a list", steps(3), [1, 2, 3]),
    ("watchdog.json wrong types", steps(3), {"state": 7, "kind": ["x"], "watchdog_pid": "me", "last_poll": "now",
                                             "records": "many", "thresholds": {"max_stall": "soon"}}),
    ("watchdog.json says anomaly of an old run", START + steps(3),
     {"state": "anomaly", "kind": "nan", "message": "ANOMALY nan: old", "run_id": "old"}),
]


@pytest.mark.parametrize("name,metrics,wd", CASES, ids=[c[0] for c in CASES])
def test_bad_files_give_a_verdict_not_a_traceback(name, metrics, wd, tmp_path):
    (tmp_path / "metrics.jsonl").write_text(metrics)
    if wd is not None:
        (tmp_path / "watchdog.json").write_text(json.dumps(wd))
    for extra in ((), ("--json",)):
        rc, out, err = run_script("checkin.py", tmp_path, *extra, timeout=30)
        assert rc == 0 and "Traceback" not in err, err
        assert len(out.rstrip("\n")) <= 1500, len(out)
    assert "ANOMALY nan: old" not in out


def test_a_registry_entry_of_mixed_types_is_skipped(tmp_path, state_dir):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(steps(3))
    entries = state_dir / "runs"
    entries.mkdir(parents=True)
    (entries / "a.json").write_text(json.dumps({"run_dir": 42, "registered": "yesterday"}))
    (entries / "b.json").write_text(json.dumps({"run_dir": str(run), "registered": "x"}))
    (entries / "c.json").write_text("[1]")
    rc, out, err = run_script("checkin.py", cwd=tmp_path, timeout=30)
    assert rc == 0 and str(run) in out.splitlines()[0], out + err


def test_lines_zero_shows_no_step_rows(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(steps(30))
    rc, out, _ = run_script("checkin.py", tmp_path, "--lines", "0")
    assert rc == 0 and "loss" not in out.split("\n", 2)[1] and " 300 " not in out


def test_json_stays_within_1500_characters(tmp_path):
    huge = '{"step": %d, "t": 1, "loss": 0.4, "lr": 0.1, "grad_norm": 1.0, "sps": 1, "eval_%s": 1.0}\n'
    text = START + "".join(huge % (i, "x" * 900) for i in range(1, 20))
    (tmp_path / "metrics.jsonl").write_text(text)
    atomic_write_json(tmp_path / "final_val_metrics.json", {"k" * 2000: 1.0})
    rc, out, _ = run_script("checkin.py", tmp_path, "--json", "--lines", "50")
    assert rc == 0 and len(out.strip()) <= 1500 and json.loads(out)["verdict"]


def test_a_closed_pipe_is_no_traceback(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(steps(30))
    p = subprocess.run(f"{sys.executable} {SCRIPTS / 'checkin.py'} {tmp_path} | head -1", shell=True,
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and len(p.stdout.splitlines()) == 1 and "Traceback" not in p.stderr, p.stderr
