"""The PreToolUse hook on bad input: always exit 0 and a decision on purpose (a deny in the
client's format, or an allow), never a traceback, and inside the hook's own timeout from
hooks.json even for commands of a megabyte (they once took minutes: a quadratic guard)."""
import json
import os
import shlex
import subprocess
import sys
import time

import pytest

from conftest import ROOT
from supervise.guard.shell import MAX_COMMAND
from supervise.vocabulary import QUIET

ENV = {k: v for k, v in os.environ.items() if k not in QUIET and k not in ("PYTHONUNBUFFERED", "SUPERVISE_GUARD_OFF")}

HOOK_TIMEOUT = json.loads((ROOT / "hooks" / "hooks.json").read_text())["hooks"]["PreToolUse"][0]["hooks"][0]["timeout"]
LINES = "\n".join(f"python train.py --out runs/{i} > runs/{i}.log 2>&1" for i in range(1000))
V4 = "args = TrainingArguments(evaluation_strategy='steps')\n"
NESTED_10 = "python train.py --out runs/a &"
for _ in range(10):
    NESTED_10 = "bash -c " + shlex.quote(NESTED_10)


def bash(command, background=False):
    return json.dumps({"tool_name": "Bash", "tool_input": {"command": command, "run_in_background": background}})


# (case, stdin, "deny <rule>" or "allow", text the reason must hold)
CASES = [
    ("1000_line_background_command", bash(LINES, True), "deny one_line", "too long to show"),
    ("1mb_word_in_a_launch", bash("python train.py " + "a" * (1 << 20), True), "deny unbuffered",
     f"Decided on the first {MAX_COMMAND >> 10} KiB of this 1,024 KiB command"),
    ("1mb_one_line_launch", bash("python train.py " + " ".join(f"--a{i} {i}" for i in range(73000)), True),
     "deny unbuffered", "Decided on the first"),
    ("350kb_of_tmux_new", bash("tmux new " * (350 * 1024 // 9)), "allow", ""),
    ("350kb_of_tmux_new_then_a_detached_launch", bash("tmux new " * 1000 + "-d python train.py"), "deny notified",
     "run_in_background"),
    ("200kb_of_blanks_then_ampersand", bash("python train.py" + " " * (200 << 10) + "&"), "deny notified",
     "run_in_background"),
    ("1mb_of_blanks_then_ampersand", bash("python train.py" + " " * (1 << 20) + "&"), "allow", ""),  # past the cap
    ("1mb_of_continuations", bash("python train.py \\\n" * 60000, True), "deny one_line", "Decided on the first"),
    ("1mb_unclosed_quote", bash("python train.py '" + "x" * (1 << 20), True), "allow", ""),
    ("1mb_of_backslashes", bash("\\" * (1 << 20), True), "allow", ""),
    ("1mb_of_operators", bash("&&" * (1 << 19), True), "allow", ""),
    ("1mb_write_with_v4_arguments", json.dumps({"tool_name": "Write", "cwd": "{project}", "tool_input": {
        "file_path": "t.py", "content": "x = 1\n" * 170000 + V4}}), "deny v5_arguments", "write eval_strategy="),
    # shells' -c strings and subshells (issue 25): read to a bounded depth, without recursion on groups
    ("unclosed_quote_inside_a_c_string", bash("bash -c \"python train.py --out runs/a 'oops &\""), "allow", ""),
    ("1000_shells_opening_a_quote_each", bash('bash -c "' * 1000 + "python train.py &" + '"' * 1000), "deny notified",
     "run_in_background"),  # the quotes pair up: the & is outside them
    ("1000_bash_c_words", bash("bash -c " * 1000 + "'python train.py &'"), "allow", ""),  # each -c string: "bash"
    ("c_strings_quoted_10_deep", bash(NESTED_10), "deny notified", "Launch it as"),  # past the bound: by its text
    ("100000_subshells_inside_a_c_string", bash("bash -c '" + "(" * 100000 + "python train.py &" + ")" * 100000 + "'"),
     "deny notified", "run_in_background"),
    ("200000_unclosed_subshells", bash("(" * 200000 + "python train.py &"), "deny notified", "run_in_background"),
    ("100000_brace_groups", bash("{ " * 100000 + "python train.py & " + "} " * 100000, True), "deny notified",
     "Decided on the first"),
    # the forms of issue 37: a service runner's, eval's and a runner's words are read in linear time too
    ("20000_systemd_run_words", bash("systemd-run " * 20000 + "python train.py"), "deny notified",
     "scripts/launch.py RUN_DIR -- python train.py"),
    ("50000_evals", bash("eval " * 50000 + "'python train.py &'"), "deny notified",  # eval joins its words
     "Launch it as"),
    ("50000_sudo_options", bash("sudo " + "-u x " * 50000 + "cat .env"), "deny no_credential_hunting",
     "set -a && . ./.env && set +a"),
    ("40000_tail_counts", bash("tail " + "-n +1 " * 40000 + "train.log"), "deny no_log_dumps", "checkin.py"),
    ("not_json", "not json", "allow", ""),
    ("a_list", "[1, 2]", "allow", ""),
    ("deeply_nested_json", "[" * 100000 + "]" * 100000, "allow", ""),
    ("command_not_a_string", '{"tool_name": "Bash", "tool_input": {"command": 5}}', "allow", ""),
    ("tool_input_not_an_object", '{"tool_name": "Bash", "tool_input": "ls"}', "allow", ""),
    ("nul_bytes", bash("python train.py \x00\x00", True), "deny unbuffered", "python -u train.py"),
    ("empty_stdin", "", "allow", ""),
]


@pytest.fixture
def project(tmp_path):
    """A project whose .venv has transformers 5 (its dist-info, as pip leaves it): the Python the v5 rule reads."""
    site = tmp_path / ".venv" / "lib" / "python3.11" / "site-packages"
    (site / "transformers-5.0.0.dist-info").mkdir(parents=True)
    (tmp_path / ".venv" / "pyvenv.cfg").write_text("home = /nonexistent/bin\ninclude-system-site-packages = false\n")
    return tmp_path


@pytest.mark.parametrize("case,stdin,decision,needle", CASES, ids=[c[0] for c in CASES])
def test_the_hook_decides_on_purpose_and_in_time(case, stdin, decision, needle, project):
    stdin = stdin.replace('"cwd": "{project}"', f'"cwd": {json.dumps(str(project))}', 1)
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, str(ROOT / "hooks" / "pretooluse.py")], input=stdin, capture_output=True,
                       text=True, timeout=120, env=ENV)
    took = time.monotonic() - t0
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert took < HOOK_TIMEOUT, f"{took:.1f}s: past the hook's {HOOK_TIMEOUT}s timeout, the call would go through"
    if decision == "allow":
        assert p.stdout == "", p.stdout[:500]
        return
    out = json.loads(p.stdout)["hookSpecificOutput"]
    reason = out["permissionDecisionReason"]
    assert out["permissionDecision"] == "deny" and reason.startswith(f"[{decision.split()[1]}] "), reason[:500]
    assert needle in reason, reason[-500:]
    assert len(reason) <= 10000  # the client's cap on a hook's output string


def test_every_denied_case_names_the_words_of_its_fix():
    empty = [case for case, _, decision, needle in CASES if decision != "allow" and not needle.strip()]
    assert not empty, f"deny cases without the words of their fix: {empty}"
