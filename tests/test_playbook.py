"""The playbook: after each alarm, check-in's printed ``next:`` lines run as they are, one test per
move of the rule table (relaunch with a change, relaunch as is, watch on, fix first, stop and ask).
The trainer is tests/resumable_loop.py (a plain loop with Telemetry, a ``--resume {checkpoint}``
recipe, a save every 50 steps) started through the launcher; real processes, real signals."""
import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, attempts, end_launched, kind_of, launch, pid_alive, procs_with, run_script, wait_for
from supervise.judge.table import BY_KIND, move_for
from supervise.observe.state import read_launch
from supervise.thresholds import Thresholds
from supervise.vocabulary import AS_IS, FIX_FIRST, MOVES, RELAUNCH, STOP_ASK, WATCH_ON
from supervise.observe.volumes import VolumeState, room_line, shortfall

LOOP = ROOT / "tests" / "resumable_loop.py"
BOUND = 180  # seconds: a hang, never a slow machine
FAST = ("--dt", "0.02")


@pytest.fixture
def work(tmp_path):
    yield tmp_path
    end_launched(tmp_path)
    for pid in procs_with(str(tmp_path)):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def launched(work, run, *args):
    p = launch(work, run, sys.executable, "-u", LOOP, "--out", run, *args)
    assert p.returncode == 0, p.stderr
    return read_launch(run)


def watch(run, *flags):
    """The watchdog in the foreground, to its verdict: (exit code, its line)."""
    rc, out, err = run_script("watchdog.py", run, "--poll", "0.3", *flags, timeout=BOUND)
    return rc, out.strip() + err


def checkin(run):
    """Check-in's text, its next: lines and its notes."""
    rc, text, err = run_script("checkin.py", run)
    assert rc == 0, err
    lines = text.splitlines()
    return text, [ln[len("next: "):] for ln in lines if ln.startswith("next: ")], \
        [ln[len("note: "):] for ln in lines if ln.startswith("note: ")]


def run_lines(lines, cwd):
    """Each next: line as the agent runs it: verbatim, through bash; a watchdog line to its end.
    (exit code, output) of the last."""
    for line in lines:
        p = subprocess.run(["bash", "-c", line], cwd=cwd, capture_output=True, text=True, timeout=BOUND)
        if "/scripts/watchdog.py " not in line:
            assert p.returncode == 0, (line, p.stdout + p.stderr)
    return p.returncode, p.stdout.strip() + p.stderr


def test_every_kind_has_one_move():
    assert {r.move for r in BY_KIND.values()} == set(MOVES)
    for kind, rule in BY_KIND.items():
        move, change = move_for(kind)
        assert move in MOVES and (change is not None) == (move in (RELAUNCH, AS_IS)), kind
    assert [k for k, r in BY_KIND.items() if r.move == WATCH_ON] == ["throughput", "straggler", "gpu_idle"]
    assert {k for k, r in BY_KIND.items() if r.move == STOP_ASK} >= {"inverted_labels", "stuck_auroc", "chance_loss",
                                                                     "timeout"}


@pytest.mark.parametrize("message,move", [
    ("last error line = 'ValueError: bad row 7 in shard 3' after pid 1 died", FIX_FIRST),
    ("last error line = 'KeyError: 'label'' after pid 1 died", FIX_FIRST),
    ("last error line = 'RuntimeError: CUDA error: device-side assert triggered' after pid 1 died", FIX_FIRST),
    ("last error line = 'RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1191, unhandled system error' after pid 1 died",
     AS_IS),
    ("last error line = 'RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer'",
     AS_IS),
    ("last error line = 'RuntimeError: CUDA error: an illegal memory access was encountered' after pid 1 died", AS_IS),
    ("last error line = 'OSError: [Errno 116] Stale file handle' after pid 1 died", AS_IS),
    ("root cause = 'rank 1 (local_rank 1, pid 42 on vm) exitcode -9 (SIGKILL)' (first observed failure)", AS_IS),
])
def test_a_crash_is_fixed_first_unless_the_environment_failed(message, move):
    assert move_for("crash", f"ANOMALY crash: {message} at step 5. Fix it.")[0] == move


def test_disk_relaunches_only_once_there_is_room():
    th = Thresholds()
    full = VolumeState("/data", roles=("checkpoints",), free=10 << 20, total=100 << 30)
    roomy = VolumeState("/data", roles=("checkpoints",), free=20 << 30, total=100 << 30)
    assert shortfall([roomy], th, save=1 << 30) is None and room_line([roomy], th, save=1 << 30) is None
    v, need = shortfall([full], th, save=1 << 30)
    assert v is full and need == pytest.approx(64e6 + 1.5 * 2**30 - (10 << 20))   # the floor, one save x the margin
    assert room_line([full], th, save=1 << 30) == "free at least 1.7 GB on /data (checkpoints) (10.5 MB free now)"


def test_relaunch_with_a_change_nan(work):
    run = work / "run"
    launched(work, run, "--nan-at", "60", *FAST)
    rc, line = watch(run)
    assert rc == 7 and kind_of(line) == "nan", line
    text, nxt, _ = checkin(run)
    assert len(nxt) == 2 and " --replace " in nxt[0] and "--lr=0.005 --resume " in nxt[0], text
    rc, line = run_lines(nxt, work)
    assert rc == 0 and line.startswith("OK done: final_val_metrics.json written at step 300/300 (attempt 2)"), line
    assert {r["lr"] for r in attempts(run)[1] if "lr" in r} == {0.005}


def test_relaunch_as_is_after_an_environment_failure(work):
    run = work / "run"
    nccl = "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1191, unhandled system error"
    launched(work, run, "--raise-at", "120", "--raise-once", "--error", nccl, *FAST)
    rc, line = watch(run)
    assert rc == 7 and kind_of(line) == "fatal" and "NCCL error" in line, line   # Telemetry records the exception
    text, nxt, _ = checkin(run)
    assert len(nxt) == 2 and "--lr" not in nxt[0] and nxt[0].endswith(f"--resume {run}/checkpoints/step-100.pt"), text
    rc, line = run_lines(nxt, work)
    assert rc == 0 and line.startswith("OK done: final_val_metrics.json written at step 300/300 (attempt 2)"), line
    a1, a2 = attempts(run)
    assert next(r["step"] for r in a2 if "loss" in r) == 110 and a2[0]["argv"][-2:] == ["--resume", str(
        run / "checkpoints" / "step-100.pt")]


def test_fix_first_after_the_scripts_own_exception(work):
    run = work / "run"
    launched(work, run, "--raise-at", "120", "--error", "ValueError: bad row 7 in shard 3", *FAST)
    rc, line = watch(run)
    assert rc == 7 and kind_of(line) == "fatal" and "ValueError: bad row 7 in shard 3" in line, line
    text, nxt, _ = checkin(run)
    assert nxt == [nxt[0]] and nxt[0].startswith("no relaunch line: fix first: the error is the script's own (not the "
                                                 "machine's, the network's or a signal's), so the same command fails "
                                                 "the same way: "), text
    assert "references/recovery.md (fatal)" in nxt[0]
    assert len(read_launch(run).get("earlier") or []) == 0  # nothing was relaunched


def test_watch_on_after_a_throughput_drop_keeps_the_trainer(work):
    run = work / "run"
    rec = launched(work, run, "--steps", "700", "--slow-from", "150", "--slow-dt", "0.08", *FAST)
    flags = ("--throughput-window", "1s", "--baseline-steps", "100", "--warmup-steps", "10")
    rc, line = watch(run, *flags)
    assert rc == 7 and kind_of(line) == "throughput", line
    text, nxt, notes = checkin(run)
    assert len(nxt) == 1 and nxt[0].endswith(" --from-now") and all(f in nxt[0] for f in flags), text
    assert any(n.startswith("keep the trainer running: a relaunch does not fix throughput") for n in notes), text
    control = nxt[0].removesuffix(" --from-now")   # the same watchdog judging the same old records again
    rc, line = run_lines([control], work)
    assert rc == 7 and kind_of(line) == "throughput", line
    rc, line = run_lines(nxt, work)
    assert rc == 0 and line.startswith("OK done: final_val_metrics.json written at step 700/700"), line
    assert read_launch(run)["pid"] == rec["pid"] and len(attempts(run)) == 1   # the same trainer, never relaunched


def test_watch_on_after_a_stopped_process_resumes_it(work):
    run = work / "run"
    rec = launched(work, run, "--steps", "400", *FAST)
    wait_for(lambda: any(r.get("step", 0) >= 50 for r in attempts(run)[0]) if attempts(run) else None, "step 50",
             timeout=BOUND)
    os.kill(rec["pid"], signal.SIGSTOP)
    rc, line = watch(run, "--max-stall", "2s")
    assert rc == 7 and kind_of(line) == "stall" and "state = stopped" in line, line
    text, nxt, _ = checkin(run)
    assert nxt[0] == f"kill -CONT {rec['pid']}" and nxt[1].endswith("--max-stall 2s --from-now") and len(nxt) == 2, text
    rc, line = run_lines(nxt, work)
    assert rc == 0 and line.startswith("OK done: final_val_metrics.json written at step 400/400"), line
    assert len(attempts(run)) == 1


def test_stop_and_ask_when_the_model_learns_nothing(work):
    run = work / "runs" / "exp1"
    rec = launched(work, run, "--steps", "100000", "--auroc", "0.5", *FAST)
    rc, line = watch(run, "--min-auroc-step", "100")
    assert rc == 7 and kind_of(line) == "stuck_auroc", line
    text, nxt, notes = checkin(run)
    fresh = work / "runs" / "exp1-fresh"
    assert len(nxt) == 3 and nxt[0].endswith(f"/scripts/stop.py {run}"), text
    assert f"/scripts/launch.py {fresh} -- " in nxt[1] and "--resume" not in nxt[1] and f"--out {fresh}" in nxt[1], text
    assert nxt[2].endswith(f"/scripts/watchdog.py {fresh} --poll 0.3 --min-auroc-step 100"), text
    assert any(n.startswith("stop and ask the user: a relaunch does not fix stuck_auroc") for n in notes), text
    assert any(f"the last two lines start the same command over in {fresh}: run them only once the user approves" in n
               for n in notes), text
    rc, line = run_lines(nxt, work)   # the user approved
    assert read_launch(run)["stopped_at"] and not pid_alive(rec["pid"])   # the old trainer was stopped first
    assert rc == 7 and kind_of(line) == "stuck_auroc", line   # the same command learns nothing there either
    (a,) = attempts(fresh)
    assert a[0]["attempt"] == 1 and next(r["step"] for r in a if "loss" in r) == 10 and read_launch(fresh)["pid"] != \
        rec["pid"]


def test_a_trainer_started_by_hand_into_a_launched_folder_is_the_run(work):
    """The launcher ran the folder to its end; the same command started again by hand (``>>
    train.log``) is the run's process, not the launcher's old attempt found gone."""
    run = work / "run"
    launched(work, run, "--steps", "50", *FAST)
    wait_for(lambda: (run / "final_val_metrics.json").exists() and not procs_with(str(LOOP)), "the first run's end",
             timeout=BOUND)
    cmd = shlex.join([sys.executable, "-u", str(LOOP), "--out", str(run), "--steps", "800", *FAST])   # longer than --rank-grace
    hand = subprocess.Popen(["bash", "-c", f"{cmd} >> {shlex.quote(str(run / 'train.log'))} 2>&1"], cwd=work,
                            start_new_session=True)
    try:
        rc, line = watch(run)
        assert rc == 0 and line.startswith("OK done: final_val_metrics.json written at step 800/800"), line
        assert len(attempts(run)) == 2 and attempts(run)[1][0]["pid"] != read_launch(run)["pid"]
    finally:
        hand.wait(timeout=BOUND)


def test_an_on_exit_wake_with_no_session_id_is_refused(work):
    run = work / "run"
    launched(work, run, "--steps", "30", *FAST)
    env = {k: v for k, v in os.environ.items() if k not in ("CLAUDE_CODE_SESSION_ID", "CLAUDE_SESSION_ID")}
    wake = 'claude --resume "$SUPERVISE_SESSION_ID" -p "$SUPERVISE_VERDICT"'
    rc, out, err = run_script("watchdog.py", run, "--on-exit", wake, env=env)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, out + err
    assert "no session id is known" in err and "pass --session-id to the launcher" in err, err
    rc, out, err = run_script("watchdog.py", run, "--poll", "0.3", "--on-exit", "true",
                              env={**env, "CLAUDE_CODE_SESSION_ID": "abc"}, timeout=BOUND)   # a known session, or none named
    assert rc == 0 and out.startswith("OK done"), out + err
    rc, out, err = run_script("watchdog.py", run, "--poll", "0.3", "--on-exit", wake,
                              env={**env, "CLAUDE_CODE_SESSION_ID": "abc"}, timeout=BOUND)
    assert rc == 0 and out.startswith("OK done"), out + err


def hf_style_nan_run(run: Path, argv: list) -> None:
    """A Trainer-style run folder: the start record with its recipe and flags, checkpoint-20 and
    checkpoint-40, a NaN at step 35: checkpoint-40 is written after it (poisoned: skipped)."""
    out = run / "out"
    for n in (20, 40):
        d = out / f"checkpoint-{n}"
        d.mkdir(parents=True)
        (d / "model.safetensors").write_bytes(SAFETENSORS)
        (d / "trainer_state.json").write_text("{}")
    start = {"event": "start", "t": 0.0, "time": 1e9, "pid": 1, "host": "elsewhere", "run_id": "a" * 32, "attempt": 1,
             "argv": argv, "cwd": str(run.parent), "python": sys.executable, "total_steps": 100, "task": "lm",
             "vocab_size": 1000, "resume": ["--resume_from_checkpoint", "{checkpoint}"], "checkpoint_dir": str(out),
             "flags": {"--learning_rate": 5e-05}}
    recs = [start] + [{"step": s, "t": s / 10, "loss": 5.0 - s / 100, "lr": 5e-05} for s in range(5, 35, 5)]
    recs.append({"step": 35, "t": 3.5, "loss": None, "lr": 5e-05})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


_HEADER = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
SAFETENSORS = len(_HEADER).to_bytes(8, "little") + _HEADER + b"\0" * 4


def long_command(run: Path, chars: int) -> list:
    argv = ["run_clm.py", "--output_dir", str(run / "out"), "--learning_rate", "5e-05"]
    i = 0
    while len(shlex.join(argv)) < chars:
        argv += [f"--dataset_config_name_{i}", f"wikitext-103-raw-v1-shard-{i:04d}"]
        i += 1
    return argv


def test_both_next_lines_whole_after_a_nan_with_a_skipped_checkpoint_and_a_900_char_command(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    argv = long_command(run, 900)
    hf_style_nan_run(run, argv)
    text, nxt, notes = checkin(run)
    assert text.startswith("ANOMALY nan") and len(nxt) == 2, text
    assert f"resume from: {run}/out/checkpoint-20" in text and "checkpoint-40" in text, text   # the skipped one named
    words = shlex.split(nxt[0])
    assert words[words.index("--") + 3:] == [*argv[:4], "2.5e-05", *argv[5:], "--resume_from_checkpoint",
                                             f"{run}/out/checkpoint-20"], text
    assert nxt[1].endswith(f"/scripts/watchdog.py {run}"), text
    assert len(text) > 1500   # the budget gave way to the next: lines, never the other way round


def test_a_line_longer_than_the_whole_budget_goes_to_a_file(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    argv = long_command(run, 2000)
    hf_style_nan_run(run, argv)
    text, nxt, _ = checkin(run)
    assert nxt[0] == f"bash {run}/next-1.sh", text
    script = (run / "next-1.sh").read_text().splitlines()
    words = shlex.split(script[-1])
    assert script[0] == "#!/bin/sh" and words[words.index("--") + 3:][-2:] == ["--resume_from_checkpoint",
                                                                               f"{run}/out/checkpoint-20"]
    assert subprocess.run(["bash", "-n", run / "next-1.sh"]).returncode == 0


MOVE_ROWS = {RELAUNCH: "relaunch with a change", "as_is": "relaunch as is", WATCH_ON: "watch on",
             FIX_FIRST: "fix first", STOP_ASK: "stop and ask"}


def test_recovery_md_says_each_kinds_move_from_the_table():
    text = (ROOT / "references" / "recovery.md").read_text()
    rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines() if line.startswith("| ")}
    for kind, rule in BY_KIND.items():
        row = rows[MOVE_ROWS[rule.move]]
        assert f"`{kind}`" in row.split(" | ")[2], (kind, rule.move, row)


def test_a_heartbeat_url_is_pinged_while_the_watchdog_lives_and_with_its_verdict(work):
    import http.server
    import threading
    seen = []

    class Ping(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            seen.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"OK")

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ping)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        run = work / "run"
        launched(work, run, "--steps", "150", *FAST)
        url = f"http://127.0.0.1:{server.server_port}/ping/abc"
        rc, line = watch(run, "--heartbeat-url", url)
        assert rc == 0 and line.startswith("OK done"), line
        assert seen[0] == "/ping/abc" and seen[-1] == "/ping/abc/0" and len(seen) >= 2, seen
    finally:
        server.shutdown()
        server.server_close()
    # a service that is gone: one line, and the watch goes on to its verdict
    run = work / "run2"
    launched(work, run, "--steps", "150", *FAST)
    rc, out, err = run_script("watchdog.py", run, "--poll", "0.3", "--heartbeat-url",
                              f"http://127.0.0.1:{server.server_port}/gone", timeout=BOUND)
    assert rc == 0 and out.startswith("OK done"), out + err
    assert err.startswith(f"watchdog.py: warning: heartbeat ping http://127.0.0.1:{server.server_port}/gone failed ("), err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 2, err   # said once per kind of failure
    rc, out, err = run_script("watchdog.py", run, "--heartbeat-url", "hc-ping.com/x")
    assert rc == 2 and "is not an http(s) URL" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("error,move", [
    ("import not_a_module_of_this_machine", "fix first"),
    ("raise OSError(5, 'Input/output error', '/mnt/nfs/shard-3.bin')", "relaunch"),
])
def test_a_launch_that_dies_before_its_start_record_is_judged_from_launch_json(work, error, move):
    """No start record: the command and its folder come from launch.json, never 'no argv/cwd'."""
    script = work / "train.py"
    script.write_text(f"{error}\n")
    run = work / "run"
    p = launch(work, run, sys.executable, "-u", script, "--out", run)
    assert p.returncode == 0, p.stderr
    rc, line = watch(run)
    assert rc == 7 and kind_of(line) in ("crash", "dead"), line
    text, nxt, _ = checkin(run)
    assert "no argv/cwd" not in text, text
    if move == "fix first":
        assert len(nxt) == 1 and nxt[0].startswith("no relaunch line: fix first: "), text
    else:
        assert len(nxt) == 2 and shlex.split(nxt[0])[-3:] == [str(script), "--out", str(run)], text
        assert " --replace -- " in nxt[0] and nxt[1].endswith(f"/scripts/watchdog.py {run} --poll 0.3"), text
