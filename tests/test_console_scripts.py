"""The console commands a `pip install` puts on PATH, installed for real (no dependencies fetched)
into a temporary prefix from a copy of the project, run from outside the checkout."""
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig

import pytest

from conftest import ROOT

# command -> the script in scripts/ with the same main
COMMANDS = {"supervise-watchdog": "watchdog", "supervise-checkin": "checkin", "supervise-smoke": "smoke",
            "supervise-bench": "bench", "supervise-audit": "audit", "supervise-plot": "plot",
            "supervise-launch": "launch", "supervise-stop": "stop"}


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(bin folder, environment) of a real pip install of this project into a fresh prefix."""
    base = tmp_path_factory.mktemp("pip")
    src = base / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "supervise", src / "supervise", ignore=shutil.ignore_patterns("__pycache__"))
    prefix = base / "prefix"
    p = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                        "--no-index", "--prefix", str(prefix), str(src)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    site = sysconfig.get_path("purelib", vars={"base": str(prefix), "platbase": str(prefix)})
    env = {**os.environ, "PYTHONPATH": site, "PATH": f"{prefix / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    return prefix / "bin", env, site


def run(installed, *cmd, cwd):
    """``cmd`` with the installed package first on the paths, and the test's SUPERVISE_STATE_DIR (the
    module's environment was read before the first test set it: the real registry otherwise)."""
    return subprocess.run(list(map(str, cmd)), capture_output=True, text=True, timeout=120, cwd=cwd,
                          env={**installed[1], "SUPERVISE_STATE_DIR": os.environ["SUPERVISE_STATE_DIR"]})


def test_the_installed_package_is_the_one_that_runs(installed, tmp_path):
    p = run(installed, sys.executable, "-c", "import supervise; print(supervise.__file__)", cwd=tmp_path)
    assert p.stdout.startswith(installed[2]), p.stdout


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_is_on_path_and_answers_help(installed, tmp_path, command):
    assert (installed[0] / command).exists()
    p = run(installed, command, "--help", cwd=tmp_path)
    # the parsers name their script (prog="watchdog.py"); either name shows the right main answered
    usage = re.match(rf"usage: (supervise-)?{COMMANDS[command]}(\.py)? ", p.stdout)
    assert p.returncode == 0 and usage, p.stdout + p.stderr


@pytest.mark.parametrize("command", ["supervise-watchdog", "supervise-checkin", "supervise-plot"])
def test_a_file_for_a_run_dir_is_one_line_and_exit_2(installed, tmp_path, command):
    (tmp_path / "notes.txt").write_text("not a run directory")
    p = run(installed, command, "notes.txt", cwd=tmp_path)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "notes.txt" in p.stderr, p.stderr


def test_watchdog_and_checkin_on_a_finished_run(installed, tmp_path):
    run_dir = tmp_path / "run"
    writer = ("import sys; sys.path.insert(0, sys.argv[2]); from supervise.telemetry import Telemetry\n"
              "with Telemetry(sys.argv[1], task='lm', vocab_size=64, total_steps=30, batch_size=4) as tm:\n"
              "    for step in (10, 20, 30):\n"
              "        tm.step(step, 4.0 - step / 10, lr=1e-3, grad_norm=1.0)\n"
              "    tm.eval(30, loss=1.2)\n"
              "    tm.done(eval_loss=1.2)\n")
    subprocess.run([sys.executable, "-c", writer, str(run_dir), str(ROOT)], check=True, timeout=60)  # a trainer that exited
    p = run(installed, "supervise-watchdog", run_dir, "--poll", "0.2", cwd=tmp_path)
    assert p.returncode == 0 and p.stdout.startswith("OK done"), p.stdout + p.stderr
    p = run(installed, "supervise-checkin", run_dir, cwd=tmp_path)
    assert p.returncode == 0 and "step 30" in p.stdout, p.stdout + p.stderr
    assert json.loads((run_dir / "final_val_metrics.json").read_text())["eval_loss"] == 1.2
