"""The engine seam: a scheduler is one module behind one interface and one registration
(supervise/observe/engines/__init__.py). Measured by adding a stub engine to a copy of the bundle:
the files that differ from the bundle are counted, then the copy's own front doors (launch.py,
watchdog.py, checkin.py, stop.py) are run on a job of that engine: submitted, waiting (no stall),
ended (a verdict of the table's kind), resubmitted by the relaunch line, cancelled."""
import filecmp
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, kind_of, wait_for

# A scheduler whose queue is a folder of JSON files ($STUB_QUEUE/<id>.json): the test plays its
# controller, moving a job from PENDING to RUNNING to an end state.
STUB = '''"""A stub scheduler for tests: its queue is a folder of JSON files ($STUB_QUEUE)."""
import json
import os
from pathlib import Path

from supervise.cli import UsageError
from supervise.observe.engines import ENDED, RUNNING, UNKNOWN, WAITING, Cancelled, End, Job

NAME = "stub"
LAUNCH_FLAG, LAUNCH_HELP = "--stub", "submit the command to the stub scheduler"
OPTION_FLAG, OPTION_HELP = "--stub-option", "with --stub: an option of the stub scheduler (repeatable)"
WATCH_FLAG, WATCH_HELP = "--stub-job", "follow a stub job"
FRESH = "a stub job: submit it again with a new output folder"
PHASES = {"PENDING": WAITING, "RUNNING": RUNNING, "PREEMPTED": ENDED, "CANCELLED": ENDED}


def _queue():
    return Path(os.environ["STUB_QUEUE"])


def job_id(text):
    if not str(text).isdigit():
        raise ValueError(f"{text!r} is not a stub job id")
    return str(text)


def state(job, runner=None):
    try:
        said = json.loads((_queue() / f"{job}.json").read_text())
    except (OSError, ValueError) as e:
        return Job(NAME, job, UNKNOWN, error=f"stub job {job} unknown: {e}")
    st = said["state"]
    phase = PHASES.get(st, UNKNOWN)
    end = End("preempted", f"stub job {job} state = {st}", "Resubmit it, resuming from the last checkpoint") \\
        if phase == ENDED else None
    return Job(NAME, job, phase, state=st, reason=said.get("reason", ""), end=end, logs=said["log"])


def check(argv, cwd, env):
    if not _queue().is_dir():
        raise UsageError(f"no stub queue at {_queue()}")
    return {}


def submit(run, argv, *, cwd, env, variables, log, options=()):
    job = str(len(list(_queue().glob("*.json"))) + 1)
    (_queue() / f"{job}.json").write_text(json.dumps({"state": "PENDING", "reason": "Resources", "argv": argv,
                                                       "cwd": str(cwd), "log": str(log), "options": list(options)}))
    return {"pid": None, "host": None, "job_id": job, "options": list(options)}


def held(rec):
    return state(rec["job_id"]).phase in (WAITING, RUNNING)


def cancel(rec, grace_s=0.0, clock=None, runner=None):
    path = _queue() / f"{rec['job_id']}.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "state": "CANCELLED"}))
    return Cancelled(["cancel"], True, None, f"cancelled stub job {rec['job_id']}")


def job_of(start):
    return None


def resubmit(start, recorded=None):
    return [LAUNCH_FLAG, *(f"{OPTION_FLAG}={o}" for o in recorded or [])], "a resubmission to the stub scheduler"
'''
REGISTRATION = '    "stub": "supervise.observe.engines.stub",\n'


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """A copy of the bundle (supervise/, scripts/) with the stub engine added: one new module,
    one line in the registry."""
    base = tmp_path_factory.mktemp("bundle")
    ignore = shutil.ignore_patterns("__pycache__")
    for name in ("supervise", "scripts"):
        shutil.copytree(ROOT / name, base / name, ignore=ignore)
    (base / "supervise/observe/engines/stub.py").write_text(STUB)
    init = base / "supervise/observe/engines/__init__.py"
    text = init.read_text()
    anchor = '    "slurm": "supervise.observe.engines.slurm",\n'
    assert anchor in text
    init.write_text(text.replace(anchor, anchor + REGISTRATION))
    return base


def touched(a: Path, b: Path) -> tuple:
    """(files only in b, files that differ) between two trees, as paths relative to them."""
    added, changed = [], []

    def walk(cmp, rel):
        added.extend(str(rel / n) for n in cmp.right_only if n != "__pycache__")
        changed.extend(str(rel / n) for n in cmp.diff_files)
        for name, sub in cmp.subdirs.items():
            if name != "__pycache__":
                walk(sub, rel / name)
    for name in ("supervise", "scripts"):
        walk(filecmp.dircmp(a / name, b / name), Path(name))
    return sorted(added), sorted(changed)


def test_a_new_engine_is_one_module_and_one_registration(bundle):
    added, changed = touched(ROOT, bundle)
    assert (added, changed) == (["supervise/observe/engines/stub.py"], ["supervise/observe/engines/__init__.py"])
    old = (ROOT / changed[0]).read_text().splitlines()
    new = (bundle / changed[0]).read_text().splitlines()
    assert [ln for ln in new if ln not in old] == [REGISTRATION.rstrip("\n")]


def _run(bundle, env, script, *args, timeout=60):
    return subprocess.run([sys.executable, str(bundle / "scripts" / f"{script}.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=bundle)


def _state(run: Path) -> dict:
    """watchdog.json, {} before the first poll wrote it."""
    try:
        return json.loads((run / "watchdog.json").read_text())
    except (OSError, ValueError):
        return {}


def _set(queue: Path, job: str, **fields):
    path = queue / f"{job}.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


@pytest.fixture
def stub(bundle, tmp_path):
    queue = tmp_path / "queue"
    queue.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(STUB_QUEUE=str(queue), SUPERVISE_STATE_DIR=str(tmp_path / "state"))
    return queue, env


def test_a_stub_job_is_launched_followed_judged_resubmitted_and_cancelled(bundle, stub, tmp_path):
    queue, env = stub
    run = tmp_path / "runs" / "a"
    p = _run(bundle, env, "launch", run, "--stub", "--stub-option=--queue=debug", "--",
             "python", "-u", "train.py", "--out", run)
    assert p.returncode == 0 and p.stdout.startswith("submitted Stub job 1, output >> "), p.stdout + p.stderr
    assert str(bundle / "scripts" / "watchdog.py") in p.stdout          # the copy's own front doors ran
    rec = json.loads((run / "launch.json").read_text())
    assert (rec["engine"], rec["job_id"], rec["options"], rec["pid"]) == ("stub", "1", ["--queue=debug"], None)

    # queued past the start-up grace: no stall, no no_telemetry; the watchdog follows launch.json's job
    wd = subprocess.Popen([sys.executable, str(bundle / "scripts" / "watchdog.py"), str(run), "--poll", "0.2",
                           "--startup-grace", "1s"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env, cwd=bundle)
    try:
        t0 = time.time()
        state = wait_for(lambda: (s := _state(run)).get("polls", 0) >= 5
                         and time.time() - t0 > 2 and s, "five polls past the grace", proc=wd)
        assert wd.poll() is None and (state["state"], state["job_state"]) == ("watching", "PENDING"), state
        assert any("Stub job 1 is PENDING (Resources): it waits (queued," in w for w in state["warnings"]), state
        _set(queue, "1", state="RUNNING")
        with open(run / "metrics.jsonl", "a") as f:   # the job's trainer starts: its start record
            f.write(json.dumps({"event": "start", "t": 0.0, "run_id": "r1", "argv": ["train.py", "--out", str(run)],
                                "cwd": str(tmp_path), "python": sys.executable, "time": time.time()}) + "\n")
        wait_for(lambda: _state(run).get("job_state") == "RUNNING", "the job runs", proc=wd)
        _set(queue, "1", state="PREEMPTED")
        out, err = wd.communicate(timeout=60)
    finally:
        if wd.poll() is None:
            wd.kill()
    assert wd.returncode == 7 and kind_of(out) == "preempted", out + err
    assert out.strip().startswith("ANOMALY preempted: stub job 1 state = PREEMPTED at step 0. Resubmit it"), out

    # check-in: the engine's line, and a relaunch line that resubmits through the same engine
    c = _run(bundle, env, "checkin", run)
    assert c.returncode == 0 and "stub: job 1 PREEMPTED" in c.stdout, c.stdout + c.stderr
    nxt = next(ln for ln in c.stdout.splitlines() if "launch.py" in ln and "--replace" in ln)
    assert "--stub --stub-option=--queue=debug" in nxt, nxt

    # a held job: a plain launch refuses, stop.py cancels it through the engine
    _set(queue, "1", state="PENDING")
    again = _run(bundle, env, "launch", run, "--stub", "--", "python", "train.py")
    assert again.returncode == 2 and "already has Stub job 1 queued or running" in again.stderr, again.stderr
    s = _run(bundle, env, "stop", run)
    assert s.returncode == 0 and s.stdout.strip() == "cancelled stub job 1", s.stdout + s.stderr
    assert json.loads((queue / "1.json").read_text())["state"] == "CANCELLED"
    assert _run(bundle, env, "stop", run).stdout.strip() == "Stub job 1 has already ended; nothing to stop"


def test_the_registry_names_each_engine_once_and_every_one_answers_the_interface():
    from supervise.observe import engines
    for name in engines.ENGINES:
        eng = engines.engine(name)
        assert eng.NAME == name
        for fn in ("state", "check", "submit", "held", "cancel", "job_of", "resubmit"):
            assert callable(getattr(eng, fn)), f"{name}.{fn}"
    with pytest.raises(KeyError, match=f"no engine 'nomad': known ones are {', '.join(engines.ENGINES)}"):
        engines.engine("nomad")
