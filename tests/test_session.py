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
from conftest import FAKE, ROOT, WATCHDOG, as_run, attempts, end_launched, keeps_writing, kind_of, lines, pid_alive, \
    procs_with, step_of, wait_for
from fake_anthropic import FakeAnthropic, text_of
from supervise.observe.state import launch_alive, read_launch

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
    for pid in procs_with(str(cwd / "train.py")) + started_in(cwd):  # raw launches, detached watchdogs, clients
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def started_in(folder) -> list:
    """Live processes whose working folder is ``folder`` or below (what a test's clients started)."""
    out = []
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{d}/cwd").startswith(str(folder)) and int(d) != os.getpid():
                out.append(int(d))
        except OSError:
            pass
    return out


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


LOOP = ROOT / "tests" / "resumable_loop.py"
WAKE = "The watchdog said:"


def verdict_of(wake: str) -> str:
    """The watchdog's line inside a wake prompt (session.md: "The watchdog said: LINE. Follow the skill.")."""
    assert wake.startswith(WAKE + " ") and wake.endswith(". Follow the skill."), wake
    return wake[len(WAKE) + 1:-len(". Follow the skill.")]


def write_loop(cwd) -> None:
    """The user's train.py: a plain loop with Telemetry and a declared --resume {checkpoint} recipe
    (tests/resumable_loop.py), run as the user's own file from the project folder."""
    (cwd / "train.py").write_text(f"__file__ = {str(LOOP)!r}\n"
                                  f"exec(compile(open(__file__).read(), __file__, 'exec'))\n")


def headless_watchdog() -> str:
    """references/session.md's headless recipe, as run here (seconds, not minutes, of polling)."""
    recipe = (ROOT / "references" / "session.md").read_text()
    line = next(ln for ln in recipe.splitlines() if "--detach" in ln and "claude --resume" in ln)
    return as_run(line, sys.executable).replace("--poll 30", "--poll 0.5")


class SkillAgent:
    """A scripted model that follows the skill when a watchdog wakes it: it runs check-in (SKILL.md
    step 7's line), then each of check-in's next: lines, in order, then answers."""

    def __init__(self):
        self.checkin = as_run(skill_block("7"), sys.executable)
        self.wakes: list[str] = []   # the wake prompts, one per resumed conversation

    def __call__(self, body):
        users = [m for m in body.get("messages", []) if m.get("role") == "user"]
        at = next((i for i in range(len(users) - 1, -1, -1) if WAKE in _prompt(users[i])), None)
        if at is None:
            return None
        prompt = _prompt(users[at])
        results = [text_of([b]) for m in users[at + 1:] if isinstance(m.get("content"), list)
                   for b in m["content"] if b.get("type") == "tool_result"]
        if not results:
            self.wakes.append(prompt[prompt.index(WAKE):].split("\n")[0])
            return bash(self.checkin, background=False)
        lines = [ln[len("next: "):] for ln in results[0].splitlines()
                 if ln.startswith("next: ") and not ln.startswith("next: no relaunch line")]
        k = len(results) - 1
        return bash(lines[k], background=False) if k < len(lines) else None


def _prompt(message) -> str:
    """A user message's own text (its tool results left out)."""
    content = message.get("content")
    return content if isinstance(content, str) else "\n".join(
        b.get("text", "") for b in content or [] if isinstance(b, dict) and b.get("type") == "text")


def start_unattended(home, cwd, agent, *loop_args):
    """A `claude -p` that launches the loop (SKILL.md step 5's line) and the headless watchdog
    (session.md's recipe), then ends: from here nobody is there."""
    launch = launch_line().replace("--out runs/exp1", "--out runs/exp1 " + " ".join(loop_args))
    fake = FakeAnthropic([bash(launch, background=False), bash(headless_watchdog(), background=False)], agent=agent)
    fake.__enter__()
    first = client(fake, home, cwd, prompt="Train it unattended.")
    assert first["permission_denials"] == [] and not any(r.get("is_error") for r in fake.tool_results()), \
        fake.tool_results()
    return fake, first


def test_the_headless_chain_closes_with_nobody_there(work):
    """Launch -> detached watchdog with the session.md recipe -> ANOMALY nan -> the conversation
    resumed -> check-in -> its next: lines -> the resumed claude -p ends -> the relaunched trainer
    lives on, resumes past the checkpoint at half the learning rate, reaches its sentinel -> OK done
    resumes the conversation once more."""
    home, cwd = work
    write_loop(cwd)
    run = cwd / "runs" / "exp1"
    agent = SkillAgent()
    fake, first = start_unattended(home, cwd, agent, "--nan-at 60 --lr 0.01 --dt 0.1")
    try:
        relaunch = wait_for(lambda: (r := read_launch(run)) and r["earlier"] and r, "the relaunch", timeout=180)
        wait_for(lambda: agent.wakes, "the resumed conversation", timeout=120)
        wait_for(lambda: not procs_with(f"{WAKE} ANOMALY"), "the resumed claude -p to end", timeout=120)
        assert pid_alive(relaunch["pid"]) and not (run / "final_val_metrics.json").exists(), \
            "the relaunched trainer must outlive the resumed session"
        wait_for(lambda: len(agent.wakes) >= 2, "OK done back at the conversation", timeout=240)
        wait_for(lambda: not procs_with(str(WATCHDOG)) and not procs_with(WAKE),
                 "every watchdog and every resumed claude -p to end", timeout=120)  # nothing is left to wake anyone
    finally:
        fake.__exit__(None, None, None)
    assert kind_of(verdict_of(agent.wakes[0])) == "nan" and step_of(verdict_of(agent.wakes[0])) == 60, agent.wakes
    assert verdict_of(agent.wakes[1]).startswith("OK done: final_val_metrics.json written at step 300/300 (attempt 2)")
    assert len(agent.wakes) == 2, agent.wakes
    a1, a2 = attempts(run)
    assert next(r["step"] for r in a2 if "loss" in r) == 60 and {r["lr"] for r in a2 if "lr" in r} == {0.005}
    final = json.loads((run / "final_val_metrics.json").read_text())
    assert final["run_id"] == a2[0]["run_id"] and a2[0]["pid"] == relaunch["pid"]
    text = json.dumps(fake.requests[-1])
    assert "Train it unattended." in text  # one conversation throughout, resumed twice
    assert [e["headline"] for e in read_launch(run)["on_exit"]] == ["ANOMALY nan", "DONE"]


def test_a_run_that_fails_every_time_stops_at_the_no_progress_bound(work):
    """NaN at step 60 at every learning rate: three relaunches from the checkpoint at 50, then the
    verdict is no_progress with no relaunch line: one final resume says so, and nothing follows."""
    home, cwd = work
    write_loop(cwd)
    run = cwd / "runs" / "exp1"
    agent = SkillAgent()
    fake, first = start_unattended(home, cwd, agent, "--nan-at 60 --lr 0.01 --nan-lr 0 --dt 0.02")
    try:
        wait_for(lambda: "no_progress" in [kind_of(verdict_of(w)) for w in agent.wakes], "the no_progress wake",
                 timeout=420)
        wait_for(lambda: not procs_with(str(WATCHDOG)) and not procs_with(WAKE),
                 "every watchdog and every resumed claude -p to end", timeout=120)  # nothing is left to wake anyone
    finally:
        fake.__exit__(None, None, None)
    kinds = [kind_of(verdict_of(w)) for w in agent.wakes]
    assert kinds == ["nan", "nan", "nan", "no_progress"], agent.wakes
    assert "relaunches without the checkpoint step moving = 3 >= 3 (the last ended in nan)" in agent.wakes[-1]
    assert len(attempts(run)) == 4 and len(read_launch(run)["on_exit"]) == 4
    assert not pid_alive(read_launch(run)["pid"])
    assert not pid_alive(json.loads((run / "watchdog.json").read_text())["watchdog_pid"])


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
