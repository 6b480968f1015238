"""The launcher, the stopper and the on-exit hook with real processes and real signals: the
trainer runs detached (own session, stdin /dev/null, output appended to train.log, the quiet
variables), outlives the shell session that launched it, is never launched twice, is stopped by
SIGTERM then SIGKILL; every bad input is one line and exit 2 with nothing started."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bad_input import Result, assert_refused, replay, snapshot, user_folder
from conftest import LAUNCHER, ROOT, as_run, assert_checkin_agrees, end_launched, keeps_writing, kind_of, launch, lines, \
    missing, pid_alive, polls, procs_with, records, run_script, start_script, stop, trainer_argv, wait_for, \
    wait_for_lines, wait_for_polls, watchdog_state
from supervise.observe import registry
from supervise.act.launch import run_on_exit
from supervise.observe.probes import here_fields
from supervise.act.recovery import watchdog_line
from supervise.observe.state import launch_alive, read_launch, typed_launch
from supervise.vocabulary import LAUNCH


@pytest.fixture
def work(tmp_path):
    w = user_folder(tmp_path)
    yield w
    end_launched(tmp_path)


def proc_env(pid) -> dict:
    raw = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    return dict(kv.decode(errors="replace").partition("=")[::2] for kv in raw if b"=" in kv)


def test_the_launcher_returns_at_once_and_the_trainer_runs_detached(work):
    run = work / "runs" / "a"
    run.mkdir(parents=True)
    (run / "train.log").write_text("an earlier attempt's output\n")
    env = {**os.environ, "CLAUDE_CODE_SESSION_ID": "sess-1234", "TRANSFORMERS_VERBOSITY": "info"}
    t0 = time.monotonic()
    p = launch(work, "runs/a", *trainer_argv("runs/a"), extra=["--window", "8h"], env=env)
    took = time.monotonic() - t0
    assert p.returncode == 0 and p.stderr == "", p.stderr
    out = p.stdout.strip().splitlines()
    assert len(out) == 1, p.stdout
    rec = read_launch(run)
    assert out[0] == (f"launched pid {rec['pid']} (group {rec['pid']}), output >> {run / 'train.log'}; next, with "
                      f"run_in_background: true: {watchdog_line(run)}")
    assert took < 30 and pid_alive(rec["pid"])  # it returned while the trainer runs
    keeps_writing(run / "metrics.jsonl")
    raw = json.loads((run / LAUNCH).read_text())
    assert rec == {**raw, "stop": None, "stopped_at": None, "job_id": None, "options": None} and set(raw) == {"pid", "pgid", "sid", "host", "create_time", "launched_at", "argv", "cwd", "engine",
                                       "window_s", "session_id", "log", "run_dir", "earlier", "env", "replaced",
                                       "on_exit", *here_fields()}
    assert {k: rec[k] for k in ("pid_ns", "boot_id")} == {"pid_ns": None, "boot_id": None, **here_fields()}
    assert rec["pgid"] == rec["sid"] == rec["pid"] != os.getsid(0)  # its own session and group
    assert rec["host"] == socket.gethostname() and rec["cwd"] == str(work) and rec["window_s"] == 8 * 3600
    assert rec["argv"] == trainer_argv("runs/a") and rec["session_id"] == "sess-1234" and rec["earlier"] == []
    assert abs(rec["launched_at"] - time.time()) < 60 and launch_alive(rec)
    assert os.readlink(f"/proc/{rec['pid']}/fd/0") == "/dev/null"
    assert os.readlink(f"/proc/{rec['pid']}/fd/1") == os.readlink(f"/proc/{rec['pid']}/fd/2") == str(run / "train.log")
    child_env = proc_env(rec["pid"])
    assert {k: child_env.get(k) for k in ("PYTHONUNBUFFERED", "HF_HUB_DISABLE_PROGRESS_BARS", "TRANSFORMERS_VERBOSITY",
                                          "TOKENIZERS_PARALLELISM")} == \
        {"PYTHONUNBUFFERED": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error",
         "TOKENIZERS_PARALLELISM": "false"}
    wait_for(lambda: "step " in (run / "train.log").read_text(), "the trainer's output in train.log")
    assert (run / "train.log").read_text().startswith("an earlier attempt's output\n")  # appended, not truncated
    entry = registry.latest()
    assert entry["run_dir"] == str(run) and entry["launch"] == raw


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGHUP])
def test_the_trainer_outlives_the_shell_session_that_launched_it(work, sig):
    run = work / "runs" / "b"
    line = " ".join(map(str, [sys.executable, LAUNCHER, run, "--", *trainer_argv(run)]))
    shell = subprocess.Popen(["setsid", "bash", "-c", f"{line} > launcher.out 2>&1; sleep 600"], cwd=work)
    try:
        wait_for(lambda: read_launch(run) and (work / "launcher.out").read_text().startswith("launched"),
                 "the launcher's record and line")
        rec = read_launch(run)
        keeps_writing(run / "metrics.jsonl", 2)
        os.killpg(os.getpgid(shell.pid), sig)  # the whole session of the shell: as a closed terminal would
        shell.wait(timeout=60)
        assert shell.returncode == -sig
    finally:
        if shell.poll() is None:
            shell.kill()
    keeps_writing(run / "metrics.jsonl", 5)
    assert launch_alive(rec)


def test_a_second_launch_into_a_live_run_is_refused_and_a_stopped_one_relaunches(work):
    run = work / "runs" / "c"
    assert launch(work, run, *trainer_argv(run)).returncode == 0
    first = read_launch(run)
    before = (run / LAUNCH).read_bytes()
    p = launch(work, run, *trainer_argv(run, "--run-id", "second-launch-9d2c"))
    assert p.returncode == 2 and p.stdout == "" and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert f"already has a live trainer (pid {first['pid']}" in p.stderr and "stop.py" in p.stderr
    assert (run / LAUNCH).read_bytes() == before
    assert procs_with("second-launch-9d2c") == []
    assert stop(work, run).returncode == 0
    p = launch(work, run, *trainer_argv(run))
    assert p.returncode == 0, p.stderr
    again = read_launch(run)
    assert again["pid"] != first["pid"] and again["stop"] is None and launch_alive(again)


def test_the_launchers_window_is_the_time_limit(work):
    """``launch.py RUN --window 3s``: a watchdog with no --hard-timeout ends the run's watch at 3 s of
    wall time with the window as the limit, and check-in names the same limit."""
    run = work / "runs" / "win"
    assert launch(work, run, *trainer_argv(run, dt=0.05), extra=["--window", "3s"]).returncode == 0
    rc, out, err = run_script("watchdog.py", run, "--poll", "0.2", cwd=work, timeout=120)
    assert rc == 7 and kind_of(out) == "timeout", out + err
    m = re.match(r"ANOMALY timeout: wall time = (\d+(?:\.\d)?)s > 3\.0s \(the launcher's --window\) at step \d+\. ", out)
    assert m and float(m[1]) >= 3.0, out
    assert_checkin_agrees(run, out.strip())
    rc, text, err = run_script("checkin.py", run, cwd=work)
    (limit,) = [ln for ln in text.splitlines() if ln.startswith("time limit: ")]
    assert limit.startswith("time limit: 3s from the run's start (the launcher's --window); "), text


def test_stop_py_while_the_watchdog_runs_is_the_watchdogs_stopped_verdict(work):
    """``stop.py RUN`` ends a launched trainer the watchdog follows: the watchdog exits 0 with one
    line, ``STOPPED: pid N stopped by stop.py at step S; no anomaly before it``, and check-in's
    headline is STOPPED: a stop asked for is no anomaly."""
    run = work / "runs" / "stopped"
    assert launch(work, run, *trainer_argv(run, dt=0.05)).returncode == 0
    rec = read_launch(run)
    wait_for_lines(run / "metrics.jsonl", 3)
    wd = start_script("watchdog.py", run, "--poll", "0.2", cwd=work)
    wait_for_polls(run, polls(run) + 2, wd)  # it follows the trainer's records
    assert stop(work, run).returncode == 0
    out, err = wd.communicate(timeout=60)
    assert wd.returncode == 0 and len(out.splitlines()) == 1, out + err
    m = re.fullmatch(rf"STOPPED: pid {rec['pid']} stopped by stop\.py at step (\d+); no anomaly before it\n", out)
    last = max(r["step"] for r in records(run) if "loss" in r)
    assert m and 0 < int(m[1]) <= last, (out, last)
    state = watchdog_state(run)
    assert (state["state"], state["headline"], state["message"]) == ("stopped", "STOPPED", out.strip())
    facts = assert_checkin_agrees(run, out.strip())
    assert facts["watchdog"]["verdict"] == "STOPPED" and not facts["watchdog"]["alive"], facts
    rc, text, _ = run_script("checkin.py", run, cwd=work)
    assert text.startswith("STOPPED  ") and "with STOPPED" in text, text


def _unwritable(work):
    ro = work / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    return ro / "run"


def _fifo_log(work):
    run = work / "runs" / "f"
    run.mkdir(parents=True)
    os.mkfifo(run / "train.log")
    return run


MARK = "launch-marker-7f3a"
SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)", MARK]

# (case, RUN_DIR or a maker of it, arguments after RUN_DIR, text the one line holds)
BAD = [
    ("nothing_after_the_dashes", "runs/x", ["--"], "no command to launch: put it after --"),
    ("no_dashes_no_command", "runs/x", [], "no command to launch"),
    ("command_before_the_dashes", "runs/x", ["python", "train.py"], "put the command after --"),
    ("command_not_on_path", "runs/x", ["--", "no-such-trainer-xyz", MARK], "no-such-trainer-xyz: command not found on PATH"),
    ("script_not_executable", "runs/x", ["--", "./train.sh", MARK], "./train.sh is not executable: chmod +x"),
    ("path_that_does_not_exist", "runs/x", ["--", "./missing/train", MARK], "./missing/train: no such file"),
    ("a_folder_as_command", "runs/x", ["--", "./data", MARK], "./data is a folder, not a command"),
    ("empty_run_dir", "", ["--", *SLEEPER], "the run directory is empty"),
    ("run_dir_is_a_file", "precious.txt", ["--", *SLEEPER], "is a file, not a run directory"),
    ("run_dir_below_a_file", "precious.txt/run", ["--", *SLEEPER], "is not writable (Not a directory)"),
    ("unwritable_run_dir", _unwritable, ["--", *SLEEPER], "is not writable (Permission denied)"),
    ("train_log_is_a_fifo", _fifo_log, ["--", *SLEEPER], "is a FIFO, not a regular file; remove it"),
    ("window_not_a_duration", "runs/x", ["--window", "forever", "--", *SLEEPER], "'forever' is not a duration"),
    ("window_zero", "runs/x", ["--window", "0", "--", *SLEEPER], "must be more than 0 seconds"),
]


def _as_user_without_override():
    """As root, the launcher runs without CAP_DAC_OVERRIDE, so that a 0555 folder is unwritable."""
    if os.geteuid() != 0:
        return []
    if not shutil.which("setpriv"):
        missing("root without setpriv: cannot make a folder unwritable for the launcher")
    return ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]


@pytest.mark.parametrize("case,run_dir,args,needle", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_one_line_exit_2_and_nothing_started(work, case, run_dir, args, needle):
    (work / "train.sh").write_text("#!/bin/sh\nsleep 60\n")
    run_dir = run_dir(work) if callable(run_dir) else run_dir
    before = snapshot(work)
    if case == "unwritable_run_dir":
        t0 = time.monotonic()
        p = subprocess.run([*_as_user_without_override(), sys.executable, str(LAUNCHER), str(run_dir), *args],
                           cwd=work, capture_output=True, text=True, timeout=60)
        r = Result(p.returncode, p.stdout, p.stderr, time.monotonic() - t0)
    else:
        r = replay("launch.py", [run_dir, *args], work)
    assert_refused(r, needle)
    assert r.out == ""
    after = snapshot(work)
    made = {k: v for k, v in after.items() if before.get(k) != v}
    assert all(v == "dir" for v in made.values()), made  # no launch.json, no train.log: at most an empty folder
    assert procs_with(MARK) == [], "a process was started"


IGNORES_TERM = ("import signal, subprocess, sys, time\n"
                "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                "child = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
                "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'])\n"
                "print('child', child.pid, flush=True)\n"
                "time.sleep(600)\n")


@pytest.mark.parametrize("ignores_term", [False, True], ids=["exits_on_sigterm", "ignores_sigterm"])
def test_stop_sends_sigterm_then_sigkill_to_the_group_and_records_it(work, ignores_term):
    run = work / "runs" / "s"
    (work / "stubborn.py").write_text(IGNORES_TERM)
    cmd = [sys.executable, "-u", "stubborn.py"] if ignores_term else trainer_argv(run)
    assert launch(work, run, *cmd).returncode == 0
    rec = read_launch(run)
    if ignores_term:
        child = int(wait_for(lambda: "child " in (run / "train.log").read_text() and
                             (run / "train.log").read_text().split()[1], "the child's pid"))
        assert os.getpgid(child) == rec["pgid"]
    else:
        keeps_writing(run / "metrics.jsonl", 2)
    p = stop(work, run, "--grace", "1s" if ignores_term else "30s")
    assert p.returncode == 0 and p.stderr == "" and len(p.stdout.strip().splitlines()) == 1, p.stdout + p.stderr
    who = f"stopped pid {rec['pid']} (group {rec['pgid']}): "
    if ignores_term:
        assert p.stdout.startswith(who + "SIGTERM, still running after 1s; SIGKILL, exited after "), p.stdout
        assert not pid_alive(child)
    else:
        assert p.stdout.startswith(who + "SIGTERM, exited after "), p.stdout
    assert not pid_alive(rec["pid"]) and not launch_alive(rec)
    done = read_launch(run)
    assert done["stop"]["signals"] == (["SIGTERM", "SIGKILL"] if ignores_term else ["SIGTERM"])
    assert done["stop"]["by"] == "stop.py" and done["stop"]["requested_at"] <= done["stopped_at"]
    assert done["stop"]["grace_s"] == (1.0 if ignores_term else 30.0) and done["stop"]["exited_after_s"] >= 0
    assert {k: done[k] for k in rec if k not in ("stop", "stopped_at")} == \
        {k: v for k, v in rec.items() if k not in ("stop", "stopped_at")}  # what was launched stays as it was
    again = stop(work, run)
    assert again.returncode == 0 and again.stdout.strip() == f"pid {rec['pid']} (group {rec['pgid']}) is already " \
                                                             "gone; nothing to stop"


@pytest.mark.parametrize("args,needle", [
    (["runs/none"], "has no readable launch.json"),
    (["runs/none", "--grace", "soon"], "'soon' is not a duration"),
    ([""], "the run directory is empty"),
])
def test_stop_without_a_launch_record_is_one_line_exit_2(work, args, needle):
    (work / "runs" / "none").mkdir(parents=True)
    assert_refused(replay("stop.py", args, work), needle)


def test_run_on_exit_runs_once_detached_with_the_verdict_in_its_environment(work, monkeypatch):
    monkeypatch.chdir(work)  # it runs in the caller's folder, as the watchdog's
    run = work / "runs" / "e"
    run.mkdir(parents=True)
    (run / LAUNCH).write_text(json.dumps({"pid": 999999, "launched_at": 1.0, "argv": ["python"],
                                          "session_id": "sess-42"}))
    line = "ANOMALY nan: loss = nan is not finite at step 120. Abort: lower the learning rate."
    cmd = "env | grep ^SUPERVISE_ | sort > env.txt; echo $$ $(ps -o sid= -p $$) >> ran.txt; echo said-this"
    run_on_exit(cmd, line=line, kind="nan", code=7, run_dir=run)
    wait_for(lambda: (work / "ran.txt").exists() and "said-this" in (run / "on_exit.log").read_text(),
             "the on-exit command")
    env = dict(ln.partition("=")[::2] for ln in (work / "env.txt").read_text().splitlines())
    env.pop("SUPERVISE_STATE_DIR")  # the tests' own registry folder, inherited
    assert env == {"SUPERVISE_VERDICT": line, "SUPERVISE_KIND": "nan", "SUPERVISE_EXIT_CODE": "7",
                   "SUPERVISE_RUN_DIR": str(run), "SUPERVISE_SESSION_ID": "sess-42"}
    pid, sid = (work / "ran.txt").read_text().split()
    assert pid == sid  # its own session
    assert lines(work / "ran.txt") == 1 and (run / "on_exit.log").read_text().startswith("--- ")


def test_run_on_exit_never_raises(tmp_path, capfd):
    run_on_exit("true", line="OK done", kind=None, code=0, run_dir=tmp_path / "not" / "there")
    assert "--on-exit did not start" in capfd.readouterr().err


@pytest.mark.parametrize("fault,code,kind", [([], 0, ""), (["--nan-at", "60"], 7, "nan")], ids=["done", "nan"])
def test_the_watchdog_runs_its_on_exit_command_once_after_its_line(work, fault, code, kind):
    run = work / "runs" / "w"
    argv = trainer_argv(run, *fault, records=10 if not fault else 3000, dt=0.05)
    if not fault:
        argv.remove("--no-sentinel")  # done: the sentinel after 10 records
    assert launch(work, run, *argv, extra=["--session-id", "sess-w"]).returncode == 0
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "watchdog.py"), str(run), "--poll", "0.2",
                        "--on-exit", 'printf "%s|%s|%s|%s\\n" "$SUPERVISE_EXIT_CODE" "$SUPERVISE_KIND" '
                                     '"$SUPERVISE_SESSION_ID" "$SUPERVISE_VERDICT" >> woke.txt'],
                       cwd=work, capture_output=True, text=True, timeout=120)
    assert p.returncode == code, p.stdout + p.stderr
    verdict = p.stdout.strip()
    wait_for(lambda: (work / "woke.txt").exists(), "the on-exit command")
    assert (work / "woke.txt").read_text() == f"{code}|{kind}|sess-w|{verdict}\n"


def test_a_failing_on_exit_command_changes_nothing(work):
    run = work / "runs" / "x"
    argv = trainer_argv(run, records=5, dt=0.01)
    argv.remove("--no-sentinel")
    assert launch(work, run, *argv).returncode == 0
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "watchdog.py"), str(run), "--poll", "0.2",
                        "--on-exit", "no-such-notifier --now"], cwd=work, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.startswith("OK done") and p.stderr == "", p.stdout + p.stderr
    wait_for(lambda: "not found" in (run / "on_exit.log").read_text(), "the shell's complaint in on_exit.log")


def recipe(marker: str) -> str:
    """The --on-exit recipe of references/session.md that holds ``marker``, as run here."""
    text = (ROOT / "references" / "session.md").read_text()
    line = next(ln for ln in text.splitlines() if marker in ln and "--on-exit" in ln)
    return as_run(line, sys.executable).replace("--poll 30", "--poll 0.2")


def finished_run(work):
    """runs/exp1 launched and run to its sentinel: the watchdog's line is OK done."""
    run = work / "runs" / "exp1"
    argv = trainer_argv(run, records=5, dt=0.01)
    argv.remove("--no-sentinel")
    assert launch(work, run, *argv).returncode == 0
    wait_for(lambda: (run / "final_val_metrics.json").exists(), "the sentinel")
    return run


def test_the_webhook_recipe_posts_the_verdict(work):
    if not shutil.which("curl"):
        missing("curl is not installed: the webhook recipe runs it (apt-get install curl)")
    got = []

    class Hook(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            got.append((self.path, self.headers.get("content-type"),
                        self.rfile.read(int(self.headers.get("content-length", 0))).decode()))
            self.send_response(204)
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        run = finished_run(work)
        line = re.sub(r"https://hooks\.example\.com", f"http://127.0.0.1:{server.server_address[1]}",
                      recipe("curl -fsS"))
        p = subprocess.run(["bash", "-c", line], cwd=work, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        verdict = (run / "watchdog.log").read_text().strip()
        assert verdict.startswith("OK done")
        wait_for(lambda: got, "the webhook's POST")
    finally:
        server.shutdown()
        server.server_close()
    assert got == [("/training", "text/plain", verdict)]


def test_the_notification_recipe_passes_the_verdict(work, tmp_path):
    bin_dir = tmp_path / "bin"  # no desktop here: a notify-send that records what it was given
    bin_dir.mkdir()
    (bin_dir / "notify-send").write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {tmp_path / 'notified.txt'}\n")
    (bin_dir / "notify-send").chmod(0o755)
    run = finished_run(work)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    p = subprocess.run(["bash", "-c", recipe("notify-send")], cwd=work, capture_output=True, text=True, timeout=120,
                       env=env)
    assert p.returncode == 0, p.stderr
    verdict = (run / "watchdog.log").read_text().strip()
    wait_for(lambda: (tmp_path / "notified.txt").exists(), "the notification")
    assert (tmp_path / "notified.txt").read_text() == f"training run: exit 0\n{verdict}\n"


REC = {"pid": 4242, "pgid": 4242, "sid": 4242, "host": "h", "create_time": 1.5, "launched_at": 2.0,
       "argv": ["python", "-u", "train.py"], "cwd": "/w", "window_s": None, "session_id": None, "log": "/w/r/train.log",
       "run_dir": "/w/r"}


UNSET = {"stop": None, "stopped_at": None, "earlier": None, "env": None, "replaced": None, "on_exit": None,
         "engine": "local", "job_id": None, "options": None, "pid_ns": None, "boot_id": None}


@pytest.mark.parametrize("raw,expect", [
    (REC, {**REC, **UNSET}),
    ({**REC, "create_time": "yesterday", "window_s": True, "session_id": 5, "pgid": -1, "env": "X=1", "on_exit": {}},
     {**REC, **UNSET, "create_time": None, "window_s": None, "session_id": None, "pgid": None}),
    ({**REC, "stop": {"by": "stop.py"}, "stopped_at": 3}, {**REC, **UNSET, "stop": {"by": "stop.py"}, "stopped_at": 3.0}),
    ({**REC, "pid": "4242"}, None), ({**REC, "pid": 0}, None), ({**REC, "pid": True}, None),
    ({**REC, "argv": []}, None), ({**REC, "argv": ["python", 3]}, None), ({**REC, "argv": "python train.py"}, None),
    ({k: v for k, v in REC.items() if k != "launched_at"}, None), ([REC], None), ("launch", None), (None, None),
    # a job the launcher submitted (--slurm): no local pid, its job id instead
    ({**REC, "pid": None, "engine": "slurm", "job_id": "88", "options": ["--partition=debug"]},
     {**REC, **UNSET, "pid": None, "engine": "slurm", "job_id": "88", "options": ["--partition=debug"]}),
    ({**REC, "pid": None, "engine": "slurm", "job_id": 88}, None),
    # written before the engine seam: a Slurm job's id and sbatch options under their old names
    ({**REC, "pid": None, "slurm_job_id": "88", "sbatch": ["--partition=debug"]},
     {**REC, **UNSET, "pid": None, "engine": "slurm", "job_id": "88", "options": ["--partition=debug"]}),
])
def test_a_launch_record_is_read_with_its_types_checked(raw, expect):
    assert typed_launch(raw) == expect


@pytest.mark.parametrize("text", ["", "{", "[]", "null", '{"pid": 1}', "\x00" * 10])
def test_a_bad_launch_file_reads_as_none(tmp_path, text):
    (tmp_path / LAUNCH).write_text(text)
    assert read_launch(tmp_path) is None
    assert read_launch(tmp_path / "absent") is None


def test_alive_means_the_same_process_on_this_host():
    me = read_proc_start()
    here = socket.gethostname()
    base = {**REC, "pid": os.getpid(), "host": here, "create_time": me}
    assert launch_alive(base)
    assert not launch_alive({**base, "create_time": me - 100})  # a recycled pid is another process
    assert launch_alive({**base, "create_time": None})  # no start time recorded: the pid alone
    assert not launch_alive({**base, "host": here + "-elsewhere"})
    assert launch_alive({**base, **here_fields()})   # this PID namespace and boot, recorded
    if here_fields():   # another PID namespace's or boot's pid is not this one, whatever its number
        assert not launch_alive({**base, **here_fields(), "pid_ns": 1})
        assert not launch_alive({**base, **here_fields(), "boot_id": "another-boot"})
    dead = subprocess.Popen(["true"])
    dead.wait()
    assert not launch_alive({**base, "pid": dead.pid})
    assert not launch_alive(None)


def read_proc_start() -> float:
    from supervise.observe.probes import process
    return process(os.getpid()).create_time


def test_the_registry_keeps_the_launch_beside_the_watchdog(work):
    run = work / "runs" / "r"
    assert launch(work, run, *trainer_argv(run)).returncode == 0
    launched = json.loads((run / LAUNCH).read_text())
    registry.register(run, 4343, [11])
    entry = registry.latest()
    assert (entry["run_dir"], entry["watchdog_pid"], entry["pids"], entry["launch"]) == (str(run), 4343, [11], launched)
    assert stop(work, run).returncode == 0
    assert launch(work, run, *trainer_argv(run)).returncode == 0
    entry = registry.latest()
    assert entry["watchdog_pid"] == 4343 and entry["launch"] == json.loads((run / LAUNCH).read_text()) != launched
    assert [r["run_dir"] for r in registry.runs()] == [str(run)]


def test_sbatch_options_without_slurm_are_one_line(work):
    run = work / "runs" / "s"
    p = launch(work, run, *trainer_argv(run), extra=["--sbatch=--partition=debug"])
    assert p.returncode == 2 and p.stdout == "" and p.stderr.strip().endswith(
        "--sbatch needs --slurm (it is an option of the Slurm submission)"), p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and not (run / LAUNCH).exists()
    env = {**os.environ, "PATH": "/nonexistent"}
    p = subprocess.run([sys.executable, str(LAUNCHER), str(run), "--slurm", "--", "python3", "t.py"], cwd=work,
                       capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 2 and "sbatch is not on PATH" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
