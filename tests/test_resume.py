"""Recovery on the real templates: SIGKILL mid-run, the relaunch line from supervise.act.recovery run
verbatim through a shell, the watchdog beside it saying OK done for the new attempt; SIGKILL
during checkpoint saves never leaves an unloadable file; two checkpoints at most; the loss after
a resume continues the uninterrupted run's."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, attempts, end_group, launch_line, need, read_json, records, run_relaunch, shell, verdict_of, \
    wait_for
from supervise.act.recovery import relaunch_line, watchdog_line
from supervise.vocabulary import QUIET

torch = need("torch")
need("transformers")

VENV_BIN = str(Path(sys.executable).parent)


def venv() -> dict:
    """An activated venv, read when a process starts (so that it carries the test's SUPERVISE_STATE_DIR)."""
    return {**os.environ, "PATH": VENV_BIN + os.pathsep + os.environ.get("PATH", "")}


ARGS = ["--samples", "2000", "--max-steps", "60", "--eval-steps", "20", "--logging-steps", "10"]
TEMPLATES = ["train_torch.py", "train_hf.py"]
WAIT = 400  # seconds: generous, for a machine with every core busy


def checkpoints(run: Path):
    """The checkpoint entries a reader counts: last.pt / best.pt, checkpoint-N."""
    d = run / "checkpoints"
    return sorted(p.name for p in d.iterdir() if p.name in ("last.pt", "best.pt") or p.name.startswith("checkpoint-")) \
        if d.is_dir() else []


def template_line(job: Path, name: str, *args) -> str:
    """The docstring's launch line: one physical line, output appended to RUN_DIR/train.log."""
    return launch_line(["python", "-u", name, "--out", "run", *args], "run", cd=job, env={"PYTHONUNBUFFERED": "1", **QUIET})


def run_line(line: str, **kw) -> subprocess.Popen:
    """``line`` through bash in the activated venv."""
    return shell(line, env=venv(), **kw)


def trainer_pid(run: Path, attempt: int):
    """The pid in the start record of the given attempt, once written."""
    starts = [a[0] for a in attempts(run)]
    return starts[attempt - 1]["pid"] if len(starts) >= attempt else None


def newest_saved_step(run: Path) -> int:
    """The step of the newest whole checkpoint on disk, read from the checkpoint itself:
    last.pt's own step (the torch template), the highest checkpoint-N with its trainer state (HF)."""
    d = run / "checkpoints"
    if (d / "last.pt").exists():
        return int(need("torch").load(d / "last.pt", map_location="cpu", weights_only=False)["step"])
    return max(int(p.name.split("-")[1]) for p in d.glob("checkpoint-*") if (p / "trainer_state.json").exists())


def steps_of(attempt):
    return [r for r in attempt if "loss" in r]


@pytest.fixture(scope="module", params=TEMPLATES)
def reference(request, tmp_path_factory):
    """The uninterrupted run on the same seed and flags."""
    job = tmp_path_factory.mktemp("ref")
    shutil.copy(ROOT / "templates" / request.param, job)
    p = run_line(template_line(job, request.param, *ARGS))
    assert p.wait(timeout=WAIT) == 0, (job / "run" / "train.log").read_text()[-3000:]
    return request.param, {r["step"]: r["loss"] for r in steps_of(attempts(job / "run")[0])}


@pytest.mark.parametrize("kind", ["dead", "oom"])
def test_sigkill_mid_run_then_the_relaunch_line_finishes_it(reference, kind, tmp_path):
    name, ref_loss = reference
    job = tmp_path / "job"
    job.mkdir()
    shutil.copy(ROOT / "templates" / name, job)
    run = job / "run"
    first = run_line(template_line(job, name, *ARGS))
    try:
        # mid-run: past the first checkpoint (step 20) and a step record after it
        wait_for(lambda: checkpoints(run) and any(r.get("step", 0) > 20 and "loss" in r for r in records(run)),
                 "a step after the first checkpoint", timeout=WAIT, proc=first)
        os.kill(trainer_pid(run, 1), signal.SIGKILL)
        assert first.wait(timeout=60) == -signal.SIGKILL or first.returncode == 128 + signal.SIGKILL
    finally:
        end_group(first)
    killed_at = max(r["step"] for r in records(run) if "loss" in r)
    assert killed_at < 60 and not (run / "final_val_metrics.json").exists()
    assert len(checkpoints(run)) <= 2
    saved = newest_saved_step(run)   # 20, or 40 when the kill came after that save

    start = attempts(run)[0][0]
    line = relaunch_line(start, verdict_of(kind), run)
    assert line and "\n" not in line and " --replace -- " in line  # through the launcher, like the first launch
    wd = run_line(watchdog_line(run, python=sys.executable) + " --poll 0.5", stdout=subprocess.PIPE,
                  stderr=subprocess.PIPE, text=True)
    try:
        run_relaunch(line, run, env=venv(), timeout=WAIT)  # verbatim, through a shell, as the agent runs it
        out, err = wd.communicate(timeout=120)
    finally:
        if wd.poll() is None:
            wd.kill()
            wd.wait()

    a1, a2 = attempts(run)
    assert (a1[0]["attempt"], a2[0]["attempt"]) == (1, 2) and a1[0]["run_id"] != a2[0]["run_id"]
    assert a2[0]["argv"][-1] == "--resume" and a2[0]["cwd"] == str(job)
    assert steps_of(a1)[-1]["step"] == killed_at  # the first attempt's records were kept, not truncated
    resumed = steps_of(a2)
    (said,) = re.findall(r"^resume: step (\d+) from run/checkpoints/\S+$", (run / "train.log").read_text(), re.M)
    from_step = int(said)
    assert from_step == saved and saved <= killed_at  # the last checkpoint before the kill
    assert resumed[0]["step"] == from_step + 10 and resumed[-1]["step"] == 60  # the step count continues
    final = read_json(run / "final_val_metrics.json")
    assert final["run_id"] == a2[0]["run_id"] and final["attempt"] == 2 and final["step"] == 60
    assert len(checkpoints(run)) <= 2, checkpoints(run)
    if kind == "oom":
        assert a2[0]["argv"][-3:] == ["--batch-size=16", "--grad-accum=2", "--resume"]
        assert a2[0]["batch_size"] == a1[0]["batch_size"] == 32  # samples per step unchanged
    # the loss curve continues the uninterrupted one: the same numbers on the same batches; within
    # noise where the batch is split in two (BERT's dropout masks are drawn per micro-batch)
    tol = dict(abs=0.02) if kind == "oom" and name == "train_hf.py" else dict(rel=1e-3, abs=1e-4)
    print(f"\n{name} {kind}: killed at step {killed_at}, resumed from {from_step}; loss resumed vs uninterrupted: " +
          ", ".join(f"step {r['step']} {r['loss']:.6f} vs {ref_loss[r['step']]:.6f}" for r in resumed))
    for r in resumed:
        assert r["loss"] == pytest.approx(ref_loss[r["step"]], **tol), (r["step"], r["loss"], ref_loss)
    assert wd.returncode == 0 and out.startswith("OK done: final_val_metrics.json written at step 60/60 (attempt 2)"), \
        out + err


def stop_during_save(proc_pid: int, run: Path, name: str, timeout=WAIT):
    """SIGSTOP the trainer at the moment a save is under way (a temporary file or folder is
    there while it is stopped), then SIGKILL it. Returns the temporaries it left."""
    d = run / "checkpoints"

    def partial():
        if not d.is_dir():
            return []
        return [p.name for p in d.iterdir() if p.name.startswith(".tmp.") or p.name == ".staging"]

    def caught():
        if not partial():
            return None
        os.kill(proc_pid, signal.SIGSTOP)
        left = partial()
        if left:
            assert len(checkpoints(run)) <= 2, checkpoints(run)  # two at most, even mid-save
            os.kill(proc_pid, signal.SIGKILL)
            return left
        os.kill(proc_pid, signal.SIGCONT)  # the save had just finished: wait for the next
        return None
    return wait_for(caught, "a save under way", timeout=timeout, tick=0.0005)


def every_file_loads(run: Path, name: str):
    d = run / "checkpoints"
    entries = checkpoints(run)
    assert entries, "no checkpoint left"
    for e in entries:
        path = d / e
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        for f in files:
            if f.suffix in (".pt", ".pth", ".bin"):
                torch.load(f, map_location="cpu", weights_only=False)
            elif f.suffix == ".json":
                json.loads(f.read_text())
            elif f.suffix == ".safetensors":
                from safetensors.torch import load_file
                load_file(f)
    return entries


@pytest.mark.parametrize("name", TEMPLATES)
def test_sigkill_during_saves_never_leaves_an_unloadable_checkpoint(name, tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    shutil.copy(ROOT / "templates" / name, job)
    run = job / "run"
    args = ["--samples", "2000", "--max-steps", "40", "--eval-steps", "2", "--logging-steps", "2"]
    caught = []
    for i in range(3):
        p = run_line(template_line(job, name, *args, *(["--resume"] if i else [])))
        try:
            pid = wait_for(lambda: trainer_pid(run, i + 1), f"attempt {i + 1}'s start record", WAIT, proc=p)
            wait_for(lambda: checkpoints(run), "a first checkpoint", WAIT, proc=p)  # then catch the next save
            caught.append(stop_during_save(pid, run, name))
            p.wait(timeout=60)
        finally:
            end_group(p)
        every_file_loads(run, name)
    assert all(caught), caught
    p = run_line(template_line(job, name, *args, "--resume"))
    assert p.wait(timeout=WAIT) == 0, (run / "train.log").read_text()[-3000:]
    assert read_json(run / "final_val_metrics.json")["attempt"] == 4
    left = every_file_loads(run, name)
    assert 1 <= len(left) <= 2 and not [x for x in os.listdir(run / "checkpoints") if x.startswith(".")], \
        os.listdir(run / "checkpoints")
    print(f"\n{name}: 3 kills during saves ({caught}); after the last resume: {left}")


@pytest.mark.parametrize("name", TEMPLATES)
def test_resume_without_a_checkpoint_starts_fresh_and_says_so(name, tmp_path):
    shutil.copy(ROOT / "templates" / name, tmp_path)
    p = subprocess.run([sys.executable, "-u", name, "--out", "run", "--resume", "--samples", "400",
                        "--max-steps", "4", "--eval-steps", "2", "--logging-steps", "2"],
                       cwd=tmp_path, env=venv(), capture_output=True, text=True, timeout=WAIT)
    assert p.returncode == 0, p.stderr[-2000:]
    said = [ln for ln in p.stdout.splitlines() if ln.startswith("resume:")]
    assert said == [f"resume: no checkpoint in {os.path.join('run', 'checkpoints')}; starting fresh"]
    (start,) = [r for r in records(tmp_path / "run") if r.get("event") == "start"]
    assert start["attempt"] == 1 and steps_of(records(tmp_path / "run"))[0]["step"] == 2
    # a fresh launch over that checkpoint is refused in one line: --resume, or another --out
    q = subprocess.run([sys.executable, "-u", name, "--out", "run"], cwd=tmp_path, env=venv(),
                       capture_output=True, text=True, timeout=WAIT)
    assert q.returncode == 2 and q.stderr.strip().count("\n") == 0
    assert q.stderr.startswith("error: run/checkpoints/") and q.stderr.strip().endswith(
        "holds an earlier run: pass --resume to continue it, or another --out")
    assert [r for r in records(tmp_path / "run") if r.get("event") == "start"] == [start]


def test_hf_tidy_finishes_an_interrupted_rename(tmp_path):
    """A kill between the steps of an HF save: a complete checkpoint waiting as .ready-* is renamed
    into place; a half-written .staging and old .trash-* folders are removed."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("train_hf", ROOT / "templates" / "train_hf.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    d = tmp_path / "checkpoints"
    for sub in ("checkpoint-20", ".ready-checkpoint-40", ".staging/checkpoint-60", ".trash-checkpoint-10"):
        (d / sub).mkdir(parents=True)
        (d / sub / "trainer_state.json").write_text("{}")
    mod.tidy_checkpoints(str(d))
    assert sorted(os.listdir(d)) == ["checkpoint-20", "checkpoint-40"]
    assert mod.latest_checkpoint(str(d)) == str(d / "checkpoint-40")
