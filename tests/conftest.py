"""What the tests share, in one place: the bundle's paths; the registry kept out of the user's
state; the anomaly line's grammar (``LINE``, ``kind_of``); one wait on a condition (``wait_for``,
never a fixed sleep: a busy machine changes how long a test takes, never its outcome), with its
variants for a file's lines and the watchdog's polls; the launches (a fake trainer as a child
process, the README's shell launch line, the launcher and the stopper) and their clean-up; a run's
records; and ``need`` for the optional packages (a skip on a machine without them, a failure
under ``CI=true``, where .ci/run installs every extra)."""
from __future__ import annotations

import importlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FAKE = ROOT / "tests" / "fake_trainer.py"
SCRIPTS = ROOT / "scripts"
LAUNCHER = SCRIPTS / "launch.py"
STOPPER = SCRIPTS / "stop.py"
WATCHDOG = SCRIPTS / "watchdog.py"
BOUND = 60.0  # seconds: the default wait bound; it catches a hang, never a slow machine


# --- optional packages and skips ------------------------------------------------------------

CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def missing(why: str):
    """``why`` keeps this test (or module) from running here: a skip that says so; under CI=true,
    where nothing may be missing, a failure."""
    if CI:
        pytest.fail(f"{why} (CI=true: .ci/run provides it, so this is a failure, not a skip)", pytrace=False)
    pytest.skip(why, allow_module_level=True)


def need(module: str):
    """``import module``, for a test that needs an optional package (torch, transformers, trl,
    lightning, pandas, ...): the module; without it a skip here, a failure under CI=true."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        missing(f"{module} is not installed ({e}); pip install -e '.[hf,trl,lightning,plot,audit,dev,hang,ray]'")


@pytest.fixture(autouse=True)
def state_dir(tmp_path, monkeypatch):
    """Never touch the user's real registry."""
    d = tmp_path / "state"
    monkeypatch.setenv("SUPERVISE_STATE_DIR", str(d))
    return d


# --- the anomaly line -----------------------------------------------------------------------

# DESIGN.md: ``ANOMALY <kind>: <what> = <value> <op> <threshold> at step N. <fix>.``
LINE = re.compile(r"^ANOMALY (?P<kind>[a-z_]+): (?P<what>.+) at step (?P<step>\d+)\. (?P<fix>.+)\.$")


def anomaly_line(text: str) -> re.Match:
    """``text`` (a watchdog's stdout, a verdict) as one anomaly line in the grammar: its match
    (kind, what, step, fix); an AssertionError showing the text when it is not one."""
    line = text.strip() if isinstance(text, str) else ""
    m = LINE.match(line) if "\n" not in line else None
    assert m, f"not one line 'ANOMALY <kind>: <what> at step N. <fix>.': {text!r}"
    return m


def kind_of(text: str) -> str:
    """The kind of the one anomaly line ``text``."""
    return anomaly_line(text)["kind"]


def step_of(text: str) -> int:
    """The step of the one anomaly line ``text``."""
    return int(anomaly_line(text)["step"])


# --- waiting on conditions ------------------------------------------------------------------

def wait_for(cond, what: str, timeout: float = BOUND, tick: float = 0.05, proc=None, why=None):
    """Call ``cond()`` every ``tick`` seconds until it returns something truthy, and return that.
    An AssertionError naming ``what`` when ``timeout`` seconds pass first, or as soon as ``proc``
    (a Popen) has exited with ``cond()`` still false; ``why()`` adds context (a log's tail)."""
    end = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            got = cond()
            if got:
                return got
            said = f"the process exited first (rc {proc.returncode})"
        elif time.monotonic() >= end:
            said = f"not within {timeout:g}s"
        else:
            time.sleep(tick)
            continue
        raise AssertionError(f"{what}: {said}" + (f"\n{why()}" if why else ""))


def lines(path) -> int:
    """How many complete lines ``path`` holds (0 while it does not exist)."""
    try:
        return Path(path).read_bytes().count(b"\n")
    except OSError:
        return 0


def wait_for_lines(path, n: int = 1, timeout: float = BOUND, proc=None) -> int:
    """``path`` holds at least ``n`` complete lines: their count."""
    return wait_for(lambda: (k := lines(path)) >= n and k, f"{path} to reach {n} lines", timeout, proc=proc)


def keeps_writing(path, more: int = 5, timeout: float = BOUND) -> None:
    """``path`` gains ``more`` lines from now on: the writer lives and works."""
    start = lines(path)
    wait_for(lambda: lines(path) >= start + more, f"{path} to grow by {more} lines from {start}", timeout)


def watchdog_state(run_dir):
    """RUN_DIR/watchdog.json as a dict (written atomically every poll), None while there is none."""
    try:
        return json.loads((Path(run_dir) / "watchdog.json").read_text())
    except (OSError, ValueError):
        return None


def polls(run_dir) -> int:
    """How many polls the run's watchdog has made (watchdog.json's ``polls``; 0 before the first)."""
    return (watchdog_state(run_dir) or {}).get("polls", 0)


def wait_for_polls(run_dir, n: int, watchdog=None, timeout: float = BOUND) -> dict:
    """The run's watchdog has made ``n`` polls (it saw what was there before the last of them):
    its state. Fails at once when ``watchdog`` (its Popen) ended first."""
    return wait_for(lambda: (s := watchdog_state(run_dir)) and s.get("polls", 0) >= n and s,
                    f"the watchdog's poll {n} in {run_dir}/watchdog.json", timeout, proc=watchdog,
                    why=lambda: _said(watchdog))


def _said(proc) -> str:
    if proc is None or proc.poll() is None or proc.stdout is None:
        return ""
    out, err = proc.communicate()
    return f"its output: {out}{err}"


# --- a run's records ------------------------------------------------------------------------

def records(run: Path) -> list[dict]:
    """RUN_DIR/metrics.jsonl's records (a torn last line, still being written, left out)."""
    path = Path(run) / "metrics.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def attempts(run: Path) -> list[list[dict]]:
    """[[start, rec, ...], ...]: one list per start record (a run is the records after its last)."""
    out = []
    for r in records(run):
        if r.get("event") == "start":
            out.append([r])
        elif out:
            out[-1].append(r)
    return out


def read_json(path):
    return json.loads(Path(path).read_text())


# --- processes ------------------------------------------------------------------------------

def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def procs_with(marker: str) -> list[int]:
    """The live processes whose command line holds ``marker``."""
    out = []
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in open(f"/proc/{d}/cmdline", "rb").read() and pid_alive(int(d)):
                out.append(int(d))
        except OSError:
            pass
    return out


# --- launching ------------------------------------------------------------------------------

class Trainer:
    """A fake trainer process writing the contract (``script``: tests/fake_trainer.py unless
    another stand-in is named), stdout/stderr to RUN_DIR/train.log."""

    def __init__(self, run_dir: Path, *args, script: Path = FAKE):
        run_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = run_dir / "train.log"
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-u", str(script), str(run_dir), *map(str, args)],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self.pid = self.proc.pid

    def wait_for_line(self, path: Path, n: int = 1, timeout: float = BOUND):
        return wait_for_lines(path, n, timeout)

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.log.close()


@pytest.fixture
def trainer():
    made = []

    def start(run_dir, *args, **kw):
        t = Trainer(run_dir, *args, **kw)
        made.append(t)
        return t

    yield start
    for t in made:
        t.close()


def launch_line(argv, run, *, cd=None, env=None, log=None) -> str:
    """The README's launch: one physical line, ``[cd CD && ]mkdir -p RUN && [ENV] ARGV >> LOG 2>&1``
    with LOG RUN/train.log unless given; ``env``: a dict of variables set for the command."""
    q = shlex.quote
    words = " ".join(f"{k}={q(str(v))}" for k, v in (env or {}).items())
    cmd = (words + " " if words else "") + shlex.join(map(str, argv))
    return (f"{f'cd {q(str(cd))} && ' if cd else ''}mkdir -p {q(str(run))} && {cmd} "
            f">> {q(str(log or Path(run) / 'train.log'))} 2>&1")


def fake_line(run, *args, out=None, script=FAKE) -> str:
    """The launch line of the fake trainer (or ``script``, which takes RUN_DIR first) writing into ``run``."""
    return launch_line([sys.executable, "-u", script, run, *args], run, log=out)


def shell(line: str, **kw) -> subprocess.Popen:
    """``line`` run by bash in a session (and process group) of its own, as a terminal would."""
    return subprocess.Popen(["bash", "-c", line], start_new_session=True, **kw)


def end_group(p: subprocess.Popen) -> None:
    """SIGKILL ``p``'s process group (a shell and what it started) and reap ``p``."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()


@pytest.fixture
def shells():
    """shells(line, **popen): ``shell(line)``, its process group ended after the test."""
    made = []

    def start(line, **kw):
        p = shell(line, **kw)
        made.append(p)
        return p

    yield start
    for p in made:
        end_group(p)


def run_script(name, *args, timeout=60, cwd=None, env=None):
    """Run scripts/<name> as a subprocess; (returncode, stdout, stderr)."""
    p = subprocess.run([sys.executable, str(SCRIPTS / name), *map(str, args)], capture_output=True,
                       text=True, timeout=timeout, cwd=cwd, env=env)
    return p.returncode, p.stdout, p.stderr


def start_script(name, *args, **kw):
    return subprocess.Popen([sys.executable, str(SCRIPTS / name), *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def trainer_argv(run_dir, *extra, records: int = 3000, dt: float = 0.1) -> list[str]:
    """A trainer that writes one step record every ``dt`` s for ``records`` records (5 min)."""
    return [sys.executable, "-u", str(FAKE), str(run_dir), "--records", str(records), "--dt", str(dt),
            "--no-sentinel", *map(str, extra)]


def launch(work, run, *cmd, extra=(), env=None, timeout=60) -> subprocess.CompletedProcess:
    """``scripts/launch.py RUN [EXTRA] -- CMD`` from the folder ``work``."""
    return subprocess.run([sys.executable, str(LAUNCHER), str(run), *map(str, extra), "--", *map(str, cmd)],
                          cwd=work, capture_output=True, text=True, timeout=timeout, env=env)


def stop(work, run, *extra) -> subprocess.CompletedProcess:
    """``scripts/stop.py RUN [EXTRA]`` from the folder ``work``."""
    return subprocess.run([sys.executable, str(STOPPER), str(run), *map(str, extra)], cwd=work,
                          capture_output=True, text=True, timeout=120)


def end_launched(root: Path) -> None:
    """SIGKILL the process group of every live launch recorded under ``root`` (the launcher
    detaches what it starts: nothing else would end it)."""
    from supervise.observe.state import launch_alive, read_launch
    from supervise.vocabulary import LAUNCH
    for rec_path in Path(root).rglob(LAUNCH):
        rec = read_launch(rec_path.parent)
        if rec and launch_alive(rec):
            try:
                os.killpg(rec["pgid"] or rec["pid"], signal.SIGKILL)
            except OSError:
                pass


def as_run(line: str, python: str) -> str:
    """A SKILL.md (or references/) line as the agent runs it here: ${CLAUDE_SKILL_DIR} is the bundle, and the
    interpreter is ``python`` (CI has no bare ``python`` on PATH)."""
    line = line.replace("${CLAUDE_SKILL_DIR}", str(ROOT))
    return re.sub(r"(^|(?<=\s))python3?(?=\s)", python, line)


def run_relaunch(line: str, run, *, env=None, timeout: float = 400) -> dict:
    """A relaunch line as the agent runs it: verbatim, through a shell, which returns at once (the
    launcher detaches the trainer); then the launched trainer followed to its end. Its record."""
    from supervise.observe.state import launch_alive, read_launch
    before = read_launch(run)
    p = subprocess.run(["bash", "-c", line], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.startswith("launched pid "), p.stdout + p.stderr
    rec = read_launch(run)
    assert rec is not None and (before is None or rec["pid"] != before["pid"]), rec
    wait_for(lambda: not launch_alive(rec), f"the relaunched trainer (pid {rec['pid']}) to end", timeout=timeout,
             tick=0.2)
    return rec


# --- check-in beside the watchdog -----------------------------------------------------------

def assert_checkin_agrees(run_dir, line: str, env=None) -> dict:
    """Check-in, run after the watchdog ended with ``line``, says the same: the same headline
    (ANOMALY <kind>, DONE, STOPPED) and, for an anomaly, the same line. Its facts."""
    rc, out, err = run_script("checkin.py", run_dir, "--json", env=env)
    assert rc == 0, err
    facts = json.loads(out)
    if line.startswith("ANOMALY "):
        want = f"ANOMALY {kind_of(line)}"
    else:
        assert line.startswith(("OK done: ", "STOPPED: ")), line
        want = "DONE" if line.startswith("OK done") else "STOPPED"
    assert facts["verdict"] == want, (line, out)
    if want.startswith("ANOMALY"):
        assert facts["watchdog_message"] == line[:300], (line, out)  # --json cuts a string at 300
    return facts


def verdict_of(kind, message: str = ""):
    """The Verdict a judge gives for an anomaly of ``kind`` (None: a run found dead by hand),
    with the move and relaunch change of the rule table: what the relaunch line is built from."""
    from supervise.judge.table import move_for
    from supervise.observe.observation import Verdict
    from supervise.vocabulary import Anomaly
    found = Anomaly(kind, 0, message) if kind else None
    move, change = move_for(kind, message)
    return Verdict("anomaly", message, found, f"ANOMALY {kind}" if kind else "DEAD", change=change, move=move)
