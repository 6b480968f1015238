"""Users' own training scripts (tests/user_scripts/), each integrated with the documented lines
only, through every step: smoke passes on the unmodified script; after a SIGKILL mid-run the
relaunch line from supervise.act.recovery, run literally through a shell, continues from a
checkpoint; after a NaN, the line with half the learning rate runs (or, where the learning rate
is not a flag of the script, there is no line and the note says why).

Each test prints one row of the closing table: script, what happened, the step it resumed at,
and the command that ran (pytest -s shows them)."""
import json
import os
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import ROOT, attempts, end_group, launch_line, missing, need, records, run_relaunch, shell, verdict_of, \
    wait_for
from supervise.guard.hook import decide
from supervise.guard.shell import Call
from supervise.act.recovery import relaunch_plan
from supervise.vocabulary import QUIET

need("torch")
need("transformers")
USER = ROOT / "tests" / "user_scripts"


def env() -> dict:
    """An activated venv with the bundle importable, read when a process starts (so that it
    carries the test's SUPERVISE_STATE_DIR)."""
    return {**os.environ, "PYTHONPATH": str(ROOT), "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"]}


WAIT = 400  # seconds: generous, for a machine with every core busy
HF_ARGS = ["--eval_strategy", "steps", "--eval_steps", "20", "--save_steps", "20", "--logging_steps", "10",
           "--report_to", "none", "--max_steps", "80"]


@dataclass
class Script:
    name: str
    args: list                    # "{run}" is the run directory (relative to the job folder)
    alive: dict = field(default_factory=lambda: {"env": {"FAULT_SLEEP": "0.1"}})  # keeps it running for a signal
    nan: dict = field(default_factory=lambda: {"env": {"FAULT_NAN_AT": "25"}})
    halved: str = ""              # the learning-rate word(s) of the line after nan; "" when there is no line
    no_line: str = ""             # ... then the note says this
    resumes: bool = True          # the start record declares a recipe
    smoke_fails: tuple = ()       # rows a sound smoke still fails (a script that saves no checkpoint)


SCRIPTS = [
    Script("run_classification.py", ["--output_dir", "{run}", "--do_train", "--do_eval",
                                     "--per_device_train_batch_size", "16", "--learning_rate", "1e-2", *HF_ARGS],
           halved="--learning_rate 0.005"),
    Script("trl_sft.py", ["--output_dir={run}", "--learning_rate=3e-3", "--max_length=16", "--bf16=False",
                          *(f"{k}={v}" for k, v in zip(HF_ARGS[::2], HF_ARGS[1::2]))],
           halved="--learning_rate=0.0015"),
    Script("lightning_lm.py", ["--out", "{run}", "--steps", "80"], alive={"args": ["--sleep", "0.1"]},
           nan={"args": ["--nan-at", "25"]},
           no_line="the learning rate is neither on the command line nor in the start record's flags or hparams.json"),
    Script("nanogpt_train.py", ["--out_dir={run}", "--learning_rate=3e-3"], halved="--learning_rate=0.0015"),
    Script("plain_loop.py", ["--out", "{run}", "--steps", "80"], alive={"args": ["--sleep", "0.1"]},
           nan={"args": ["--nan-at", "25"]}, resumes=False, smoke_fails=("checkpoint",),
           no_line="the learning rate is neither on the command line nor in the start record's flags or hparams.json"),
]
IDS = [s.name for s in SCRIPTS]


def first_step(attempt) -> int:
    return next(r["step"] for r in attempt if "loss" in r)


def command(s: Script, run: str, extra=None) -> list:
    return [sys.executable, "-u", str(USER / s.name), *(a.replace("{run}", run) for a in s.args),
            *((extra or {}).get("args", []))]


def launch(job: Path, s: Script, extra=None) -> subprocess.Popen:
    """The documented launch line, through a shell, output appended to run/train.log."""
    variables = {"PYTHONUNBUFFERED": "1", **QUIET, **(extra or {}).get("env", {})}
    return shell(launch_line(command(s, "run", extra), "run", cd=job, env=variables), env=env())


def log_tail(run: Path) -> str:
    return "train.log:\n" + ((run / "train.log").read_text()[-3000:] if (run / "train.log").exists() else "")


def run_line(line: str, run: Path) -> dict:
    """The relaunch line as the agent runs it: verbatim, through a shell (it passes the launch
    guard and returns at once); the relaunched trainer followed to its end. Its launch record."""
    assert "\n" not in line and decide(Call("Bash", line, background=True)) is None, line
    return run_relaunch(line, run, env=env(), timeout=WAIT)


def table_row(script, what, resumed_at, cmd):
    print(f"\n| {script} | {what} | {resumed_at} | `{cmd}` |")


@pytest.mark.parametrize("s", SCRIPTS, ids=IDS)
def test_smoke_passes_on_the_integrated_script(s, tmp_path):
    run = tmp_path / "run"
    extra = s.alive  # slow enough that the smoke's kill lands after the first checkpoint
    cmd = command(s, str(run), extra)
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "smoke.py"), str(run), "--", *cmd],
                       capture_output=True, text=True, env={**env(), **extra.get("env", {})}, timeout=2 * WAIT)
    rows = {ln[6:22].strip(): (ln[:4], ln[23:]) for ln in p.stdout.splitlines() if ln[:4] in ("PASS", "FAIL", "SKIP")}
    failed = {k for k, (mark, _) in rows.items() if mark == "FAIL"}
    assert failed == set(s.smoke_fails), p.stdout + p.stderr[-2000:]
    assert p.returncode == (7 if s.smoke_fails else 0), p.stdout
    mark, said = rows["resume"]
    if s.resumes:
        assert mark == "PASS" and "the new attempt's first step record is step" in said, p.stdout
    else:
        assert mark == "SKIP" and "declares no resume recipe" in said, p.stdout
    task_rows = set(rows) & {"loss < chance", "accuracy rises", "auroc rises", "eval_loss falls", "loss falls"}
    assert task_rows and all(rows[k][0] == "PASS" for k in task_rows), p.stdout
    table_row(s.name, f"smoke {p.stdout.strip().splitlines()[-1]}", said.rsplit("step ", 1)[-1] if s.resumes else "-",
              f"smoke.py RUN -- {shlex.join(cmd[1:])}")


@pytest.mark.parametrize("s", SCRIPTS, ids=IDS)
def test_after_a_sigkill_the_relaunch_line_continues_from_a_checkpoint(s, tmp_path):
    run = tmp_path / "run"
    first = launch(tmp_path, s, s.alive)
    try:  # past the second save (step 40): the first step after the relaunch lies beyond the first (20)
        wait_for(lambda: any(r.get("step", 0) >= 50 and "loss" in r for r in records(run)), "a step after 40",
                 timeout=WAIT, proc=first, why=lambda: log_tail(run))
        os.kill(attempts(run)[0][0]["pid"], signal.SIGKILL)
        first.wait(timeout=60)
    finally:
        end_group(first)
    start = attempts(run)[-1][0]
    line, note = relaunch_plan(start, verdict_of("dead"), run)
    run_line(line, run)
    a1, a2 = attempts(run)
    final = json.loads((run / "final_val_metrics.json").read_text())
    assert final["run_id"] == a2[0]["run_id"]
    if s.resumes:
        resumed = first_step(a2)
        assert 20 < resumed <= 60 and a2[0]["attempt"] == 2 and a1[0]["run_id"] != a2[0]["run_id"], (resumed, note)
        assert "--resume" not in line or "--resume_from_checkpoint" in line  # never a guessed bare --resume
    else:  # no recipe: the same command, no guessed flag, and it says it starts over
        resumed = first_step(a2)
        assert resumed == first_step(a1) and a2[0]["attempt"] == 1 and "resume" not in " ".join(a2[0]["argv"])
        assert "declares no resume recipe" in note and "starts over from step 0" in note
    table_row(s.name, "SIGKILL mid-run, relaunch line ran to the sentinel" + (f" ({note})" if note else ""), resumed,
              line.split(" -- ", 1)[-1])


@pytest.mark.parametrize("s", SCRIPTS, ids=IDS)
def test_after_a_nan_the_line_with_half_the_learning_rate_runs(s, tmp_path):
    run = tmp_path / "run"
    p = launch(tmp_path, s, s.nan)
    assert p.wait(timeout=WAIT) != 0, (run / "train.log").read_text()[-3000:]
    (a1,) = attempts(run)
    fatal = [r for r in a1 if "FATAL" in r]
    assert fatal and "non-finite" in fatal[0]["FATAL"], a1[-3:]
    line, note = relaunch_plan(a1[0], verdict_of("nan"), run)
    if not s.halved:
        assert line is None and s.no_line in note, note
        table_row(s.name, f"nan: no relaunch line: {note}", "-", "-")
        return
    assert f" {s.halved} " in line, line
    run_line(line, run)
    a2 = attempts(run)[-1]
    argv, want = a2[0]["argv"], s.halved.split()
    assert a2[0]["attempt"] == 2 and any(argv[i:i + len(want)] == want for i in range(len(argv))), argv
    resumed = first_step(a2)
    assert 20 <= resumed <= 30, (resumed, fatal)  # from the save before the NaN, not from step 0
    assert json.loads((run / "final_val_metrics.json").read_text())["run_id"] == a2[0]["run_id"]
    table_row(s.name, f"nan at step {fatal[0]['step']}, half-LR line ran to the sentinel", resumed,
              line.split(" -- ", 1)[-1])


def test_sft_script_that_builds_its_arguments_in_code_gets_no_guessed_flag(tmp_path):
    """sft_tiny_llama.py builds SFTConfig in code (argparse for its own flags): the callback
    declares no recipe, so the relaunch line has no resume flag and says that it starts over."""
    s = Script("sft_tiny_llama.py", ["--out", "{run}", "--steps", "20"])
    run = tmp_path / "run"
    assert launch(tmp_path, s).wait(timeout=WAIT) == 0, (run / "train.log").read_text()[-3000:]
    start = attempts(run)[0][0]
    assert start["resume"] is None and start["checkpoint_dir"] == str(run / "checkpoints")
    line, note = relaunch_plan(start, verdict_of("dead"), run)
    assert shlex.split(line)[-4:] == ["--out", "run", "--steps", "20"] and "starts over from step 0" in note


def test_the_hf_recipe_follows_the_scripts_spelling(tmp_path):
    """Dashes on the command line give --resume-from-checkpoint; a lone .json config gives no recipe
    (a flag after it would switch the script from the file to the command line)."""
    s = Script("run_classification.py", ["--output-dir", "{run}", "--do-train", "--max-steps", "2",
                                         "--report-to", "none", "--save-strategy", "no"])
    run = tmp_path / "run"
    assert launch(tmp_path, s).wait(timeout=WAIT) == 0, (run / "train.log").read_text()[-3000:]
    start = attempts(run)[0][0]
    assert start["resume"] == ["--resume-from-checkpoint", "{checkpoint}"]
    assert set(start["flags"]) == {"--learning-rate", "--per-device-train-batch-size", "--gradient-accumulation-steps"}
    (tmp_path / "cfg.json").write_text(json.dumps({"output_dir": "run2", "do_train": True, "max_steps": 2,
                                                   "report_to": "none", "save_strategy": "no"}))
    p = subprocess.run([sys.executable, "-u", str(USER / "run_classification.py"), "cfg.json"], cwd=tmp_path,
                       env=env(), capture_output=True, text=True, timeout=WAIT)
    assert p.returncode == 0, p.stderr[-2000:]
    start = attempts(tmp_path / "run2")[0][0]
    assert start["resume"] is None and start["flags"] is None


def test_a_torchrun_run_is_relaunched_with_its_own_launcher(tmp_path):
    """Workers record the launcher from torchrun's command line (torchrun itself becomes
    python -m torch.distributed.run: the interpreter is known, a torchrun on PATH is not); the
    relaunch line, run literally, starts the same two processes again."""
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        missing(f"torchrun is not installed next to this Python ({torchrun}): torch's install puts it there")
    run = tmp_path / "run"
    loop = ["--standalone", "--nproc_per_node", "2", str(ROOT / "tests" / "ddp_loop.py"), "--out", str(run),
            "--steps", "6", "--step-time", "0"]
    line = launch_line([torchrun, *loop], run, env={"PYTHONUNBUFFERED": "1", **QUIET})
    assert subprocess.run(["bash", "-c", line], env=env(), timeout=WAIT).returncode == 0, \
        (run / "train.log").read_text()[-3000:]
    (a1,) = attempts(run)
    exe, *head = a1[0]["launcher"]
    assert Path(exe).resolve() == Path(sys.executable).resolve(), exe  # the workers' interpreter (python3)
    assert head == ["-m", "torch.distributed.run", *loop[:3]], a1[0]["launcher"]
    again, note = relaunch_plan(a1[0], verdict_of("dead"), run)
    w = shlex.split(again)
    assert w[w.index("--") + 1:] == [exe, "-u", "-m", "torch.distributed.run", *loop]
    run_line(again, run)
    a2 = attempts(run)[-1]
    assert a2[0]["run_id"] != a1[0]["run_id"] and a2[0]["world_size"] == 2
    assert [w for w in a2[0]["launcher"] if w != "-u"] == a1[0]["launcher"]  # the same launch once more
    table_row("ddp_loop.py (torchrun)", "relaunch line ran to the sentinel" + (f" ({note})" if note else ""),
              first_step(a2), again.split(" -- ", 1)[-1])
