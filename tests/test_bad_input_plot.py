"""plot.py on bad input: a usage or unreadable-file error is one line and exit 2; untrusted values
in metrics.jsonl or watchdog.json still give the PNG; never a traceback or a hang."""
import json

import pytest

from bad_input import make_not_regular, make_run_dir, steps, assert_refused, replay, snapshot, user_folder
from conftest import need

need("matplotlib")
def run_dir(work, metrics=None, files=None):
    return make_run_dir(work, "p", metrics, files)


def _metrics_is(kind):
    def make(work):
        d = run_dir(work)
        make_not_regular(d / "metrics.jsonl", kind)
        return d
    return make


def _png_is_a_folder(work):
    d = run_dir(work, steps())
    (d / "metrics.png").mkdir()
    return d


# (case, RUN_DIR or a function of the working folder, needle)
USAGE = [
    ("run_dir_empty", "", "the run directory is empty"),
    ("run_dir_is_a_file", "precious.txt", "is a file"),
    ("run_dir_missing", "runs/none", "is not a run directory"),
    ("metrics_fifo", _metrics_is("fifo"), "is a FIFO, not a regular file"),
    ("metrics_link_to_fifo", _metrics_is("link_to_fifo"), "is a FIFO, not a regular file"),
    ("metrics_link_to_dev_zero", _metrics_is("link_to_dev_zero"), "is a device, not a regular file"),
    ("metrics_directory", _metrics_is("directory"), "is a directory, not a regular file"),
    ("metrics_empty", lambda work: run_dir(work, ""), "holds no step or eval record yet"),
    ("png_is_a_folder", _png_is_a_folder, "cannot write"),
]


@pytest.mark.parametrize("case,arg,needle", USAGE, ids=[c[0] for c in USAGE])
def test_refused_in_one_line(case, arg, needle, tmp_path):
    work = user_folder(tmp_path)
    arg = arg(work) if callable(arg) else arg
    before = snapshot(work)
    r = replay("plot.py", [arg], cwd=work)
    assert_refused(r, needle)
    assert snapshot(work) == before


WD = {"state": "anomaly", "kind": "nan", "step": 30, "message": "ANOMALY nan: loss = nan at step 30."}
# (case, metrics.jsonl, watchdog.json or None): still a PNG
UNTRUSTED = [
    ("string_t", steps(t='"abc"'), None),
    ("fatal_42", steps() + '{"step": 60, "t": 2, "FATAL": 42}\n', None),
    ("string_batch_size_and_labels", '{"event": "start", "t": 0, "batch_size": "big", "num_labels": "two"}\n' + steps(),
     None),
    ("num_labels_1e400", '{"event": "start", "t": 0, "num_labels": 1e400}\n' + steps(), None),
    ("string_step", '{"step": "abc", "t": 1, "loss": 0.5}\n' + steps(), None),
    ("string_auroc", steps() + '{"step": 50, "eval_auroc": "high"}\n', None),
    ("deeply_nested_line", "[" * 100000 + "]" * 100000 + "\n" + steps(), None),
    ("nan_everywhere", steps().replace("0.5", "NaN").replace("100", "NaN"), None),
    ("watchdog_json_is_a_list", steps(), [1, 2]),
    ("watchdog_json_wrong_types", steps(), {"state": "anomaly", "kind": 5, "step": "x", "thresholds": [1]}),
    ("watchdog_json_null_step", steps(), {**WD, "step": None}),
    ("watchdog_thresholds_of_strings", steps(), {"state": "watching", "thresholds": {"min_auroc": "x", "grad_high": None,
                                                                                     "baseline_steps": "abc"}}),
    ("watchdog_json_good", steps(), WD),
]


@pytest.mark.parametrize("case,metrics,wd", UNTRUSTED, ids=[c[0] for c in UNTRUSTED])
def test_untrusted_values_still_give_the_png(case, metrics, wd, tmp_path):
    work = user_folder(tmp_path)
    d = run_dir(work, metrics, {"watchdog.json": json.dumps(wd)} if wd is not None else None)
    r = replay("plot.py", [d], cwd=work)
    assert r.rc == 0 and "Traceback" not in r.err and r.err == "", r.err[-3000:]
    assert r.out.strip() == str(d / "metrics.png")
    assert (d / "metrics.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in d.iterdir() if p.name.startswith(".metrics.")] == []  # no temp file left
