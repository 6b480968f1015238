"""The run outlives the agent's session, with the real Claude Code client and a scripted model
following SKILL.md's own lines: the trainer started by step 5's launcher keeps writing records
after ``claude -p`` ends (the launcher run in the foreground or as a background task) and after
``/exit`` of an interactive session, where a raw background launch dies with the session; and the
``--on-exit`` resume recipe of references/session.md brings the ended conversation back headlessly
with the watchdog's verdict."""
import json
import os
import signal
import sys

import pytest

from claude_client import Interactive, bash, client, skill_block
from conftest import FAKE, ROOT
from fake_anthropic import FakeAnthropic
from launching import as_run, end_launched, keeps_writing, lines, pid_alive, procs_with, wait_for
from supervise.launch import launch_alive, read_launch

# the client ends its background tasks within seconds of its end (CLAUDE_CODE.md: gone 6 s
# after the final answer); a trainer that still writes this many records (0.1 s apart) after
# the client's exit has outlived it by well over that
PAST_THE_KILL = 100


@pytest.fixture
def work(tmp_path):
    home, cwd = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    cwd.mkdir()
    yield home, cwd
    end_launched(cwd)
    for pid in procs_with(str(cwd / "train.py")):  # the control case's raw launch, if it lives
        os.kill(pid, signal.SIGKILL)


def write_train(cwd, *fault) -> None:
    """The user's train.py: the fake trainer writing the contract into --out for 5 minutes."""
    (cwd / "train.py").write_text(
        "import runpy, sys\n"
        "out = sys.argv[sys.argv.index('--out') + 1]\n"
        f"sys.argv = [{str(FAKE)!r}, out, '--records', '3000', '--dt', '0.1', '--no-sentinel', *{list(fault)!r}]\n"
        f"runpy.run_path({str(FAKE)!r}, run_name='__main__')\n")


def launch_line() -> str:
    return as_run(skill_block("5"), sys.executable)


@pytest.mark.parametrize("background", [False, True], ids=["foreground", "run_in_background"])
def test_the_trainer_outlives_claude_p(work, background):
    home, cwd = work
    write_train(cwd)
    line = launch_line()
    with FakeAnthropic([bash(line, background=background)]) as fake:
        out = client(fake, home, cwd)
        result = fake.tool_results()[0]
    assert out["permission_denials"] == [] and not result.get("is_error"), result
    run = cwd / "runs" / "exp1"
    rec = wait_for(lambda: read_launch(run), "launch.json")
    if not background:
        assert f"launched pid {rec['pid']}" in json.dumps(result["content"])  # the launcher's one line
    assert rec["session_id"] == out["session_id"]  # recorded for the --on-exit resume recipe
    keeps_writing(run / "metrics.jsonl", PAST_THE_KILL)
    assert launch_alive(rec)


def test_a_raw_background_launch_dies_with_claude_p(work):
    """The control: what the launcher is for. The same trainer as a plain background task of the
    session (the old step 4) is gone once the client has ended."""
    home, cwd = work
    write_train(cwd)
    (cwd / "runs" / "exp1").mkdir(parents=True)
    raw = (f"PYTHONUNBUFFERED=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error TOKENIZERS_PARALLELISM=false "
           f"{sys.executable} -u {cwd / 'train.py'} --out runs/exp1 >> runs/exp1/train.log 2>&1")
    with FakeAnthropic([bash(raw, background=True)]) as fake:
        out = client(fake, home, cwd)
    assert out["permission_denials"] == []
    wait_for(lambda: not procs_with(str(cwd / "train.py")), "the raw launch to die with the session", timeout=60)
    assert lines(cwd / "runs" / "exp1" / "metrics.jsonl") >= 1  # it had started: it was ended, not broken


def test_the_trainer_outlives_exit_of_an_interactive_session(work):
    home, cwd = work
    write_train(cwd)
    run = cwd / "runs" / "exp1"
    with FakeAnthropic([bash(launch_line(), background=False)]) as fake:
        tui = Interactive(fake, home, cwd, "exit")
        try:
            wait_for(lambda: "for shortcuts" in tui.screen() or "Try " in tui.screen(), "the client's prompt",
                     timeout=90)
            tui.type("Launch the run, following the skill.")
            rec = wait_for(lambda: read_launch(run), "the launch record", timeout=90)
            wait_for(lambda: fake.tool_results(), "the launcher's result back at the model", timeout=90)
            wait_for(lambda: "done" in tui.screen(), "the model's last answer", timeout=90)
            tui.type("/exit")
            wait_for(lambda: not tui.alive(), "the interactive client to end", timeout=90)
        finally:
            tui.close()
    assert rec["session_id"]  # the interactive client sets CLAUDE_CODE_SESSION_ID too
    keeps_writing(run / "metrics.jsonl", PAST_THE_KILL)
    assert launch_alive(rec) and pid_alive(rec["pid"])


def test_on_exit_resumes_the_ended_conversation_headlessly_with_the_verdict(work):
    """references/session.md's headless recipe: the trainer and a detached watchdog with
    --on-exit 'claude --resume ... -p ...' launched by a `claude -p` that then ends; the NaN at
    step 60 ends the watchdog, whose on-exit command brings that conversation back."""
    home, cwd = work
    write_train(cwd, "--nan-at", "60")
    recipe = (ROOT / "references" / "session.md").read_text()
    headless = as_run(next(ln for ln in recipe.splitlines() if "/scripts/launch.py runs/exp1/watchdog" in ln),
                      sys.executable).replace("--poll 30", "--poll 0.5")  # seconds, not minutes, of test
    with FakeAnthropic([bash(launch_line(), background=False), bash(headless, background=False)]) as fake:
        first = client(fake, home, cwd, prompt="Train it unattended.")
        assert first["permission_denials"] == [] and not any(r.get("is_error") for r in fake.tool_results())
        n = len(fake.requests)
        back = wait_for(lambda: next((r for r in fake.requests[n:] if "The watchdog said: ANOMALY nan" in
                                      json.dumps(r)), None), "the resumed session's request", timeout=120)
    text = json.dumps(back)
    assert "Train it unattended." in text  # the earlier turns: the same conversation, resumed
    assert "loss = nan is not finite at step 60" in text and "Follow the skill." in text
    run = cwd / "runs" / "exp1"
    assert json.loads((run / "watchdog.json").read_text())["kind"] == "nan"
    assert read_launch(run)["session_id"] == first["session_id"]


def test_a_new_session_checkin_says_running_and_offers_the_watchdog_line(work):
    home, cwd = work
    write_train(cwd)
    with FakeAnthropic([bash(launch_line(), background=False)]) as fake:
        client(fake, home, cwd)
    run = cwd / "runs" / "exp1"
    keeps_writing(run / "metrics.jsonl", 20)
    checkin = as_run("python3 ${CLAUDE_SKILL_DIR}/scripts/checkin.py", sys.executable)
    with FakeAnthropic([bash(checkin, background=False)]) as fake:
        client(fake, home, cwd)
        said = json.dumps(fake.tool_results()[0]["content"])
    assert said.startswith('"RUNNING') and "next:" in said and "scripts/watchdog.py" in said
