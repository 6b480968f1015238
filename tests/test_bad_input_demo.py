"""demo.py on bad input: it may remove only what it wrote itself (issue 12, data loss)."""
import pytest

from bad_input import LONG_DIGITS, assert_refused, replay, snapshot, user_folder
from supervise.tools.demo import MARKER, claim


def _dir_with_a_user_file(work):
    (work / "runs" / "mine").mkdir(parents=True)
    (work / "runs" / "mine" / "results.csv").write_text("kept\n")
    return "runs/mine"


def _smoke_dir_with_a_user_file(work):
    (work / "runs" / "x-smoke").mkdir(parents=True)
    (work / "runs" / "x-smoke" / "notes.md").write_text("kept\n")
    return "runs/x"


def _symlink_to_a_folder(work):
    (work / "runs").mkdir()
    (work / "runs" / "link").symlink_to(work / "data")
    return "runs/link"


# (case, --out or a function of the working folder that prepares it and returns --out, extra args, needle)
CASES = [
    ("empty_out", "", [], "--out is empty"),
    ("blank_out", "  ", [], "--out is empty"),
    ("current_dir", ".", [], "is not a folder the demo can own"),
    ("parent_of_user_files", "data/..", [], "holds files the demo did not write"),
    ("user_folder", "data", [], "holds files the demo did not write"),
    ("folder_with_user_file", _dir_with_a_user_file, [], "holds files the demo did not write"),
    ("smoke_folder_with_user_file", _smoke_dir_with_a_user_file, [], "x-smoke holds files the demo did not write"),
    ("a_file", "precious.txt", [], "is a file"),
    ("a_symlink", _symlink_to_a_folder, [], "is a symlink"),
    ("poll_nan", "runs/d", ["--poll", "nan"], "argument --poll"),
    ("poll_20_digits", "runs/d", ["--poll", LONG_DIGITS], "longer than 30 days"),
    ("window_1e999", "runs/d", ["--window", "1e999"], "argument --window"),
    ("window_inf", "runs/d", ["--window", "inf"], "argument --window"),
    ("unknown_fault", "runs/d", ["--fault", "meteor"], "invalid choice"),
]


@pytest.mark.parametrize("case,out,extra,needle", CASES, ids=[c[0] for c in CASES])
def test_refused_and_nothing_deleted(case, out, extra, needle, tmp_path):
    work = user_folder(tmp_path)
    out = out(work) if callable(out) else out
    before = snapshot(work)
    r = replay("demo.py", ["--out", out, *extra], cwd=work)
    assert_refused(r, needle)
    assert snapshot(work) == before  # nothing deleted, nothing written


def test_a_folder_the_demo_made_is_reclaimed_and_marked(tmp_path):
    run = tmp_path / "runs" / "demo"
    claim(run)
    assert sorted(p.name for p in run.iterdir()) == [MARKER]
    (run / "metrics.jsonl").write_text("{}\n")  # what the demo's run wrote there
    claim(run)  # the next demo run: its own earlier folder is emptied, the marker written again
    assert sorted(p.name for p in run.iterdir()) == [MARKER]


def test_an_empty_folder_is_taken_without_removing_it(tmp_path):
    run = tmp_path / "empty"
    run.mkdir()
    claim(run)
    assert (run / MARKER).is_file()
