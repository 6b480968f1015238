import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FAKE = ROOT / "tests" / "fake_trainer.py"
SCRIPTS = ROOT / "scripts"


@pytest.fixture(autouse=True)
def state_dir(tmp_path, monkeypatch):
    """Never touch the user's real registry."""
    d = tmp_path / "state"
    monkeypatch.setenv("SUPERVISE_STATE_DIR", str(d))
    return d


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

    def wait_for_line(self, path: Path, n: int = 1, timeout: float = 20):
        end = time.time() + timeout
        while time.time() < end:
            if path.exists() and path.read_bytes().count(b"\n") >= n:
                return
            time.sleep(0.02)
        raise AssertionError(f"{path} never reached {n} lines")

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


def run_script(name, *args, timeout=60, cwd=None, env=None):
    """Run scripts/<name> as a subprocess; (returncode, stdout, stderr)."""
    p = subprocess.run([sys.executable, str(SCRIPTS / name), *map(str, args)], capture_output=True,
                       text=True, timeout=timeout, cwd=cwd, env=env)
    return p.returncode, p.stdout, p.stderr


def start_script(name, *args, **kw):
    return subprocess.Popen([sys.executable, str(SCRIPTS / name), *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def read_json(path):
    return json.loads(Path(path).read_text())


def assert_checkin_agrees(run_dir, line: str) -> dict:
    """Check-in, run after the watchdog ended with ``line``, says the same: the same headline
    (ANOMALY <kind>, DONE, STOPPED) and, for an anomaly, the same line. Its facts."""
    rc, out, err = run_script("checkin.py", run_dir, "--json")
    assert rc == 0, err
    facts = json.loads(out)
    m = re.match(r"ANOMALY ([a-z_]+): ", line)
    want = f"ANOMALY {m[1]}" if m else "DONE" if line.startswith("OK done") else "STOPPED"
    assert facts["verdict"] == want, (line, out)
    if m:
        assert facts["watchdog_message"] == line[:300], (line, out)  # --json cuts a string at 300
    return facts


def verdict_of(kind, message: str = ""):
    """The Verdict a judge gives for an anomaly of ``kind`` (None: a run found dead by hand),
    with the relaunch change of the rule table: what the relaunch line is built from."""
    from supervise.judge import change_for
    from supervise.observation import Verdict
    from supervise.vocabulary import Anomaly
    found = Anomaly(kind, 0, message) if kind else None
    return Verdict("anomaly", message, found, f"ANOMALY {kind}" if kind else "DEAD", change=change_for(kind, message))
