"""supervise.act.recovery: the relaunch line per anomaly kind, the watchdog's line beside it, and
no_progress. The lines are checked by the real launch guard and by a real shell (tests/test_resume.py
runs them on real templates)."""
import json
import os
import shlex
import subprocess
import sys

import pytest

from conftest import ROOT, verdict_of
from supervise.act import recovery
from supervise.guard import hook as guard
from supervise.guard.shell import Call
from supervise.judge.table import KINDS, RECORD_RULES, change_for, no_progress
from supervise.act.recovery import relaunch_line, relaunch_plan, watchdog_line
from supervise.observe.records import RecordRules
from supervise.thresholds import Thresholds

START = {"event": "start", "t": 0, "pid": 1, "run_id": "a" * 32, "attempt": 1, "world_size": 1,
         "argv": ["train_torch.py", "--out", "runs/a", "--lr", "0.01"], "cwd": "/work/my proj"}


def start(argv, **kw):
    return {**START, "argv": argv, **kw}


def words(line):
    """The training command: the launcher's words after --."""
    w = shlex.split(line)
    return w[w.index("--") + 1:]


ENV_CRASH = "ANOMALY crash: last error line = 'RuntimeError: NCCL error: unhandled system error' after pid 1 died"
TEMPLATE = {"resume": ["--resume"]}  # what the templates declare (+ checkpoint_dir, flags)


@pytest.mark.parametrize("kind,argv,hparams,expected", [
    # the same command, resumed by the templates' recipe
    ("dead", ["train_torch.py", "--out", "runs/a"], {}, ["python", "-u", "train_torch.py", "--out", "runs/a", "--resume"]),
    ("stall", ["t.py", "--lr=3e-4"], {}, ["python", "-u", "t.py", "--lr=3e-4", "--resume"]),
    ("crash", ["t.py"], {}, ["python", "-u", "t.py", "--resume"]),   # an environment failure (NCCL): ENV_CRASH
    (None, ["t.py", "--resume"], {}, ["python", "-u", "t.py", "--resume"]),  # already resuming: once
    ("preempted", ["t.py"], {}, ["python", "-u", "t.py", "--resume"]),
    # oom: half the batch, twice the accumulation, in the command's own form, or from hparams.json
    # (no accumulation flag seen: the batch is halved alone, and the note says so)
    ("oom", ["t.py", "--batch-size", "32"], {}, ["python", "-u", "t.py", "--batch-size", "16", "--resume"]),
    ("oom", ["t.py", "--batch=8", "--grad-accum", "4"], {}, ["python", "-u", "t.py", "--batch=4", "--grad-accum", "8", "--resume"]),
    ("oom", ["t.py", "--out", "r"], {"batch_size": 32, "grad_accum": 1}, ["python", "-u", "t.py", "--out", "r", "--batch-size=16", "--grad-accum=2", "--resume"]),
    ("oom", ["t.py", "--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "2"], {},
     ["python", "-u", "t.py", "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "4", "--resume"]),
    # nan and its relatives: half the learning rate, a float literal in the command's own form
    ("nan", ["t.py", "--lr", "0.01"], {}, ["python", "-u", "t.py", "--lr", "0.005", "--resume"]),
    ("diverged", ["t.py", "--learning_rate=2e-5"], {}, ["python", "-u", "t.py", "--learning_rate=1e-05", "--resume"]),
    ("diverged", ["t.py", "--learning_rate=1000"], {}, ["python", "-u", "t.py", "--learning_rate=500.0", "--resume"]),
    ("nan", ["t.py", "--learning_rate=5e-4"], {}, ["python", "-u", "t.py", "--learning_rate=0.00025", "--resume"]),
    ("grad_explode", ["t.py"], {"lr": 0.002}, ["python", "-u", "t.py", "--lr=0.001", "--resume"]),
    ("loss_spike", ["t.py", "--lr", "1e-3", "--lr", "4e-3"], {}, ["python", "-u", "t.py", "--lr", "0.002", "--resume"]),
])
def test_the_change_each_kind_calls_for(kind, argv, hparams, expected, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    if hparams:
        (run / "hparams.json").write_text(json.dumps(hparams))
    line = relaunch_line(start(argv, **TEMPLATE), verdict_of(kind, ENV_CRASH if kind == "crash" else ""), run)
    assert words(line) == expected


@pytest.mark.parametrize("kind,argv,hparams,why", [
    ("inverted_labels", ["t.py"], {}, "a relaunch does not fix inverted_labels"),
    ("stuck_auroc", ["t.py"], {}, "a relaunch does not fix stuck_auroc"),
    ("chance_loss", ["t.py"], {}, "a relaunch does not fix chance_loss"),
    ("timeout", ["t.py"], {}, "a relaunch does not fix timeout"),
    ("no_progress", ["t.py"], {}, "a relaunch does not fix no_progress"),
    ("crash", ["t.py"], {}, "a relaunch does not fix crash"),   # the script's own exception: fix it first
    ("oom", ["t.py", "--batch-size", "1"], {}, "the per-device batch is 1: it cannot be halved"),
    ("oom", ["t.py"], {}, "the batch size is neither on the command line nor in the start record's flags or hparams.json"),
    ("nan", ["t.py"], {}, "no relaunch line: the learning rate is neither on the command line nor in the start record's flags or hparams.json: lower it in the script"),
    ("nan", ["t.py"], {"lr": 0}, "the learning rate is 0: it cannot be halved"),
])
def test_no_line_when_a_relaunch_cannot_fix_it(kind, argv, hparams, why, tmp_path):
    (tmp_path / "hparams.json").write_text(json.dumps(hparams))
    line, note = relaunch_plan(start(argv, **TEMPLATE), verdict_of(kind), tmp_path)
    assert line is None and relaunch_line(start(argv, **TEMPLATE), verdict_of(kind), tmp_path) is None
    assert why.removeprefix("no relaunch line: ") in note


@pytest.mark.parametrize("record", [
    {}, {"argv": ["t.py"]}, {"cwd": "/x"}, {"argv": [], "cwd": "/x"}, {"argv": "t.py --lr 1", "cwd": "/x"},
    {"argv": ["t.py", 3], "cwd": "/x"}, {"argv": ["t.py"], "cwd": None}, "not a dict",
])
def test_a_start_record_without_argv_and_cwd_gives_no_line(record, tmp_path):
    assert relaunch_line(record, verdict_of("dead"), tmp_path) is None
    assert "no argv/cwd" in relaunch_plan(record, verdict_of("dead"), tmp_path)[1]


_HEADER = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
SAFETENSORS = len(_HEADER).to_bytes(8, "little") + _HEADER + b"\0" * 4   # one float: a readable weights file


def torch_file(path):
    """A file torch.save could have written: a zip archive (what the checkpoint check reads)."""
    import zipfile
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")


def hf_checkpoints(d, *steps, partial=()):
    """A Trainer's output_dir: complete checkpoint-N folders (trainer_state.json is written last)
    and partial ones (a kill mid-save)."""
    for n in (*steps, *partial):
        (d / f"checkpoint-{n}").mkdir(parents=True)
        (d / f"checkpoint-{n}" / "model.safetensors").write_bytes(SAFETENSORS)
        if n in steps:
            (d / f"checkpoint-{n}" / "trainer_state.json").write_text("{}")
            os.utime(d / f"checkpoint-{n}", (1e9 + n, 1e9 + n))
    return d


HF = {"resume": ["--resume_from_checkpoint", "{checkpoint}"],
      "flags": {"--learning_rate": 5e-05, "--per_device_train_batch_size": 8, "--gradient_accumulation_steps": 1}}


@pytest.mark.parametrize("name,record,argv,kind,files,expected,note", [
    # the Trainer's recipe, its newest complete checkpoint, the script's own underscores
    ("hf", HF, ["run_classification.py", "--output_dir", "{ck}", "--do_train"], "dead", ("hf", 20, 40),
     ["run_classification.py", "--output_dir", "{ck}", "--do_train", "--resume_from_checkpoint", "{ck}/checkpoint-40"],
     "resumes from {ck}/checkpoint-40"),
    # a relaunch of a relaunch: the old checkpoint flag is replaced, the LR comes from the start record's flags
    ("hf again", HF, ["r.py", "--output_dir", "{ck}", "--resume_from_checkpoint", "{ck}/checkpoint-20"], "nan",
     ("hf", 20, 40), ["r.py", "--output_dir", "{ck}", "--learning_rate=2.5e-05", "--resume_from_checkpoint",
                      "{ck}/checkpoint-40"], ""),
    # oom on a Trainer script: both knobs from the start record's flags, appended as --flag=value
    ("hf oom", HF, ["r.py", "--output_dir", "{ck}"], "oom", ("hf", 20),
     ["r.py", "--output_dir", "{ck}", "--per_device_train_batch_size=4", "--gradient_accumulation_steps=2",
      "--resume_from_checkpoint", "{ck}/checkpoint-20"], ""),
    # a save that never finished is no checkpoint: nothing to resume from, the line starts over
    ("hf partial", HF, ["r.py", "--output_dir", "{ck}"], "dead", ("hf",), ["r.py", "--output_dir", "{ck}"],
     "no complete checkpoint under {ck}: this relaunch starts over from step 0"),
    # nanoGPT: --key=value only, a float stays a float, init_from replaced in place of a second one
    ("nanogpt", {"resume": ["--init_from=resume"]}, ["train.py", "--learning_rate=5", "--init_from=scratch"], "diverged",
     ("pt",), ["train.py", "--learning_rate=2.5", "--init_from=resume"], ""),
    # the recipe's own dashes
    ("dashes", {"resume": ["--resume-from-checkpoint={checkpoint}"]}, ["t.py", "--output-dir={ck}"], "stall", ("hf", 10),
     ["t.py", "--output-dir={ck}", "--resume-from-checkpoint={ck}/checkpoint-10"], ""),
    # no recipe: the same command, no guessed flag, and the note says it starts over
    ("none", {}, ["sft.py", "--out", "r"], "dead", (), ["sft.py", "--out", "r"],
     "the script declares no resume recipe (the start record has no 'resume'): this relaunch starts over from step 0"),
])
def test_the_resume_recipe_of_each_writer(name, record, argv, kind, files, expected, note, tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    if files and files[0] == "hf":
        hf_checkpoints(ck, *files[1:], partial=(60,))
    elif files == ("pt",):
        torch_file(ck / "ckpt.pt")
    fill = lambda w: w.replace("{ck}", str(ck))  # noqa: E731
    s = start([fill(w) for w in argv], **({**record, "checkpoint_dir": str(ck)} if record else {}))
    line, said = relaunch_plan(s, verdict_of(kind), tmp_path)
    assert words(line) == ["python", "-u", *map(fill, expected)]
    assert fill(note) in said


def test_an_explicit_checkpoint_wins_and_lightnings_recipe_is_a_variable(tmp_path):
    ck = hf_checkpoints(tmp_path / "ck", 20, 40)
    s = start(["r.py", "--output_dir", str(ck)], **HF, checkpoint_dir=str(ck))
    line = relaunch_line(s, verdict_of("dead"), tmp_path, checkpoint=str(ck / "checkpoint-20"))
    assert words(line)[-2:] == ["--resume_from_checkpoint", str(ck / "checkpoint-20")]
    lit = tmp_path / "lightning"   # ModelCheckpoint's dirpath
    lit.mkdir()
    torch_file(lit / "last.ckpt")
    s = start(["lit.py", "--out", "r"], resume=[], resume_env={"SUPERVISE_CKPT_PATH": "{checkpoint}"},
              checkpoint_dir=[str(lit)])
    line, note = relaunch_plan(s, verdict_of("dead"), tmp_path)
    assert f"--env=SUPERVISE_CKPT_PATH={lit / 'last.ckpt'} " in line and words(line) == ["python", "-u", "lit.py", "--out", "r"]
    assert note == f"resumes from {lit / 'last.ckpt'}"


def test_a_fatal_from_a_non_finite_value_halves_the_lr_and_any_other_is_fixed_first(tmp_path):
    s = start(["t.py", "--lr", "1e-2"], **TEMPLATE)
    msg = "ANOMALY fatal: FATAL = 'non-finite loss nan at step 31' at step 31. Lower the learning rate."
    assert words(relaunch_line(s, verdict_of("fatal", msg), tmp_path))[-3:] == ["--lr", "0.005", "--resume"]
    line, note = relaunch_plan(s, verdict_of("fatal", "FATAL = 'labels are all one class'"), tmp_path)
    assert line is None and note == "a relaunch does not fix fatal"


def test_every_kind_has_a_decision():
    for kind in KINDS:
        assert change_for(kind) in ("batch", "lr", "same", None)
    assert {k for k in KINDS if change_for(k) is not None} >= {"oom", "nan", "dead", "stall", "disk"}


PY = "/venv/bin/python3"


@pytest.mark.parametrize("record,expected,note", [
    # the launcher the run was started with: its interpreter, -m torch.distributed.run, its arguments
    ({"launcher": [PY, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=4", "--rdzv_backend=c10d",
                   "--rdzv_endpoint=node-a:29400", "--rdzv_id=7"], "world_size": 8},
     [PY, "-u", "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=4", "--rdzv_backend=c10d",
      "--rdzv_endpoint=node-a:29400", "--rdzv_id=7"], ""),
    # an older writer's start record: one node assumed, and the note says so; never a bare torchrun
    ({"world_size": 4}, ["python", "-u", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4"],
     "does not say how its 4 processes were launched"),
])
def test_torchrun_runs_are_relaunched_with_their_launcher(record, expected, note, tmp_path):
    line, said = relaunch_plan(start(["/w/train_torch.py", "--out", "r"], **TEMPLATE, **record), verdict_of("dead"), tmp_path)
    assert words(line) == [*expected, "/w/train_torch.py", "--out", "r", "--resume"] and note in said
    assert "torchrun " not in line


def test_a_slurm_job_is_resubmitted_through_the_launcher_with_its_resources(tmp_path):
    slurm = {"job_name": "exp1", "partition": "gpu", "nodes": "1", "cpus_per_task": "8", "gpus_per_node": "4",
             "mem_per_node": "64000"}
    s = start(["train.py", "--out", str(tmp_path), "--lr=0.01"], **TEMPLATE, slurm_job_id="4242", slurm=slurm)
    line, note = relaunch_plan(s, verdict_of("nan"), tmp_path)
    w = shlex.split(line)
    assert w[:3] == ["cd", START["cwd"], "&&"] and w[4].endswith("/scripts/launch.py") and w[5:8] == [
        str(tmp_path), "--replace", "--slurm"]
    assert w[8:w.index("--")] == ["--sbatch=--job-name=exp1", "--sbatch=--partition=gpu", "--sbatch=--nodes=1",
                                  "--sbatch=--cpus-per-task=8", "--sbatch=--gres=gpu:4", "--sbatch=--mem=64000M"]
    assert w[w.index("--") + 1:] == ["python", "-u", "train.py", "--out", str(tmp_path), "--lr=0.005", "--resume"]
    assert "scontrol requeue 4242" in note and "through the launcher" in note
    assert guard.decide(Call(tool="Bash", command=line, background=False, cwd=str(tmp_path), env={})) is None
    # a job the launcher submitted keeps the launcher's own sbatch options
    line, note = relaunch_plan(s, verdict_of("preempted"), tmp_path, options=["--partition=debug", "--cpus-per-task=2"])
    w = shlex.split(line)
    assert w[8:w.index("--")] == ["--sbatch=--partition=debug", "--sbatch=--cpus-per-task=2"], line
    assert note.startswith("a resubmission of Slurm job 4242 through the launcher (the same sbatch options)")


def test_the_line_goes_through_the_launcher(tmp_path):
    """Every attempt is a launch: cd CWD && PY scripts/launch.py RUN --replace [--window] -- CMD."""
    run = tmp_path / "my run"
    line = relaunch_line(START, verdict_of("dead"), run, window_s=8 * 3600)
    q = shlex.quote
    assert "\n" not in line
    w = shlex.split(line)
    assert line.startswith(f"cd {q(START['cwd'])} && ")
    assert w[3:9] == [sys.executable, str(ROOT / "scripts" / "launch.py"), str(run), "--replace", "--window", "28800s"]
    assert words(line) == ["python", "-u", "train_torch.py", "--out", "runs/a", "--lr", "0.01"]
    assert ">>" not in w and "PYTHONUNBUFFERED=1" not in w  # the launcher appends to train.log and sets them
    # a relative run directory is made absolute
    rel = relaunch_line(START, verdict_of("dead"), "runs/a")
    assert f" {q(str(__import__('pathlib').Path.cwd() / 'runs/a'))} --replace " in rel


@pytest.mark.parametrize("kind", ["dead", "oom", "nan", "stall", None])
@pytest.mark.parametrize("world", [1, 2])
def test_the_line_passes_the_launch_guard(kind, world, tmp_path):
    (tmp_path / "hparams.json").write_text(json.dumps({"batch_size": 16, "grad_accum": 1, "lr": 0.01}))
    line = relaunch_line(start(["train_hf.py", "--out", str(tmp_path)], world_size=world), verdict_of(kind), tmp_path)
    for background in (True, False):
        call = Call(tool="Bash", command=line, background=background, cwd=str(tmp_path), env={})
        assert guard.decide(call) is None, guard.decide(call)
    # and its training command run raw in the background is refused: the check can fail
    bare = shlex.join(words(line)) + f" >> {tmp_path}/train.log 2>&1 &"
    assert guard.decide(Call(tool="Bash", command=bare, background=False, cwd=str(tmp_path), env={}))


def test_the_watchdog_line_runs_the_bundles_watchdog(tmp_path):
    line = watchdog_line(tmp_path / "run", python=sys.executable)
    w = shlex.split(line)
    assert w == [sys.executable, str(ROOT / "scripts" / "watchdog.py"), str(tmp_path / "run")]
    assert guard.decide(Call(tool="Bash", command=line, background=True, cwd=str(tmp_path), env={})) is None
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
    code = ("import sys; sys.path.insert(0, %r); import supervise.act.recovery; "
            "print(sorted(m for m in ('torch', 'pandas', 'numpy') if m in sys.modules))" % str(ROOT))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.stdout.strip() == "[]", p.stderr


def test_the_attempts_begin_at_each_ones_first_step_record():
    recs = [{"event": "start", "attempt": 1}, {"step": 10, "t": 1, "loss": 0.7}, {"step": 20, "eval_auroc": 0.6},
            {"step": 20, "t": 2, "loss": 0.6}, {"event": "start", "attempt": 2}, {"step": 30, "t": 1, "loss": 0.5},
            {"event": "start", "attempt": 3}, {"step": 25, "t": 1, "FATAL": "boom"},
            {"event": "start", "attempt": 4}, {"step": 30, "t": 1, "loss": 0.5}]
    rules = RecordRules(Thresholds(), RECORD_RULES)
    for rec in recs:
        rules.add(rec)
    got = [tuple(a) for a in rules.attempts]
    assert [(s["attempt"], step) for s, step in got] == [(1, 10), (2, 30), (3, None), (4, 30)]
    assert no_progress(got) is not None and no_progress(got[:3]) is None
