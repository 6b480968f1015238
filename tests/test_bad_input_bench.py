"""bench.py on bad input: one line, exit 2, no traceback, before any step is timed."""
import os

import pytest

from bad_input import LONG_DIGITS, assert_refused, replay, snapshot, user_folder
from conftest import need


def _no_gpu():
    torch = need("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible: --device cuda is not an error here")


def _torch():
    need("torch")
    need("transformers")


# (case, args, needle, what the case needs)
CASES = [
    ("device_abc", ["--device", "abc"], "--device 'abc' is not a device", _torch),
    ("device_cuda_without_gpu", ["--device", "cuda"], "no CUDA GPU is visible here", _no_gpu),
    ("device_cuda_index_without_gpu", ["--device", "cuda:3"], "no CUDA GPU is visible here", _no_gpu),
    ("window_400_digits", ["--window", "9" * 400], "(400 characters) is not a duration", None),
    ("window_20_digits", ["--window", LONG_DIGITS], "longer than 30 days", None),
    ("window_nan", ["--window", "nan"], "argument --window", None),
    ("window_negative", ["--window=-3h"], "must be more than 0", None),
    ("epochs_nan", ["--epochs", "nan"], "not a finite number", None),
    ("epochs_1e999", ["--epochs", "1e999"], "not a finite number", None),
    ("samples_1e999", ["--samples", "1e999"], "argument --samples", None),
    ("samples_20_digits", ["--samples", LONG_DIGITS], "too large", None),
    ("batch_zero", ["--batch", "0"], "must be more than 0", None),
    ("steps_20_digits", ["--steps", LONG_DIGITS], "too large", None),
    ("preprocess_rate_inf", ["--preprocess-rate", "inf"], "not a finite number", None),
    ("eval_samples_negative", ["--eval-samples=-1"], "must be at least 0", None),
    ("cmd_without_run_dir", ["--cmd", "true"], "--cmd needs --run-dir", None),
    ("cmd_with_empty_run_dir", ["--cmd", "true", "--run-dir", ""], "--cmd needs --run-dir", None),
    ("cmd_empty", ["--cmd", "", "--run-dir", "runs/b"], "--cmd is empty", None),
    ("cmd_run_dir_is_a_file", ["--cmd", "true", "--run-dir", "precious.txt"], "is a file", None),
    ("cmd_unclosed_quote", ["--cmd", "python 'train.py", "--run-dir", "runs/b"], "No closing quotation", None),
    ("cmd_not_found", ["--cmd", "no-such-binary-xyz --steps 3", "--run-dir", "runs/b"], "No such file", None),
    ("cmd_writes_no_metrics", ["--cmd", "true", "--run-dir", "runs/b"], "wrote no step record", None),
]


@pytest.mark.parametrize("case,args,needle,needs", CASES, ids=[c[0] for c in CASES])
def test_refused_and_nothing_deleted(case, args, needle, needs, tmp_path):
    if needs:
        needs()
    work = user_folder(tmp_path)
    before = snapshot(work)
    r = replay("bench.py", args, cwd=work)
    assert_refused(r, needle, progress="bench: ")
    after = snapshot(work)
    assert {k: v for k, v in after.items() if not k.startswith("runs")} == before  # only its --run-dir is new


def test_command_mode_with_a_fifo_as_metrics_does_not_hang(tmp_path):
    work = user_folder(tmp_path)
    (work / "runs" / "b").mkdir(parents=True)
    os.mkfifo(work / "runs" / "b" / "metrics.jsonl")
    r = replay("bench.py", ["--cmd", "true", "--run-dir", "runs/b"], cwd=work)
    assert_refused(r, "wrote no step record", progress="bench: ")
