"""After the alarm, with nobody there: every attempt is a launch (the relaunch line from check-in's
``next:`` goes through the launcher, so it outlives the shell, the session and the process group
that ran it), one watchdog per run however often its line is given, and an ``--on-exit`` wake sent
once per verdict and launch. Real processes, real signals; the trainer is tests/resumable_loop.py
(a plain loop with Telemetry, a declared ``--resume {checkpoint}`` recipe, a save every 50 steps,
NaN from step 60 while the learning rate is above 0.008)."""
import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import LAUNCHER, ROOT, WATCHDOG, attempts, end_launched, kind_of, launch, pid_alive, procs_with, run_script, \
    shell, wait_for, wait_for_polls
from supervise.observe.state import read_launch

LOOP = ROOT / "tests" / "resumable_loop.py"
BOUND = 120  # seconds: a hang, never a slow machine


@pytest.fixture
def work(tmp_path):
    yield tmp_path
    end_launched(tmp_path)
    for pid in procs_with(str(tmp_path)):  # detached watchdogs and anything else this test started
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def launched(work, run, *args) -> dict:
    """tests/resumable_loop.py started through the launcher into ``run``: its launch record."""
    p = launch(work, run, sys.executable, "-u", LOOP, "--out", run, *args)
    assert p.returncode == 0, p.stderr
    return read_launch(run)


def nan_then_next_lines(work, *loop_args) -> tuple[Path, list[str]]:
    """A run that NaNs at step 60 (lr 0.01), its watchdog's ANOMALY nan, then check-in's next: lines."""
    run = work / "runs" / "exp1"
    launched(work, run, "--nan-at", "60", "--dt", "0.02", *loop_args)
    rc, out, err = run_script("watchdog.py", run, "--poll", "0.3", timeout=BOUND)
    assert rc == 7 and kind_of(out) == "nan", out + err
    text = run_script("checkin.py", run)[1]
    nxt = [ln[len("next: "):] for ln in text.splitlines() if ln.startswith("next: ")]
    relaunch = [sys.executable, str(LAUNCHER), str(run), "--replace", "--", sys.executable, "-u", str(LOOP),
                "--out", str(run), "--nan-at", "60", "--dt", "0.02", *loop_args,
                "--lr=0.005", "--resume", str(run / "checkpoints" / "step-50.pt")]   # half the lr, the save at 50
    assert nxt == [f"cd {shlex.quote(str(work))} && {shlex.join(relaunch)}",
                   shlex.join([sys.executable, str(WATCHDOG), str(run), "--poll", "0.3"])], text
    return run, nxt


def finished(run: Path) -> dict:
    return wait_for(lambda: json.loads((run / "final_val_metrics.json").read_text())
                    if (run / "final_val_metrics.json").exists() else None, "the sentinel", timeout=BOUND)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGHUP], ids=["SIGKILL", "SIGHUP"])
def test_the_relaunch_line_outlives_the_process_group_that_ran_it(work, sig):
    """What a client does to its background tasks, or an SSH drop to a shell: the relaunch line run by
    ``bash -c`` in its own process group, that group signalled once the relaunched trainer works. The
    trainer lives on, resumes past the checkpoint at half the learning rate and finishes."""
    run, (line, _) = nan_then_next_lines(work)
    sh = shell(f"{line} && sleep 60", cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    rec = wait_for(lambda: (r := read_launch(run)) and len(r["earlier"]) == 1 and r, "the relaunch's record")
    wait_for(lambda: len(attempts(run)) == 2 and any("loss" in r for r in attempts(run)[1]),
             "the relaunched trainer's first step record", timeout=BOUND)
    wait_for(lambda: not procs_with(str(LAUNCHER)), "the launcher to return", timeout=BOUND)
    os.killpg(sh.pid, sig)
    sh.wait(timeout=30)
    assert pid_alive(rec["pid"]), "the relaunched trainer died with its caller's group"
    final = finished(run)
    a1, a2 = attempts(run)
    assert final["run_id"] == a2[0]["run_id"] and final["attempt"] == 2 and final["step"] == 300
    assert next(r["step"] for r in a2 if "loss" in r) == 60 and {r["lr"] for r in a2 if "lr" in r} == {0.005}
    assert a2[0]["pid"] == rec["pid"] and rec["argv"][-2:] == ["--resume", str(run / "checkpoints" / "step-50.pt")]


def test_the_old_relaunch_line_dies_with_its_group(work):
    """The control: the same command the way v0.3 wrote it (cd CWD && ENV python ... >> train.log),
    run and signalled the same way, dies with the group. The test above can fail."""
    run, (line, _) = nan_then_next_lines(work)
    cmd = shlex.split(line)
    raw = f"cd {shlex.quote(str(work))} && {shlex.join(cmd[cmd.index('--') + 1:])} >> {shlex.quote(str(run))}/train.log 2>&1"
    sh = shell(raw, cwd=work)
    wait_for(lambda: len(attempts(run)) == 2, "the raw relaunch's start record")
    os.killpg(sh.pid, signal.SIGKILL)
    sh.wait(timeout=30)
    wait_for(lambda: not procs_with(str(LOOP)), "the raw relaunch to die with its group")
    assert not (run / "final_val_metrics.json").exists()


def test_a_watchdog_line_given_twice_makes_one_watchdog(work):
    run = work / "run"
    launched(work, run, "--steps", "100000")
    first = subprocess.Popen([sys.executable, str(WATCHDOG), str(run), "--poll", "0.3"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    wait_for_polls(run, 1, first)
    for extra in ((), ("--detach",)):  # in the foreground, and detached: both refused, one line, exit 2
        rc, out, err = run_script("watchdog.py", run, "--poll", "0.3", *extra)
        assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, out + err
        assert f"is already watched by watchdog pid {first.pid}" in err and "check in" in err, err
    assert [p for p in procs_with(str(WATCHDOG)) if p != first.pid] == []
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=30) == 0
    rc, out, err = run_script("watchdog.py", run, "--poll", "0.3", "--detach")  # the lock went with it
    assert rc == 0 and out.startswith("watchdog pid ") and " detached: it watches " in out, out + err
    pid = int(out.split()[2])
    assert pid_alive(pid) and os.getsid(pid) == pid  # its own session: it outlives whoever started it
    state = wait_for(lambda: json.loads((run / "watchdog.json").read_text()) if (run / "watchdog.json").exists()
                     and json.loads((run / "watchdog.json").read_text())["watchdog_pid"] == pid else None,
                     "the detached watchdog's state")
    assert state["argv"] == ["--poll", "0.3", "--detach"]  # check-in offers it again detached
    rc, out, err = run_script("watchdog.py", run, "--detach")
    assert rc == 2 and f"already watched by watchdog pid {pid}" in err, out + err


def test_on_exit_is_sent_once_per_verdict_and_launch(work):
    """A watchdog restarted on a run that already ended says the same verdict but wakes nobody a second
    time (no endless resume loop); a relaunch is a new launch, whose verdict is sent."""
    run = work / "run"
    launched(work, run, "--nan-at", "60", "--dt", "0.02")
    wake = ["--poll", "0.3", "--on-exit", "echo \"$SUPERVISE_VERDICT\" >> woke.txt"]
    rc, first, _ = run_script("watchdog.py", run, *wake, cwd=work, timeout=BOUND)
    assert rc == 7 and kind_of(first) == "nan", first
    wait_for(lambda: (work / "woke.txt").exists(), "the first wake")
    rc, again, err = run_script("watchdog.py", run, *wake, cwd=work, timeout=BOUND)
    assert rc == 7 and again == first and "--on-exit not run again: it ran for ANOMALY nan of pid " in err, err
    # the record and the log's header are written before the command starts: one of each, one wake
    assert [e["headline"] for e in read_launch(run)["on_exit"]] == ["ANOMALY nan"]
    assert sum(ln.startswith("--- ") for ln in (run / "on_exit.log").read_text().splitlines()) == 1
    assert (work / "woke.txt").read_text().splitlines() == [first.strip()]


def test_a_launch_refuses_a_live_trainer_nobody_launched_and_replace_stops_it(work):
    """A trainer started some other way (its output is train.log) is the folder's trainer too."""
    run = work / "run"
    run.mkdir()
    with open(run / "train.log", "ab") as log:
        raw = subprocess.Popen([sys.executable, "-u", str(LOOP), "--out", str(run), "--steps", "100000"],
                               stdout=log, stderr=subprocess.STDOUT, cwd=work)
    try:
        rc, out, err = run_script("launch.py", run, "--", sys.executable, "-u", LOOP, "--out", run, cwd=work)
        assert rc == 2 and f"already has a live trainer (pid {raw.pid}, writes train.log)" in err, err
        assert "--replace" in err and read_launch(run) is None
        rc, out, err = run_script("launch.py", run, "--replace", "--grace", "5s", "--", sys.executable, "-u", LOOP,
                                  "--out", run, cwd=work)
        assert rc == 0, err
        assert raw.wait(timeout=30) == -signal.SIGTERM
        rec = read_launch(run)
        assert rec["replaced"] == [{"pid": raw.pid, "how": "SIGTERM, then SIGKILL after the grace"}]
        assert pid_alive(rec["pid"])
    finally:
        if raw.poll() is None:
            raw.kill()
            raw.wait()


def test_replace_stops_a_hung_launched_trainer_and_records_why(work):
    run = work / "run"
    first = launched(work, run, "--steps", "100000")
    os.kill(first["pid"], signal.SIGSTOP)  # hung: SIGTERM alone cannot end it
    rc, out, err = run_script("launch.py", run, "--replace", "--grace", "1s", "--", sys.executable, "-u", LOOP,
                              "--out", run, cwd=work)
    assert rc == 0, err
    wait_for(lambda: not pid_alive(first["pid"]), "the stopped trainer to be gone")
    rec = read_launch(run)
    assert rec["earlier"][0]["pid"] == first["pid"] and rec["replaced"][0]["pid"] == first["pid"]
    assert "SIGTERM, still running after 1s; SIGKILL" in rec["replaced"][0]["how"]
