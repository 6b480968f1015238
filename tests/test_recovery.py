"""supervise.recovery: the relaunch line per anomaly kind, the watchdog's line beside it, and
no_progress. The lines are checked by the real launch guard and by a real shell (tests/test_resume.py
runs them on real templates)."""
import json
import shlex
import subprocess
import sys

import pytest

from conftest import ROOT
from supervise import guard, recovery
from supervise.recovery import no_progress, relaunch_line, watchdog_line
from supervise.rules import KINDS

START = {"event": "start", "t": 0, "pid": 1, "run_id": "a" * 32, "attempt": 1, "world_size": 1,
         "argv": ["train_torch.py", "--out", "runs/a", "--lr", "0.01"], "cwd": "/work/my proj"}


def start(argv, **kw):
    return {**START, "argv": argv, **kw}


def words(line):
    """The launch's words between the environment and the redirection."""
    w = shlex.split(line)
    i = w.index("-u") - 1 if "-u" in w else w.index("torchrun")
    return w[i:w.index(">>")]


@pytest.mark.parametrize("kind,argv,hparams,expected", [
    # the same command, resumed
    ("dead", ["train_torch.py", "--out", "runs/a"], {}, ["python", "-u", "train_torch.py", "--out", "runs/a", "--resume"]),
    ("stall", ["t.py", "--lr=3e-4"], {}, ["python", "-u", "t.py", "--lr=3e-4", "--resume"]),
    ("crash", ["t.py"], {}, ["python", "-u", "t.py", "--resume"]),
    (None, ["t.py", "--resume"], {}, ["python", "-u", "t.py", "--resume"]),  # already resuming: once
    ("preempted", ["t.py"], {}, ["python", "-u", "t.py", "--resume"]),
    # oom: half the batch, twice the accumulation, from the flags or from hparams.json
    ("oom", ["t.py", "--batch-size", "32"], {}, ["python", "-u", "t.py", "--batch-size", "16", "--grad-accum", "2", "--resume"]),
    ("oom", ["t.py", "--batch=8", "--grad-accum", "4"], {}, ["python", "-u", "t.py", "--batch", "4", "--grad-accum", "8", "--resume"]),
    ("oom", ["t.py", "--out", "r"], {"batch_size": 32, "grad_accum": 1}, ["python", "-u", "t.py", "--out", "r", "--batch-size", "16", "--grad-accum", "2", "--resume"]),
    ("oom", ["t.py", "--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "2"], {},
     ["python", "-u", "t.py", "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "4", "--resume"]),
    # nan and its relatives: half the learning rate
    ("nan", ["t.py", "--lr", "0.01"], {}, ["python", "-u", "t.py", "--lr", "0.005", "--resume"]),
    ("diverged", ["t.py", "--learning_rate=2e-5"], {}, ["python", "-u", "t.py", "--learning_rate", "1e-05", "--resume"]),
    ("grad_explode", ["t.py"], {"lr": 0.002}, ["python", "-u", "t.py", "--lr", "0.001", "--resume"]),
    ("loss_spike", ["t.py", "--lr", "1e-3", "--lr", "4e-3"], {}, ["python", "-u", "t.py", "--lr", "0.002", "--resume"]),
])
def test_the_change_each_kind_calls_for(kind, argv, hparams, expected, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    if hparams:
        (run / "hparams.json").write_text(json.dumps(hparams))
    line = relaunch_line(start(argv), kind, run)
    assert words(line) == expected


@pytest.mark.parametrize("kind,argv,hparams,why", [
    ("inverted_labels", ["t.py"], {}, "the labels need a fix, not a relaunch"),
    ("stuck_auroc", ["t.py"], {}, "the data needs a look"),
    ("chance_loss", ["t.py"], {}, "the model learns nothing"),
    ("timeout", ["t.py"], {}, "the window is over"),
    ("no_progress", ["t.py"], {}, "relaunching is the loop to stop"),
    ("oom", ["t.py", "--batch-size", "1"], {}, "a batch of one cannot be halved"),
    ("oom", ["t.py"], {}, "the batch is not known"),
    ("nan", ["t.py"], {}, "the learning rate is not known"),
    ("nan", ["t.py"], {"lr": 0}, "a zero learning rate cannot be halved"),
])
def test_no_line_when_a_relaunch_cannot_fix_it(kind, argv, hparams, why, tmp_path):
    (tmp_path / "hparams.json").write_text(json.dumps(hparams))
    assert relaunch_line(start(argv), kind, tmp_path) is None, why


@pytest.mark.parametrize("record", [
    {}, {"argv": ["t.py"]}, {"cwd": "/x"}, {"argv": [], "cwd": "/x"}, {"argv": "t.py --lr 1", "cwd": "/x"},
    {"argv": ["t.py", 3], "cwd": "/x"}, {"argv": ["t.py"], "cwd": None}, "not a dict",
])
def test_a_start_record_without_argv_and_cwd_gives_no_line(record, tmp_path):
    assert relaunch_line(record, "dead", tmp_path) is None


def test_a_fatal_from_a_non_finite_value_halves_the_lr(tmp_path):
    s = start(["t.py", "--lr", "1e-2"])
    msg = "ANOMALY fatal: FATAL = 'non-finite loss nan at step 31' at step 31. Lower the learning rate."
    assert words(relaunch_line(s, "fatal", tmp_path, message=msg))[-3:] == ["--lr", "0.005", "--resume"]
    assert words(relaunch_line(s, "fatal", tmp_path, message="FATAL = 'disk full'"))[-3:] == ["--lr", "1e-2", "--resume"]


def test_every_kind_has_a_decision():
    for kind in KINDS:
        assert recovery.change_for(kind) in ("batch", "lr", "same", None)
    assert {k for k in KINDS if recovery.change_for(k) is not None} >= {"oom", "nan", "dead", "stall", "crash"}


def test_torchrun_runs_are_relaunched_with_torchrun(tmp_path):
    line = relaunch_line(start(["/w/train_torch.py", "--out", "r"], world_size=4), "dead", tmp_path)
    assert words(line) == ["torchrun", "--standalone", "--nproc_per_node=4", "/w/train_torch.py", "--out", "r", "--resume"]


def test_the_line_has_the_launch_shape(tmp_path):
    run = tmp_path / "my run"
    line = relaunch_line(START, "dead", run)
    q = shlex.quote
    assert "\n" not in line
    assert line.startswith(f"cd {q(START['cwd'])} && mkdir -p {q(str(run))} && PYTHONUNBUFFERED=1 ")
    assert line.endswith(f">> {q(str(run / 'train.log'))} 2>&1")
    for k, v in guard.QUIET.items():
        assert f"{k}={v}" in line
    # a relative run directory is made absolute: the line begins with a cd
    rel = relaunch_line(START, "dead", "runs/a")
    assert f"mkdir -p {q(str((__import__('pathlib').Path.cwd() / 'runs/a')))}" in rel


@pytest.mark.parametrize("kind", ["dead", "oom", "nan", "stall", None])
@pytest.mark.parametrize("world", [1, 2])
def test_the_line_passes_the_launch_guard(kind, world, tmp_path):
    (tmp_path / "hparams.json").write_text(json.dumps({"batch_size": 16, "grad_accum": 1, "lr": 0.01}))
    line = relaunch_line(start(["train_hf.py", "--out", str(tmp_path)], world_size=world), kind, tmp_path)
    call = guard.Call(tool="Bash", command=line, background=True, cwd=str(tmp_path), env={})
    assert guard.decide(call) is None, guard.decide(call)
    # and the same command without the environment is refused: the check can fail
    bare = line.replace("PYTHONUNBUFFERED=1 ", "").replace(" -u ", " ")
    assert guard.decide(guard.Call(tool="Bash", command=bare, background=True, cwd=str(tmp_path), env={}))


def test_the_watchdog_line_runs_the_bundles_watchdog(tmp_path):
    line = watchdog_line(tmp_path / "run", python=sys.executable)
    w = shlex.split(line)
    assert w == [sys.executable, str(ROOT / "scripts" / "watchdog.py"), str(tmp_path / "run")]
    assert guard.decide(guard.Call(tool="Bash", command=line, background=True, cwd=str(tmp_path), env={})) is None
    p = subprocess.run(shlex.split(line) + ["--help"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "RUN_DIR" in p.stdout


@pytest.mark.parametrize("steps,current,fires", [
    ([None, 40, 40, 40], None, True),          # three relaunches from the checkpoint at 40
    ([None, 40, 40], None, False),             # two
    ([None, 20, 40, 60], None, False),         # each moved on
    ([None, 40, 40, 40], 60, False),           # the last attempt moved it after all
    ([None, 40, None, 40], None, True),        # a relaunch that logged nothing made no progress
    ([None, None, None, None], None, True),    # three relaunches that died before a step
    ([None, 40, 40, 40, 60], None, False),     # it moved at last
    ([None, 20, 40, 40, 40], 40, True),
    ([40, 40, 40], None, False),               # the launch is no relaunch
])
def test_no_progress_after_three_relaunches_from_one_step(steps, current, fires):
    found = no_progress([({"event": "start", "attempt": i + 1}, s) for i, s in enumerate(steps)], current=current)
    assert (found is not None) == fires
    if fires:
        assert found.kind == "no_progress"
        assert found.message.startswith("ANOMALY no_progress: relaunches without the checkpoint step moving = 3 >= 3 at step ")
        assert found.message.endswith("then relaunch once.")


def test_recovery_imports_neither_torch_nor_pandas():
    code = ("import sys; sys.path.insert(0, %r); import supervise.recovery; "
            "print(sorted(m for m in ('torch', 'pandas', 'numpy') if m in sys.modules))" % str(ROOT))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.stdout.strip() == "[]", p.stderr


def test_began_at_reads_each_attempts_first_step_from_the_records():
    recs = [{"event": "start", "attempt": 1}, {"step": 10, "loss": 0.7}, {"step": 20, "eval_auroc": 0.6},
            {"step": 20, "loss": 0.6}, {"event": "start", "attempt": 2}, {"step": 30, "loss": 0.5},
            {"event": "start", "attempt": 3}, {"step": 25, "FATAL": "boom"},
            {"event": "start", "attempt": 4}, "torn", {"step": 30, "loss": 0.5}]
    got = recovery.began_at(recs)
    assert [(s["attempt"], step) for s, step in got] == [(1, 10), (2, 30), (3, None), (4, 30)]
    assert no_progress(got) is not None and no_progress(got[:3]) is None
