"""smoke.py on bad input: usage errors are one line and exit 2; a bad metrics file fails its
checks (exit 7) or is refused (exit 2), never a traceback or a hang."""
import os
import sys

import pytest

from bad_input import make_not_regular, make_run_dir, steps, LONG_DIGITS, assert_refused, replay, snapshot, user_folder

def run_dir(work, metrics=None, extra=None):
    return make_run_dir(work, "s", metrics, extra)


def _metrics_is(kind):
    def make(work):
        d = run_dir(work)
        make_not_regular(d / "metrics.jsonl", kind)
        return [d]
    return make


def _script_fifo(work):
    d = run_dir(work, steps())
    os.mkfifo(work / "train.py")
    return [d, "--script", "train.py"]


# (case, args (DIR: a run directory with good step records) or a function of the working folder, needle)
USAGE = [
    ("run_dir_empty", [""], "the run directory is empty"),
    ("run_dir_is_a_file", ["precious.txt"], "is a file"),
    ("run_dir_missing_no_command", ["runs/none"], "does not exist; give the command to run after --"),
    ("margin_nan", ["DIR", "--margin", "nan"], "argument --margin"),
    ("margin_1e999", ["DIR", "--margin", "1e999"], "argument --margin"),
    ("margin_above_1", ["DIR", "--margin", "2"], "fraction below 1"),
    ("epochs_nan", ["DIR", "--epochs", "nan"], "not a finite number"),
    ("epochs_1e999", ["DIR", "--epochs", "1e999"], "not a finite number"),
    ("full_samples_1e999", ["DIR", "--full-samples", "1e999"], "argument --full-samples"),
    ("full_samples_20_digits", ["DIR", "--full-samples", LONG_DIGITS], "too large"),
    ("window_nan", ["DIR", "--window", "nan"], "argument --window"),
    ("window_20_digits", ["DIR", "--window", LONG_DIGITS], "longer than 30 days"),
    ("timeout_1e999", ["DIR", "--timeout", "1e999"], "argument --timeout"),
    ("num_labels_20_digits", ["DIR", "--num-labels", LONG_DIGITS], "too large"),
    ("metrics_fifo", _metrics_is("fifo"), "is a FIFO, not a regular file"),
    ("metrics_link_to_fifo", _metrics_is("link_to_fifo"), "is a FIFO, not a regular file"),
    ("metrics_link_to_dev_zero", _metrics_is("link_to_dev_zero"), "is a device, not a regular file"),
    ("metrics_directory", _metrics_is("directory"), "is a directory, not a regular file"),
    ("script_fifo", _script_fifo, "is not a readable regular file"),
]


@pytest.mark.parametrize("case,args,needle", USAGE, ids=[c[0] for c in USAGE])
def test_usage_errors_are_one_line(case, args, needle, tmp_path):
    work = user_folder(tmp_path)
    args = args(work) if callable(args) else [run_dir(work, steps()) if a == "DIR" else a for a in args]
    before = snapshot(work)
    r = replay("smoke.py", args, cwd=work)
    assert_refused(r, needle)
    assert snapshot(work) == before


# (case, metrics.jsonl, other files, the row that must FAIL, what it says): untrusted values in real files
BAD_FILES = [
    ("string_t", steps(t='"abc"'), {}, "contract", "'t' = 'abc' is not a number"),
    ("fatal_42", steps() + '{"step": 60, "t": 2, "FATAL": 42}\n', {}, "contract", "FATAL"),
    ("string_batch_size_and_labels", '{"event": "start", "t": 0, "batch_size": "big", "num_labels": "two", '
     '"pid": "x"}\n' + steps(), {}, "contract", "is not a"),
    ("num_labels_1e400", '{"event": "start", "t": 0, "num_labels": 1e400}\n' + steps(), {}, "contract", "num_labels"),
    ("string_step", '{"step": "abc", "t": 1, "loss": 0.5}\n' + steps(), {}, "contract", "'step' = 'abc'"),
    ("step_1e400", '{"step": 1e400, "t": 1, "loss": 0.5}\n' + steps(), {}, "contract", "step"),
    ("null_step_eval", steps() + '{"step": null, "eval_auroc": 0.9}\n', {}, "auroc rises", "no eval record"),
    ("string_auroc", steps() + '{"step": 50, "eval_auroc": "high", "eval_acc": 0.5}\n', {}, "contract",
     "'eval_auroc' = 'high'"),
    ("deeply_nested_line", "[" * 100000 + "]" * 100000 + "\n" + steps(), {}, "contract", "line 1"),
    ("nan_sps", steps().replace('"sps": 100', '"sps": NaN'), {}, "projection", "no sps in the step records"),
    ("negative_sps", steps().replace('"sps": 100', '"sps": -5'), {}, "projection", "no sps in the step records"),
    ("empty_metrics", "", {}, "contract", "no step record"),
    ("empty_sentinel", steps(), {"final_val_metrics.json": ""}, "sentinel", "present but it is not a JSON object"),
    ("torn_sentinel", steps(), {"final_val_metrics.json": '{"eval_auroc": 0.'}, "sentinel", "not a JSON object"),
    ("sentinel_is_a_list", steps(), {"final_val_metrics.json": "[1, 2]"}, "sentinel", "not a JSON object"),
]


def rows(out):
    return {line[6:22].strip(): line[:4] for line in out.splitlines() if line[:4] in ("PASS", "FAIL", "SKIP")}


@pytest.mark.parametrize("case,metrics,files,row,needle", BAD_FILES, ids=[c[0] for c in BAD_FILES])
def test_bad_metrics_fail_their_checks_without_a_traceback(case, metrics, files, row, needle, tmp_path):
    work = user_folder(tmp_path)
    d = run_dir(work, metrics, files)
    r = replay("smoke.py", [d, "--full-samples", "1000", "--window", "1h"], cwd=work)
    assert "Traceback" not in r.err and r.err == "", r.err[-3000:]
    assert r.rc == 7, r.out
    line = next(ln for ln in r.out.splitlines() if ln[6:22].strip() == row)
    assert line.startswith("FAIL") and needle in line, r.out
    assert r.out.strip().splitlines()[-1].startswith("SMOKE FAILED")


def test_a_fifo_as_train_log_fails_the_command_row_without_hanging(tmp_path):
    work = user_folder(tmp_path)
    d = run_dir(work)
    os.mkfifo(d / "train.log")
    r = replay("smoke.py", [d, "--", sys.executable, "-c", "pass"], cwd=work)
    assert "Traceback" not in r.err and r.rc == 7, r.err
    assert rows(r.out)["command"] == "FAIL" and "is a FIFO, not a regular file" in r.out


def test_a_command_that_is_a_folder_fails_the_command_row(tmp_path):
    work = user_folder(tmp_path)
    r = replay("smoke.py", ["runs/s", "--", "./data"], cwd=work)
    assert "Traceback" not in r.err and r.rc == 7, r.err
    assert rows(r.out)["command"] == "FAIL" and "./data: cannot run it (Permission denied)" in r.out
