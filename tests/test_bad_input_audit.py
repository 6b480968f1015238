"""audit.py on bad input: one line, exit 2, no traceback; never two runs' results mixed in --out."""
import json
import os

import pytest

from bad_input import LONG_DIGITS, assert_refused, replay, snapshot, user_folder
from conftest import need

pd = need("pandas")
ROWS = [{"id": "a", "code": "x = 1\n", "label": 0}, {"id": "b", "code": "print 'py2'\n", "label": 1},
        {"id": "c", "code": "def f():\n    return 2\n", "label": 1}]


def corpus(work, fmt="jsonl", rows=ROWS):
    path = work / f"corpus.{fmt}"
    df = pd.DataFrame(rows)
    df.to_csv(path, index=False) if fmt == "csv" else df.to_json(path, orient="records", lines=True)
    return path


def _fifo(work):
    os.mkfifo(work / "pipe.jsonl")
    return ["pipe.jsonl"]


def _dev_zero(work):
    (work / "zero.jsonl").symlink_to("/dev/zero")
    return ["zero.jsonl"]


def _earlier_result_as_input(work):
    (work / "o").mkdir()
    corpus(work).rename(work / "o" / "raw.kept.jsonl")
    return ["o/raw.kept.jsonl", "--out", "o"]


# (case, args (CORPUS is the good corpus) or a function of the working folder, needle)
CASES = [
    ("id_col_missing", ["CORPUS", "--id-col", "nope"], "no column 'nope' in corpus.jsonl"),
    ("code_col_missing", ["CORPUS", "--code-col", "src"], "no column 'src'"),
    ("seed_negative", ["CORPUS", "--seed", "-1"], "argument --seed"),
    ("seed_20_digits", ["CORPUS", "--seed", LONG_DIGITS], "argument --seed"),
    ("workers_20_digits", ["CORPUS", "--workers", LONG_DIGITS], "argument --workers"),
    ("workers_zero", ["CORPUS", "--workers", "0"], "argument --workers"),
    ("workers_nan", ["CORPUS", "--workers", "nan"], "argument --workers"),
    ("row_timeout_nan", ["CORPUS", "--row-timeout", "nan"], "argument --row-timeout"),
    ("row_timeout_20_digits", ["CORPUS", "--row-timeout", LONG_DIGITS], "longer than 30 days"),
    ("per_class_1e999", ["CORPUS", "--balance", "label", "--per-class", "1e999"], "argument --per-class"),
    ("balance_missing_column", ["CORPUS", "--balance", "nope"], "no column 'nope' to balance on"),
    ("out_empty", ["CORPUS", "--out", ""], "--out is empty"),
    ("out_is_a_file", ["CORPUS", "--out", "precious.txt"], "is a file"),
    ("input_missing", ["absent.jsonl"], "is not a file"),
    ("input_is_a_folder", ["data"], "is not a file"),
    ("input_fifo", _fifo, "is not a file"),
    ("input_dev_zero", _dev_zero, "is not a file"),
    ("input_not_json", ["precious.txt"], "unknown format"),
    ("input_is_an_earlier_result", _earlier_result_as_input, "is an earlier result in --out"),
]


@pytest.mark.parametrize("case,args,needle", CASES, ids=[c[0] for c in CASES])
def test_refused_and_nothing_deleted(case, args, needle, tmp_path):
    work = user_folder(tmp_path)
    src = corpus(work)
    args = args(work) if callable(args) else [str(src) if a == "CORPUS" else a for a in args]
    before = snapshot(work)
    r = replay("audit.py", [*args, "--workers", "1"] if "--workers" not in args else args, cwd=work)
    assert_refused(r, needle, progress="audit: ")
    assert snapshot(work) == before


def test_a_second_run_into_the_same_out_never_mixes_with_the_first(tmp_path):
    """jsonl then csv into one --out: only the csv set is left, raw and normalized aligned; the
    user's own file in --out stays; no staging folder is left behind."""
    work = user_folder(tmp_path)
    out = work / "o"
    out.mkdir()
    (out / "README.md").write_text("mine\n")
    for fmt in ("jsonl", "csv"):
        r = replay("audit.py", [corpus(work, fmt), "--id-col", "id", "--normalize", "ast", "--out", out,
                                "--workers", "1"], cwd=work)
        assert r.rc == 0 and "Traceback" not in r.err, r.err
    assert sorted(os.listdir(out)) == ["README.md", "audit_report.json", "normalized.kept.csv", "raw.kept.csv",
                                       "rejected.jsonl"]
    raw, norm = pd.read_csv(out / "raw.kept.csv"), pd.read_csv(out / "normalized.kept.csv")
    assert raw["id"].tolist() == norm["id"].tolist() == ["a", "c"]
    assert json.loads((out / "audit_report.json").read_text())["input"].endswith("corpus.csv")


def test_a_failed_second_run_leaves_the_first_result_whole(tmp_path):
    work = user_folder(tmp_path)
    out = work / "o"
    r = replay("audit.py", [corpus(work), "--out", out, "--workers", "1"], cwd=work)
    assert r.rc == 0, r.err
    before = snapshot(out)
    r = replay("audit.py", [corpus(work), "--out", out, "--workers", "1", "--balance", "label", "--per-class", "5"],
               cwd=work)
    assert_refused(r, "fewer than --per-class 5", progress="audit: ")
    assert snapshot(out) == before
