"""Driving the real Claude Code client (npm, pinned) without a model: where it is, its
environment against a scripted Messages-API server (tests/fake_anthropic.py), a ``claude -p``
run, an interactive session in a private tmux server, and SKILL.md's own lines. Importing this
skips the importing test module when the client is not installed (under CI=true, where .ci/run
installs it, that is a failure)."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import ROOT, missing

VERSION = "2.1.197"
DEFAULT = Path.home() / ".cache" / "supervising-training-runs" / f"claude-code-{VERSION}" / "node_modules" / ".bin" / "claude"
CLAUDE = os.environ.get("CLAUDE_BIN") or (str(DEFAULT) if DEFAULT.exists() else shutil.which("claude"))
if not CLAUDE or not os.path.exists(CLAUDE):
    missing("the Claude Code client is not installed (bash .ci/run installs it and sets CLAUDE_BIN)")

API_KEY = "sk-test-supervising-training-runs"
QUIET_VARS = ("PYTHONUNBUFFERED", "HF_HUB_DISABLE_PROGRESS_BARS", "TRANSFORMERS_VERBOSITY", "TOKENIZERS_PARALLELISM")


def client_env(fake, home) -> dict:
    """The client's environment: a fresh HOME, the fake server, the client's folder on PATH (so
    that a recipe's ``claude`` is this one), none of the quiet variables (the hooks must see the
    command, not a friendly environment)."""
    env = {**os.environ, "HOME": str(home), "ANTHROPIC_BASE_URL": fake.url, "ANTHROPIC_API_KEY": API_KEY,
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
           "PATH": f"{os.path.dirname(CLAUDE)}{os.pathsep}{os.environ.get('PATH', '')}"}
    for k in QUIET_VARS:
        env.pop(k, None)
    return env


def client(fake, home, cwd, prompt="go", extra=(), timeout=180) -> dict:
    """One ``claude -p`` run to its end: its JSON result."""
    p = subprocess.run([CLAUDE, "-p", prompt, "--output-format", "json", "--allowedTools", "Bash", "Skill",
                        "--plugin-dir", str(ROOT), *extra], env=client_env(fake, home), cwd=cwd, capture_output=True,
                       text=True, timeout=timeout)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout)


def bash(command, background=True):
    return ("Bash", {"command": command, "description": "step", "run_in_background": background})


def skill_block(step: str) -> str:
    """The first ```bash line of SKILL.md's step ``step`` ("5", "6"), as the agent reads it."""
    text = (ROOT / "SKILL.md").read_text()
    at = text.index(f"## {step}.")
    body = text[at:text.index("\n## ", at + 1)]
    return re.search(r"```bash\n(.+?)\n```", body, re.S).group(1)


class Interactive:
    """The interactive client in a private tmux server (its own socket), the API-key question
    and the trust dialog pre-answered in a fresh HOME (CLAUDE_CODE.md)."""

    def __init__(self, fake, home: Path, cwd: Path, name: str):
        self.tmux = shutil.which("tmux")
        if not self.tmux:
            missing("tmux is not installed: the interactive client is driven through tmux (apt-get install tmux)")
        self.sock, self.name = f"sup-{name}-{os.getpid()}", name
        (home / ".claude.json").write_text(json.dumps({
            "hasCompletedOnboarding": True, "theme": "dark",
            "customApiKeyResponses": {"approved": [API_KEY[-20:]], "rejected": []},
            "projects": {str(cwd): {"hasTrustDialogAccepted": True, "allowedTools": ["Bash"]}}}))
        env = client_env(fake, home)
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items() if k in (
            "HOME", "ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "PATH",
            "SUPERVISE_STATE_DIR"))
        cmd = (f"cd {shlex.quote(str(cwd))} && env -u PYTHONUNBUFFERED -u HF_HUB_DISABLE_PROGRESS_BARS "
               f"-u TRANSFORMERS_VERBOSITY -u TOKENIZERS_PARALLELISM {exports} {shlex.quote(CLAUDE)} "
               f"--allowedTools Bash --plugin-dir {shlex.quote(str(ROOT))}")
        self.run("new-session", "-d", "-s", name, "-x", "200", "-y", "50", cmd)

    def run(self, *args, check=True) -> subprocess.CompletedProcess:
        return subprocess.run([self.tmux, "-L", self.sock, *args], capture_output=True, text=True, timeout=30,
                              check=check)

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", self.name, check=False).stdout

    def type(self, text: str) -> None:
        self.run("send-keys", "-t", self.name, "-l", text)
        time.sleep(0.3)  # the client reads a paste and a keystroke apart
        self.run("send-keys", "-t", self.name, "Enter")

    def alive(self) -> bool:
        return self.run("has-session", "-t", self.name, check=False).returncode == 0

    def close(self) -> None:
        self.run("kill-server", check=False)
