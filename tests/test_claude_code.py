"""The real Claude Code client (npm, pinned) driven by a scripted Messages-API server: the
plugin's hooks fire for real, the skill is listed and loads."""
import json
import os
import re
import subprocess
import sys

import pytest

from claude_client import CLAUDE, bash, client, skill_block
from conftest import ROOT, as_run
from fake_anthropic import FakeAnthropic


@pytest.fixture
def home(tmp_path):
    h = tmp_path / "home"
    h.mkdir()
    return h


def test_multiline_launch_is_denied_with_the_fix_and_the_fix_runs(home, tmp_path):
    bad = "mkdir -p made\ncd made\ntouch ok"
    with FakeAnthropic([bash(bad)]) as fake:
        out = client(fake, home, tmp_path)
        reason = fake.tool_results()[0]["content"]
    assert [d["tool_input"]["command"] for d in out["permission_denials"]] == [bad]
    fix = reason.split("Run instead: ")[1]
    assert fix == "mkdir -p made && cd made && touch ok"
    with FakeAnthropic([bash(fix, background=False)]) as fake:
        out = client(fake, home, tmp_path)
        result = fake.tool_results()[0]
    assert out["permission_denials"] == [] and not result.get("is_error")
    assert (tmp_path / "made" / "ok").exists()


def test_skill_is_listed_loads_and_its_launch_line_passes(home, tmp_path):
    line = as_run(skill_block("5"), sys.executable)
    assert "\n" not in line
    (tmp_path / "train.py").write_text("import sys, os; os.makedirs('runs/exp1', exist_ok=True)\n")
    multi = line.replace(" -- ", "\n-- ")
    calls = [("Skill", {"skill": "supervising-training-runs"}), bash(line), bash(multi)]
    with FakeAnthropic(calls) as fake:
        out = client(fake, home, tmp_path)
        first = json.dumps(fake.requests[0])
        later = json.dumps(fake.requests[-1])
    assert "supervising-training-runs" in first  # listed to the model, with its description
    assert "Use before starting any unattended training run" in first
    assert "Don't block on polling" in later  # invoking it loaded the body
    assert [d["tool_input"]["command"] for d in out["permission_denials"]] == [multi]


def test_plugin_installs_from_the_local_marketplace(home, tmp_path):
    env = {**os.environ, "HOME": str(home), "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}

    def cc(*args):
        p = subprocess.run([CLAUDE, "plugin", *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, (args, p.stdout[-1500:], p.stderr[-1500:])
        return p.stdout

    cc("validate", "--strict", str(ROOT))
    cc("marketplace", "add", str(ROOT))
    cc("install", "supervising-training-runs@supervising-training-runs")
    details = cc("details", "supervising-training-runs")
    assert "supervising-training-runs" in details and re.search(r"(?i)skill", details)
    assert re.search(r"(?i)hook", details) and "PreToolUse" in details
