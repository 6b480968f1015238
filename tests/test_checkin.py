"""checkin.py over run directories in every state: the verdict line and the 1,500-char bound."""
import json
import os
import shlex
import signal
import subprocess
import sys

import pytest

from conftest import SCRIPTS, kind_of, need, run_script, wait_for_polls
from supervise.observe import registry
from supervise.contract import atomic_write_json
from supervise.judge.table import KINDS
from supervise.observe.observation import Verdict
from supervise.thresholds import Thresholds
from supervise.vocabulary import anomaly
from supervise.tools.watch import Watchdog

STEP = '{"step": %d, "t": %d, "loss": 0.4, "lr": 0.0001, "grad_norm": 1.0, "sps": 100}\n'


def write(run, text, name="metrics.jsonl"):
    run.mkdir(parents=True, exist_ok=True)
    (run / name).write_text(text)


def start(pid, total=1000):
    return json.dumps({"event": "start", "t": 0, "pid": pid, "total_steps": total, "num_labels": 2,
                       "world_size": 1, "batch_size": 8}) + "\n"


def gone_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def steps(n):
    return "".join(STEP % (10 * i, i) for i in range(1, n + 1))


@pytest.fixture
def sleeper():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield p
    p.kill()
    p.wait()


def test_running_healthy(tmp_path, sleeper):
    write(tmp_path, start(sleeper.pid) + steps(30) + '{"step": 300, "eval_auroc": 0.93, "eval_acc": 0.9}\n')
    rc, out, _ = run_script("checkin.py", tmp_path)
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].startswith(f"RUNNING healthy  {tmp_path}  (metrics ")
    assert "step 300/1000 (30%)" in out and "ETA" in out
    assert "eval @300: auroc=0.93" in out and f"process {sleeper.pid} (start record): sleeping" in out
    assert "gpu: no GPU" in out or "util" in out


@pytest.mark.parametrize("state,first", [
    ("done", "DONE"), ("anomaly", "ANOMALY nan"), ("dead", "ANOMALY crash"), ("not_started", "STARTING"),
    ("empty", "NOT STARTED"), ("no_metrics", "NOT STARTED"), ("corrupt_torn", "RUNNING healthy"),
    ("sentinel_only", "DONE"), ("fatal", "ANOMALY fatal"), ("stale", "ANOMALY stall"),
])
def test_every_state(state, first, tmp_path, sleeper):
    run = tmp_path / "run"
    run.mkdir()
    if state == "done":
        write(run, start(gone_pid()) + steps(100))
        atomic_write_json(run / "final_val_metrics.json", {"eval_auroc": 0.97, "eval_acc": 0.93})
    elif state == "anomaly":
        write(run, start(sleeper.pid) + steps(10) + '{"step": 110, "t": 11, "loss": NaN, "lr": 0, "grad_norm": NaN, "sps": 1}\n')
        atomic_write_json(run / "watchdog.json", {"state": "anomaly", "kind": "nan", "watchdog_pid": gone_pid(),
                                                  "message": "ANOMALY nan: loss = nan is not finite at step 110. Fix.",
                                                  "last_poll": 0})
    elif state == "dead":
        write(run, start(gone_pid()) + steps(10))
        write(run, "Traceback (most recent call last):\n  File \"t.py\", line 3\nKeyError: 'label'\n", "train.log")
    elif state == "not_started":
        write(run, start(sleeper.pid))
    elif state == "empty":
        write(run, "")
    elif state == "corrupt_torn":
        write(run, start(sleeper.pid) + steps(5) + "garbage\n\x00\x01\n" + steps(3) + '{"step": 99, "lo')
    elif state == "sentinel_only":
        atomic_write_json(run / "final_val_metrics.json", {"eval_auroc": 0.9})
    elif state == "fatal":
        write(run, start(gone_pid()) + steps(3) + '{"step": 31, "t": 3, "FATAL": "labels out of range"}\n')
    elif state == "stale":
        write(run, steps(5))
        os.utime(run / "metrics.jsonl", (1, 1))
    rc, out, err = run_script("checkin.py", run)
    assert rc == 0, err
    assert out.splitlines()[0].startswith(f"{first}  {run}"), out
    assert len(out.rstrip("\n")) <= 1500
    if state == "dead":
        assert "last error: KeyError: 'label'" in out
    if state == "anomaly":
        assert kind_of(out.splitlines()[1]) == "nan" and out.splitlines()[1].startswith("ANOMALY nan: loss = nan "), out


def test_stopped_process_is_stalled(tmp_path, sleeper):
    write(tmp_path, start(sleeper.pid) + steps(5))
    os.kill(sleeper.pid, signal.SIGSTOP)
    try:
        rc, out, _ = run_script("checkin.py", tmp_path)
    finally:
        os.kill(sleeper.pid, signal.SIGCONT)
    lines = out.splitlines()
    assert lines[0].startswith(f"ANOMALY stall  {tmp_path}") and kind_of(lines[1]) == "stall", out
    assert f"pid {sleeper.pid} state = stopped != running at step 50. " in lines[1], out


def test_output_stays_bounded_with_huge_values(tmp_path, sleeper):
    big = "x" * 5000
    write(tmp_path, start(sleeper.pid) + steps(50) + json.dumps({"step": 600, "t": 1, "FATAL": big}) + "\n")
    write(tmp_path, "Traceback (most recent call last):\n" + "ValueError: " + big + "\n", "train.log")
    rc, out, _ = run_script("checkin.py", tmp_path, "--lines", "200")
    assert rc == 0 and len(out.rstrip("\n")) <= 1500
    assert all(len(line) < 1500 for line in out.splitlines())


def test_json_has_the_same_facts(tmp_path, sleeper):
    write(tmp_path, start(sleeper.pid) + steps(20))
    rc, out, _ = run_script("checkin.py", tmp_path, "--json")
    facts = json.loads(out)
    assert facts["verdict"] == "RUNNING healthy" and facts["step"] == 200 and len(out) <= 1500
    # the last 5 steps, fewer when the 1,500-character cut takes the oldest (a long tmp path, a slow machine's notes)
    assert 3 <= len(facts["steps"]) <= 5 and [r["step"] for r in facts["steps"]] == [160, 170, 180, 190, 200][-len(facts["steps"]):]
    assert facts["process"]["pid"] == sleeper.pid


def test_json_over_its_bound_keeps_the_line_the_next_lines_their_notes_and_the_stacks():
    """A torchrun hang: a long relaunch line and five ranks' steps pass 1,500 characters; the
    lists shrink and the small facts go, but never what the agent acts on."""
    from supervise.tools.checkin import LIMIT, bounded_json
    facts = {"run_dir": "/runs/exp1", "verdict": "ANOMALY stall", "watchdog_message": "ANOMALY stall: " + "x" * 400,
             "steps": [{"step": i, "loss": 0.5, "lr": 1e-4, "grad_norm": 1.0, "sps": 100} for i in range(5)],
             "ranks": ["rank %d: step 28, 6s ago" % r for r in range(8)], "time_limit": "none (" + "y" * 200 + ")",
             "next": ["cd /runs && python launch.py /runs/exp1 --replace -- " + "z" * 500, "python watchdog.py /runs/exp1"],
             "next_notes": ["this relaunch starts over from step 0"], "notes": ["n" * 200],
             "stacks": "stacks: 2 files (one per process) in /runs/exp1/stacks/ from 20261207T020000.000"}
    got = json.loads(bounded_json(facts))
    assert len(json.dumps(got)) <= LIMIT and not got.get("steps") and "time_limit" not in got
    assert got["watchdog_message"] == facts["watchdog_message"][:300] and got["next"][1] == facts["next"][1]
    assert got["next_notes"] == facts["next_notes"] and got["stacks"] == facts["stacks"]


def test_zero_arguments_find_the_registered_run_from_anywhere(tmp_path, sleeper):
    run = tmp_path / "deep" / "run"
    write(run, start(sleeper.pid) + steps(5))
    registry.register(run, os.getpid())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    rc, out, _ = run_script("checkin.py", cwd=elsewhere)
    assert rc == 0 and out.startswith(f"RUNNING healthy  {run.resolve()}")


def test_zero_arguments_fall_back_to_the_newest_metrics_below(tmp_path, sleeper):
    old, new = tmp_path / "runs" / "a", tmp_path / "runs" / "b"
    write(old, steps(5))
    os.utime(old / "metrics.jsonl", (1, 1))
    write(new, start(sleeper.pid) + steps(5))
    rc, out, _ = run_script("checkin.py", cwd=tmp_path)
    assert rc == 0 and out.startswith(f"RUNNING healthy  {new}")


def test_nothing_found_is_one_line_exit_2(tmp_path):
    rc, out, err = run_script("checkin.py", cwd=tmp_path)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "pass RUN_DIR" in err
    rc, out, err = run_script("checkin.py", tmp_path / "missing")
    assert rc == 2 and "is not a run directory" in err


def test_plot_writes_a_png(tmp_path, sleeper):
    need("matplotlib")
    write(tmp_path, start(sleeper.pid) + steps(30) + '{"step": 300, "eval_auroc": 0.93, "eval_acc": 0.9}\n')
    rc, out, _ = run_script("checkin.py", tmp_path, "--plot")
    assert rc == 0 and out.strip().endswith("metrics.png")
    assert (tmp_path / "metrics.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".metrics")] == []


def test_checkin_imports_neither_torch_nor_pandas(tmp_path):
    code = ("import sys; sys.argv=['c', %r]; sys.path.insert(0, %r); from supervise.tools.checkin import main; main(); "
            "assert 'torch' not in sys.modules and 'pandas' not in sys.modules") % (str(tmp_path), str(SCRIPTS.parent))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def ended_watchdog(run, verdict):
    """The real Watchdog's state file, as a watchdog that judged this run and ended on ``verdict``."""
    w = Watchdog(run, Thresholds(poll=0.2))
    w.observer.observe()
    w.verdict = verdict
    w.argv = ("--poll", "0.2")
    w.save()


FINAL = [(f"ANOMALY {k}", Verdict("anomaly", f"ANOMALY {k}: what = 1 > 0 at step 50. Fix it.",
                                  anomaly(k, "what = 1 > 0", 50, "Fix it"), f"ANOMALY {k}")) for k in KINDS]
FINAL += [("DONE", Verdict("done", "OK done: final_val_metrics.json written at step 300/300", None, "DONE")),
          ("STOPPED", Verdict("stopped", "STOPPED: pid 7 stopped by stop.py at step 50; no anomaly before it", None,
                              "STOPPED"))]


@pytest.mark.parametrize("headline,verdict", FINAL, ids=[f[0] for f in FINAL])
def test_checkin_renders_the_verdict_a_watchdog_ended_on(headline, verdict, tmp_path, sleeper):
    """Whatever kind a watchdog ended with, check-in says the same kind and line while the records
    are of that attempt, even where its own look would differ (the trainer looks alive and healthy)."""
    write(tmp_path, start(sleeper.pid).replace('"t": 0', '"t": 0, "run_id": "r1", "attempt": 1') + steps(5))
    ended_watchdog(tmp_path, verdict)
    facts = json.loads(run_script("checkin.py", tmp_path, "--json")[1])
    assert facts["verdict"] == headline and facts["watchdog"]["verdict"] == headline, facts
    if verdict.state == "anomaly":
        assert facts["watchdog_message"] == verdict.line
    # a newer attempt's start record: that verdict is history, check-in judges the new attempt itself
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write(start(sleeper.pid).replace('"t": 0', '"t": 0, "run_id": "r2", "attempt": 2') + STEP % (60, 1))
    facts = json.loads(run_script("checkin.py", tmp_path, "--json")[1])
    assert facts["verdict"] == "RUNNING healthy", facts


def test_a_watchdog_that_died_is_gone_and_its_line_is_offered_again(tmp_path, sleeper):
    """A watchdog killed (the OOM killer: exit 137) leaves watchdog.json saying "watching": check-in
    says it is gone, with the next: line that starts it again with its old flags."""
    write(tmp_path, start(sleeper.pid) + steps(5))
    wd = subprocess.Popen([sys.executable, str(SCRIPTS / "watchdog.py"), str(tmp_path), "--poll", "0.2",
                           "--max-stall", "600", "--on-exit", "echo woke >> woke.txt"], cwd=tmp_path)
    wait_for_polls(tmp_path, 2, wd)
    alive = run_script("checkin.py", tmp_path)[1]
    assert f"watchdog: alive (pid {wd.pid}), watching, last poll " in alive and "next:" not in alive, alive
    wd.kill()
    assert wd.wait() == -signal.SIGKILL
    out = run_script("checkin.py", tmp_path)[1]
    assert out.startswith("RUNNING healthy"), out
    assert f"watchdog: gone (pid {wd.pid}, last poll " in out and "nothing will wake you" in out, out
    (nxt,) = [ln[len("next: "):] for ln in out.splitlines() if ln.startswith("next: ")]
    assert shlex.split(nxt) == [sys.executable, str(SCRIPTS / "watchdog.py"), str(tmp_path), "--poll", "0.2",
                                "--max-stall", "600", "--on-exit", "echo woke >> woke.txt"], nxt


def test_help_names_every_headline():
    """--help lists every first line check-in prints (observation.Verdict's headlines)."""
    import inspect
    from supervise.observe import observation
    rc, out, err = run_script("checkin.py", "--help")
    said = " ".join(out.split())
    doc = inspect.getsource(observation.Verdict)
    heads = doc.split("headline: str = \"\"")[1].split("#", 1)[1].split("\n", 1)[0]
    for h in [x.strip() for x in heads.split("|")]:
        assert h in said, (h, said)
    assert "STOPPED" in said
