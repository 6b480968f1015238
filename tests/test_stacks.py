"""Say where it hangs (issue 26): real hung processes under scripts/watchdog.py, as the agent runs it.

Each scenario asserts the frame (or the reason there is none) in the watchdog's one line and in
check-in, one file per process in RUN_DIR/stacks/, and bounds the time from the verdict (the
capture's start, saved in watchdog.json) to the watchdog's exit. A bound is what a capture must
never exceed (its own deadline is stacks.BUDGET), never a guess at how fast this machine is."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import ROOT, WATCHDOG, anomaly_line, assert_checkin_agrees, end_group, kind_of, launch_line, missing, \
    pid_alive, run_script, shell, wait_for, wait_for_lines
from supervise.observe import stacks as st
from supervise.telemetry import stack_signal

HANG = ROOT / "tests" / "hang_loop.py"
# the line fetch_shard blocks on: the frame every stack of the plain loop must name


def line_of(marker: str) -> int:
    """The line of hang_loop.py that holds ``marker``: the frame a stack must name."""
    return next(n for n, ln in enumerate(HANG.read_text().splitlines(), 1) if marker in ln)


FETCH = f"fetch_shard (hang_loop.py:{line_of('the plain loop')})"
LOOP = ROOT / "tests" / "ddp_loop.py"
FAST = ("--poll", "0.2", "--max-stall", "4")
EXIT_AFTER_VERDICT = 10.0   # s: the capture's deadline is 4 s; the rest is printing and exiting
PY_SPY = st.find_py_spy()


def need_py_spy():
    """py-spy for a test of the outside way: without it a skip here, a failure under CI=true."""
    if PY_SPY is None:
        missing("py-spy is not installed: pip install -e '.[hang]'")


# --- helpers --------------------------------------------------------------------------------------

class Hung:
    """tests/hang_loop.py in ``mode``, stdout/stderr to RUN_DIR/train.log, killed (with what it
    forked) at the end."""

    def __init__(self, run_dir: Path, mode: str, *extra, env=None):
        run_dir.mkdir(parents=True, exist_ok=True)
        self.run_dir = run_dir
        self.log = open(run_dir / "train.log", "ab")
        self.proc = subprocess.Popen([sys.executable, "-u", str(HANG), str(run_dir), "--mode", mode, *map(str, extra)],
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
                                     env={**os.environ, **(env or {})})

    def close(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.log.close()


@pytest.fixture
def hung():
    made = []

    def start(run_dir, mode, *extra, **kw):
        h = Hung(run_dir, mode, *extra, **kw)
        made.append(h)
        return h

    yield start
    for h in made:
        h.close()


def watch(run_dir, *flags, env=None, user=None, python=sys.executable, timeout=120) -> tuple:
    """scripts/watchdog.py RUN_DIR FLAGS to its end: (rc, its one line, watchdog.json, the wall
    clock it exited at). ``user``: the argv prefix that runs it as another user."""
    argv = [*(user or ()), python, str(WATCHDOG), str(run_dir), *FAST, *flags]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
    ended = time.time()
    lines = p.stdout.strip().splitlines()
    assert len(lines) == 1, p.stdout + p.stderr
    return p.returncode, lines[0], json.loads((Path(run_dir) / "watchdog.json").read_text()), ended


def assert_captured(run_dir, line, state, ended, n_files=1, how=None):
    """The capture's bounds, its files, and check-in's agreement; check-in's facts."""
    found = state["stacks"]
    assert found and found["folder"] == str(Path(run_dir) / "stacks"), state
    assert found["took"] <= 5.0, found                       # within 5 s of the verdict
    assert ended - found["when"] < EXIT_AFTER_VERDICT, (ended, found)
    files = [Path(f) for f in found["files"]]
    assert len(files) >= n_files and all(f.exists() and f.parent == Path(run_dir) / "stacks" for f in files), found
    assert all(re.match(r"\d{8}T\d{6}\.\d{3}-", f.name) for f in files), files   # the time in the name
    if how:   # each file begins '# pid N, rank R, faulthandler|py-spy, <time>'
        assert any(f", {how}, " in f.read_text().splitlines()[0] for f in files), [f.read_text()[:200] for f in files]
    facts = assert_checkin_agrees(run_dir, line)
    assert facts["stacks"] and str(Path(run_dir) / "stacks") in facts["stacks"], facts
    rc, out, err = run_script("checkin.py", run_dir)
    assert rc == 0 and line[:700] in out and "stacks: " in out and len(out) <= 1501, out + err
    return facts


def as_nobody() -> tuple:
    """(the argv prefix that runs a command as uid/gid 65534, a Python that user may run), or ``missing``."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        missing("needs root and setpriv to run the watchdog as another user")
    prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    for python in (sys.executable, "/usr/bin/python3"):
        ok = subprocess.run([*prefix, python, "-c", "import json"], capture_output=True).returncode == 0
        if ok:
            return prefix, python
    missing("no Python that uid 65534 may run")


# --- the signal and the in-process handler ---------------------------------------------------------

def test_the_signal_is_a_free_real_time_one_and_overridable():
    assert stack_signal("") == signal.SIGRTMIN + 6
    assert stack_signal("SIGUSR2") == signal.SIGUSR2 and stack_signal("usr2") == signal.SIGUSR2
    assert stack_signal("SIGRTMIN+9") == signal.SIGRTMIN + 9 and stack_signal("44") == 44
    for off in ("off", "0", "none", "SIGKILL", "SIGSTOP", "SIGNOPE", "SIGRTMIN+x", "999"):
        assert stack_signal(off) is None, off
    taken = {signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT}
    assert stack_signal("") not in taken   # Lightning, Slurm, torchrun, the HF Trainer (references/hangs.md)


CHILD = """
import json, os, signal, sys
sys.path.insert(0, {root!r})
{before}
from supervise.telemetry import Telemetry, stack_signal
tm = Telemetry({run!r})
h = signal.getsignal(signal.SIGRTMIN + 6)  # the default signal: the user's handler, if any, untouched
print(json.dumps({{"file": tm.stacks_file, "python_handler": callable(h) and h.__name__}}))
"""


def test_telemetry_registers_and_never_replaces_a_handler(tmp_path):
    def run(before, run_dir, env=None):
        p = subprocess.run([sys.executable, "-c", CHILD.format(root=str(ROOT), before=before, run=str(run_dir))],
                           capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})})
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)

    got = run("", tmp_path / "a")
    live = Path(got["file"])
    assert live.parent == tmp_path / "a" / "stacks" / ".live" and live.name.startswith("pid-")
    head = json.loads(live.read_text().splitlines()[0])
    assert head["registered"] is True and head["signal"] == signal.SIGRTMIN + 6 and head["rank"] == 0

    mine = "signal.signal(signal.SIGRTMIN + 6, lambda *a: None)"   # the user's stack took it already
    got = run(mine, tmp_path / "b")
    assert got["file"] is None and got["python_handler"] == "<lambda>"   # theirs, untouched
    (live,) = (tmp_path / "b" / "stacks" / ".live").iterdir()
    head = json.loads(live.read_text().splitlines()[0])
    assert head["registered"] is False and "already has a handler" in head["why"] and "SUPERVISE_STACK_SIGNAL" in head["why"]

    got = run(mine, tmp_path / "c", env={"SUPERVISE_STACK_SIGNAL": "SIGRTMIN+9"})   # moved out of its way
    head = json.loads(Path(got["file"]).read_text().splitlines()[0])
    assert head["registered"] is True and head["signal"] == signal.SIGRTMIN + 9 and got["python_handler"] == "<lambda>"

    got = run("", tmp_path / "d", env={"SUPERVISE_STACK_SIGNAL": "off"})
    assert got["file"] is None and not (tmp_path / "d" / "stacks").exists()


def test_a_process_without_the_handler_is_never_sent_the_signal(tmp_path):
    """A live file that claims a registration for a process that does not handle the signal
    (an older process's file, a pid reused): the capture checks SigCgt and does not send the
    signal, whose default action would end the process."""
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        live = tmp_path / "stacks" / ".live"
        live.mkdir(parents=True)
        (live / f"pid-{victim.pid}.txt").write_text(json.dumps(
            {"pid": victim.pid, "rank": 0, "signal": signal.SIGRTMIN + 6, "time": time.time(), "registered": True}) + "\n")
        head, why = st.registration(live, victim.pid)
        assert head is None and "is not handled" in why
        found = st.capture(tmp_path, [st.Target(victim.pid, 0, "rank")], py_spy=None)
        status = dict(ln.split(":\t", 1) for ln in Path(f"/proc/{victim.pid}/status").read_text().splitlines()
                      if ":\t" in ln)   # a signal sent is pending until delivered, and then it ends the process
        assert int(status["SigPnd"], 16) == int(status["ShdPnd"], 16) == 0 and status["State"][0] != "Z", status
        assert victim.poll() is None and pid_alive(victim.pid)
        (p,) = found.procs
        assert not p.frames and "py-spy is not installed" in p.error and Path(p.path).exists()
    finally:
        victim.kill()
        victim.wait()


# --- the phrase ------------------------------------------------------------------------------------

def F(func, file, line=None):
    return st.Frame(func, file, line)


LIB = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
STD = "/usr/lib/python3.11/queue.py"


def test_the_phrase_names_who_waits_in_the_collective_and_who_never_reached_it():
    waits = (F("all_reduce", LIB, 2700), F("wrapper", "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", 81),
             F("train", "/home/u/train.py", 41), F("<module>", "/home/u/train.py", 60))
    away = (F("get", STD, 171), F("load_shard", "/home/u/train.py", 33), F("train", "/home/u/train.py", 39))
    found = st.Capture(0.0, "/r/stacks", (
        st.ProcStack(10, None, "process", frames=(F("run", "/venv/lib/python3.11/site-packages/torch/distributed/run.py", 9),)),
        st.ProcStack(11, 0, "rank", 10, "faulthandler", frames=waits),
        st.ProcStack(12, 1, "rank", 10, "faulthandler", frames=away),
        st.ProcStack(13, 2, "rank", 10, "py-spy", frames=waits),
        st.ProcStack(14, 3, "rank", 10, "", error="py-spy may not attach: ...")))
    assert found.where() == ("ranks 0,2 wait in all_reduce (train.py:41); rank 1 is in load_shard (train.py:33), "
                             "never reached it; rank 3 has no stack (py-spy may not attach: ...)")
    one = st.Capture(0.0, "/r/stacks", (st.ProcStack(11, 0, "rank", frames=away),))
    assert one.where() == "pid 11 is in load_shard (train.py:33)"
    assert len(st.Capture(0.0, "/r", tuple(st.ProcStack(100 + r, r, "rank", frames=(F(f"f{r}", f"/u/m{r}.py", r),))
                                          for r in range(64))).where()) <= st.MAX_WHERE


def test_the_phrase_names_a_dataloader_worker_in_the_users_code():
    main = (F("get", STD, 113), F("_next_data", "/v/lib/python3.11/site-packages/torch/utils/data/dataloader.py", 1505),
            F("__next__", "/v/lib/python3.11/site-packages/torch/utils/data/dataloader.py", 725),
            F("train", "/u/train.py", 20))
    busy = (F("get", STD, 171), F("__getitem__", "/u/data.py", 12),
            F("fetch", "/v/lib/python3.11/site-packages/torch/utils/data/_utils/fetch.py", 54))
    idle = (F("get", STD, 113),)
    found = st.Capture(0.0, "/r/stacks", (st.ProcStack(1, 0, "rank", frames=main),
                                          st.ProcStack(2, 0, "worker", 1, frames=busy),
                                          st.ProcStack(3, 0, "worker", 1, frames=idle)))
    assert found.where() == ("pid 1 waits on its DataLoader (train.py:20); its DataLoader worker pid 2 is in "
                             "__getitem__ (data.py:12)")


def test_a_forked_workers_stack_stops_where_it_began():
    text = ('Current thread 0x1 (most recent call first):\n'
            '  File "/usr/lib/python3.11/queue.py", line 171 in get\n'
            '  File "/v/lib/python3.11/site-packages/torch/utils/data/_utils/worker.py", line 334 in _worker_loop\n'
            '  File "/usr/lib/python3.11/multiprocessing/process.py", line 108 in run\n'
            '  File "/u/train.py", line 20 in train\n'
            '  File "/u/train.py", line 30 in <module>\n')
    frames, n = st.main_frames(st.parse_faulthandler(text))
    assert n == 1 and [f.func for f in frames] == ["get", "_worker_loop"]   # not the parent's train()
    assert st.ProcStack(5, 0, "worker", 1, frames=frames).state()[0] == "library"


def test_py_spy_output_of_several_processes_is_told_apart():
    text = ("Process 10: python train.py\nPython v3.11.7 (/usr/bin/python3.11)\n\n"
            'Thread 10 (idle): "MainThread"\n    _try_get_data (/v/site-packages/torch/utils/data/dataloader.py:1291)\n'
            "    train (/u/train.py:20)\n\n"
            "Process 11: python train.py\nPython v3.11.7 (/usr/bin/python3.11)\n\n"
            'Thread 11 (idle): "MainThread"\n    Shards.__getitem__ (/u/data.py:12)\n    pthread_cond_wait (libc.so.6)\n')
    got = st.parse_py_spy(text)
    assert sorted(got) == [10, 11]
    frames, _ = st.main_frames(got[11][1])
    assert frames[0] == F("Shards.__getitem__", "/u/data.py", 12) and frames[1].line is None
    assert got[11][0].startswith("Process 11: ") and "Process 10" not in got[11][0]


# --- why py-spy may not attach ---------------------------------------------------------------------

@pytest.mark.parametrize("facts,says", [
    (dict(scope="3"), "ptrace_scope = 3 forbids every ptrace attach until a reboot"),
    (dict(owner=0, euid=1000, cap=False), "pid 7 belongs to uid 0 and the watchdog runs as uid 1000: run the watchdog as that user"),
    (dict(scope="2", cap=False), "ptrace_scope = 2 lets only CAP_SYS_PTRACE attach: run the watchdog with sudo"),
    (dict(scope="1", cap=False), "ptrace_scope = 1 lets only a parent attach: sudo sysctl kernel.yama.ptrace_scope=0"),
    (dict(scope="", cap=False, container=True), "this container lacks SYS_PTRACE: docker run --cap-add SYS_PTRACE"),
    (dict(scope="", cap=True), "ptrace was refused"),
])
def test_why_py_spy_may_not_attach_and_how_to_allow_it(facts, says):
    base = dict(scope="", euid=1000, owner=1000, cap=False, container=False)
    text = st.why_refused(7, **{**base, **facts})
    assert says in text and "integration" in text, text


# --- the NCCL flight recorder variables --------------------------------------------------------------

def test_the_flight_recorder_variables_never_override_the_users(tmp_path):
    got = st.flight_recorder_env({}, tmp_path)
    assert got == {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
                   "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(tmp_path.resolve() / "stacks" / "nccl" / "nccl_trace_rank_")}
    kept = st.flight_recorder_env({"TORCH_NCCL_TRACE_BUFFER_SIZE": "0", "TORCH_FR_DUMP_TEMP_FILE": "/x/"}, tmp_path)
    assert kept == {"TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
    assert st.cuda_machine({"CUDA_VISIBLE_DEVICES": ""}) is False


def test_the_launcher_sets_them_only_where_cuda_is(tmp_path, monkeypatch):
    from supervise.act import launch as ln
    show = [sys.executable, "-c", "import json, os; print(json.dumps({k: v for k, v in os.environ.items() "
            "if k.startswith(('TORCH_NCCL_', 'TORCH_FR_'))}))"]
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_NCCL_", "TORCH_FR_"))}
    for gpu, run in ((False, tmp_path / "cpu"), (True, tmp_path / "gpu"), (True, tmp_path / "mine")):
        monkeypatch.setattr(st, "cuda_machine", lambda env=None, gpu=gpu: gpu)
        run.mkdir()
        ln.launch(run, show, env={**base, "TORCH_NCCL_TRACE_BUFFER_SIZE": "64"} if run.name == "mine" else base)
        wait_for_lines(run / "train.log", 1)
        said = json.loads((run / "train.log").read_text().splitlines()[-1])
        if not gpu:
            assert said == {}, said
        elif run.name == "gpu":
            assert said["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1" and said["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000"
            assert said["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"].startswith(str(run / "stacks" / "nccl"))
            assert (run / "stacks" / "nccl").is_dir()
        else:
            assert said["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "64" and said["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"


@pytest.mark.parametrize("template", ["train_torch.py", "train_hf.py"])
def test_the_templates_set_them_only_where_cuda_is_the_device(template, tmp_path, monkeypatch):
    from conftest import need
    torch = need("torch")
    text = (ROOT / "templates" / template).read_text()
    scope: dict = {"os": os, "torch": torch}
    start = text.index("# NCCL's flight recorder for a GPU run")
    exec(compile(text[start:text.index("\n# ---", start)], template, "exec"), scope)   # the template's own lines
    assert scope["FLIGHT_RECORDER"] == st.FLIGHT_RECORDER
    saved = dict(os.environ)
    try:
        for k in list(os.environ):
            if k.startswith(("TORCH_NCCL_", "TORCH_FR_")):
                del os.environ[k]
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        assert scope["flight_recorder"](str(tmp_path)) == {} and "TORCH_NCCL_DUMP_ON_TIMEOUT" not in os.environ
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        os.environ["TORCH_NCCL_TRACE_BUFFER_SIZE"] = "64"   # the user's own value
        got = scope["flight_recorder"](str(tmp_path))
        assert got == st.flight_recorder_env({"TORCH_NCCL_TRACE_BUFFER_SIZE": "64"}, tmp_path)
        assert os.environ["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "64" and os.environ["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    finally:
        os.environ.clear()
        os.environ.update(saved)


# --- real hung processes ---------------------------------------------------------------------------

def test_a_plain_loop_blocked_in_a_user_function_is_named(tmp_path, hung):
    h = hung(tmp_path, "plain")
    wait_for_lines(tmp_path / "metrics.jsonl", 3)
    rc, line, state, ended = watch(tmp_path)
    assert rc == 7 and kind_of(line) == "stall", line
    assert f"Stacks: pid {h.proc.pid} is in {FETCH}" in anomaly_line(line)["fix"], line
    assert str(tmp_path / "stacks") in line
    assert_captured(tmp_path, line, state, ended, how="faulthandler")
    assert h.proc.poll() is None   # the dump did not end it


def test_no_stacks_takes_none(tmp_path, hung):
    h = hung(tmp_path, "plain")
    wait_for_lines(tmp_path / "metrics.jsonl", 3)
    rc, line, state, _ = watch(tmp_path, "--no-stacks")
    assert rc == 7 and kind_of(line) == "stall" and f"py-spy dump --pid {h.proc.pid}" in line and "Stacks:" not in line
    assert state["stacks"] is None and not [p for p in (tmp_path / "stacks").iterdir() if p.name != ".live"]


def test_a_dataloader_worker_blocked_in_getitem_is_named(tmp_path, hung):
    from conftest import need
    need("torch")
    h = hung(tmp_path, "loader")
    wait_for_lines(tmp_path / "metrics.jsonl", 3, timeout=120)
    rc, line, state, ended = watch(tmp_path)
    assert rc == 7 and kind_of(line) == "stall", line
    m = re.search(rf"pid {h.proc.pid} waits on its DataLoader \(hang_loop\.py:\d+\); its DataLoader worker pid "
                  rf"(\d+) is in __getitem__ \(hang_loop\.py:{line_of('the worker')}\)", line)
    assert m, line
    files = [Path(f).name for f in state["stacks"]["files"]]
    assert any(f.endswith(f"-rank0-worker-pid{m[1]}.txt") for f in files) and len(files) == 3, files   # main + 2 workers
    assert_captured(tmp_path, line, state, ended, n_files=3, how="faulthandler")


def test_torchrun_names_the_rank_that_never_reached_the_all_reduce(tmp_path):
    from conftest import missing, need
    need("torch")
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        missing(f"torchrun is not installed next to this Python ({torchrun})")
    run = tmp_path / "run"
    job = shell(launch_line([torchrun, "--nproc_per_node", 2, LOOP, "--out", run, "--hang-rank", 1,
                             "--hang-step", 30], run))
    try:
        wait_for(lambda: len(list((run / "ranks").glob("rank-*.jsonl"))) == 2 and wait_for_lines(run / "metrics.jsonl", 3),
                 "both ranks' heartbeats", timeout=180, tick=0.2, proc=job)
        rc, line, state, ended = watch(run, "--max-stall", "6", timeout=240)
        assert rc == 7 and kind_of(line) == "stall", line
        assert re.search(r"Stacks: rank 0 waits in all_reduce \(ddp_loop\.py:\d+\); rank 1 is in load_shard "
                         r"\(ddp_loop\.py:\d+\), never reached it; ", line), line
        files = sorted(Path(f).name for f in state["stacks"]["files"])
        assert sum("-rank0-pid" in f for f in files) == 1 and sum("-rank1-pid" in f for f in files) == 1, files
        assert_captured(run, line, state, ended, n_files=2, how="faulthandler")
    finally:
        ranks = [json.loads(p.read_text().splitlines()[-1]).get("pid") for p in (run / "ranks").glob("rank-*.jsonl")]
        for pid in ranks:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, TypeError):
                pass
        end_group(job)


def test_a_process_without_the_integration_is_named_by_py_spy(tmp_path, hung):
    need_py_spy()
    h = hung(tmp_path, "bare")
    wait_for_lines(tmp_path / "metrics.jsonl", 3)
    rc, line, state, ended = watch(tmp_path)
    assert rc == 7 and kind_of(line) == "stall", line
    assert f"Stacks: pid {h.proc.pid} is in {FETCH}" in line, line
    assert_captured(tmp_path, line, state, ended, how="py-spy")
    assert h.proc.poll() is None and not (tmp_path / "stacks" / ".live").exists()


def test_without_py_spy_the_line_says_so(tmp_path, hung):
    h = hung(tmp_path, "bare")
    wait_for_lines(tmp_path / "metrics.jsonl", 3)
    rc, line, state, ended = watch(tmp_path, env={"SUPERVISE_PY_SPY": "off"})
    assert rc == 7 and kind_of(line) == "stall", line
    assert f"No stack: pid {h.proc.pid}: py-spy is not installed" in line and "[hang]" in line, line
    assert_captured(tmp_path, line, state, ended)
    assert h.proc.poll() is None


def test_py_spy_refused_the_line_says_why_and_how_to_allow_it(hung):
    need_py_spy()
    """The watchdog runs as uid 65534, the trainer as root: ptrace is refused (another user's
    process, no CAP_SYS_PTRACE), and the line says exactly that."""
    prefix, python = as_nobody()
    run = Path(tempfile.mkdtemp(prefix="stacks-refused-", dir="/tmp"))
    state_dir = Path(tempfile.mkdtemp(prefix="stacks-state-", dir="/tmp"))
    try:
        for d in (run, state_dir):
            d.chmod(0o777)
        h = hung(run, "bare")
        wait_for_lines(run / "metrics.jsonl", 3)
        rc, line, state, ended = watch(run, user=prefix, python=python,
                                       env={"SUPERVISE_PY_SPY": PY_SPY, "SUPERVISE_STATE_DIR": str(state_dir)})
        assert rc == 7 and kind_of(line) == "stall", line
        assert (f"No stack: pid {h.proc.pid}: py-spy may not attach: pid {h.proc.pid} belongs to uid 0 and the "
                "watchdog runs as uid 65534: run the watchdog as that user (or as root)") in line, line
        assert_captured(run, line, state, ended)
        assert h.proc.poll() is None
    finally:
        shutil.rmtree(run, ignore_errors=True)
        shutil.rmtree(state_dir, ignore_errors=True)


def test_a_stall_inside_a_checkpoint_save_says_it_may_be_a_slow_save():
    saving = (F("_save", "/v/lib/python3.11/site-packages/torch/serialization.py", 900),
              F("save", "/v/lib/python3.11/site-packages/torch/serialization.py", 850),
              F("save_checkpoint", "/u/train.py", 88), F("<module>", "/u/train.py", 120))
    found = st.Capture(0.0, "/r/stacks", (st.ProcStack(1, 0, "rank", frames=saving),))
    assert found.saving and found.where() == "pid 1 is saving a checkpoint in save_checkpoint (train.py:88)"
    fix = st.hang_fix(found, "kill it")
    assert "no hang if check-in shows the steps moving again" in fix and "Telemetry.expect(seconds, 'save')" in fix


def test_a_slow_save_the_stacks_show_waits_for_max_stall(tmp_path, hung):
    """A save on its own schedule, unannounced, outlasts the learned limit (--min-stall 5 s): the
    stacks show a checkpoint save, so the watchdog waits up to --max-stall (15 s) as for an
    announced save, and only then says stall, naming the save."""
    from conftest import need
    need("torch")
    hung(tmp_path, "save", "--hang-at", 30)
    wait_for_lines(tmp_path / "metrics.jsonl", 3, timeout=120)
    rc, line, state, ended = watch(tmp_path, "--min-stall", "5", "--max-stall", "15")
    m = anomaly_line(line)
    assert rc == 7 and m["kind"] == "stall" and int(m["step"]) == 29, line
    assert "> 15s (the stacks showed a checkpoint save) at step 29" in line, line
    assert "is saving a checkpoint in save_checkpoint (hang_loop.py:" in line and "no hang if check-in" in line, line
    last = max(r["t"] for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines()) if "t" in r)
    start = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])["time"]
    assert ended - (start + last) >= 15   # never before --max-stall of silence
    assert_captured(tmp_path, line, state, ended, how="faulthandler")


def test_a_live_process_past_no_telemetry_is_named_too(tmp_path, hung):
    """Blocked before its first step record: no_telemetry, and the line says where it sits."""
    h = hung(tmp_path, "plain", "--hang-at", 1)
    wait_for(lambda: list((tmp_path / "stacks" / ".live").glob("pid-*.txt")), "the trainer's registration")
    rc, line, state, ended = watch(tmp_path, "--startup-grace", "3")
    assert rc == 7 and kind_of(line) == "no_telemetry", line
    assert f"Stacks: pid {h.proc.pid} is in {FETCH}" in line, line
    assert_captured(tmp_path, line, state, ended, how="faulthandler")
