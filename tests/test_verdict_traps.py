"""The traps real runs set for the verdict engine, each with real processes launched through a
shell as users launch them (output appended to RUN_DIR/train.log, no --pid): a relaunch into an
old folder, a crash before the first record, a SIGKILL with no start record, bad records, bad
files, signals; and check-in agreeing with the watchdog."""
import json
import os
import signal
import time

import pytest

from conftest import assert_checkin_agrees, fake_line, kind_of, polls, read_json, run_script, start_script, \
    wait_for_lines, wait_for_polls

FAST = ("--poll", "0.2")


def finished_run(shells, run_dir, *extra):
    """A folder that holds a completed run: metrics, sentinel, log."""
    p = shells(fake_line(run_dir, "--records", 10, "--dt", 0.01, *extra))
    assert p.wait(timeout=60) == 0
    assert (run_dir / "final_val_metrics.json").exists()


@pytest.mark.parametrize("identity", ["run_id", "seed_format_truncating"])
def test_relaunch_into_a_finished_folder_is_not_ok_done(identity, tmp_path, shells):
    run = tmp_path / "run"
    if identity == "run_id":
        finished_run(shells, run, "--run-id", "old")
        new = ("--run-id", "new")
    else:
        finished_run(shells, run, "--no-start")
        (run / "metrics.jsonl").write_text("")  # the seed's callback truncates at start
        new = ("--no-start",)
    time.sleep(1.1)  # the new records are written at least a second after the old sentinel
    shells(fake_line(run, "--records", 60, "--dt", 0.05, "--nan-at", 100, "--no-sentinel", "--linger", 60, *new))
    rc, out, err = run_script("watchdog.py", run, *FAST, timeout=60)
    assert rc == 7 and kind_of(out) == "nan", out + err


def test_old_fatal_is_history_for_a_healthy_relaunch(tmp_path, shells):
    run = tmp_path / "run"
    p = shells(fake_line(run, "--records", 20, "--dt", 0.01, "--fatal-at", 50, "--run-id", "old"))
    p.wait(timeout=60)
    shells(fake_line(run, "--records", 20, "--dt", 0.03, "--run-id", "new"))
    rc, out, err = run_script("watchdog.py", run, *FAST, timeout=60)
    assert rc == 0 and out.startswith("OK done: final_val_metrics.json written at step 200/200"), out + err


def test_crash_before_the_first_record_is_named_within_seconds(tmp_path, shells):
    """A bad flag, a missing data file: the traceback is in train.log at once; the startup grace
    (300 s by default) must not delay the verdict."""
    run = tmp_path / "run"
    bad = tmp_path / "bad_train.py"
    bad.write_text("import sys, time\ntime.sleep(1.0)\nraise FileNotFoundError('data/train.jsonl')\n")
    shells(fake_line(run, script=bad))
    t0 = time.time()
    rc, out, err = run_script("watchdog.py", run, "--poll", "0.5", timeout=120)
    assert rc == 7 and kind_of(out) == "crash", out + err
    assert "FileNotFoundError: data/train.jsonl" in out
    assert time.time() - t0 < 60  # not the 300 s startup grace


def test_crash_before_the_watchdog_started_is_named_too(tmp_path, shells):
    run = tmp_path / "run"
    bad = tmp_path / "bad_train.py"
    bad.write_text("raise SystemExit('error: unrecognized arguments: --lrr')\n")
    p = shells(fake_line(run, script=bad))
    p.wait(timeout=60)
    (run / "train.log").write_text("Traceback (most recent call last):\n  File \"t.py\"\nKeyError: 'label'\n")
    rc, out, err = run_script("watchdog.py", run, "--poll", "0.5", "--orphan-grace", "2", timeout=120)
    assert rc == 7 and kind_of(out) == "crash" and "KeyError: 'label'" in out, out + err


def test_sigkill_without_a_start_record_is_dead_not_a_late_stall(tmp_path, shells):
    """The seed's format has no pid anywhere: the process writing train.log is the run."""
    run = tmp_path / "run"
    p = shells(fake_line(run, "--records", 5000, "--dt", 0.03, "--no-start"))
    wd = start_script("watchdog.py", run, "--poll", "0.5", "--max-stall", "300")
    wait_for_lines(run / "metrics.jsonl", 3)
    wait_for_polls(run, polls(run) + 2, wd)  # a whole poll since the records came: it follows the writer
    t0 = time.time()
    os.killpg(p.pid, signal.SIGKILL)
    out, err = wd.communicate(timeout=60)
    assert wd.returncode == 7 and kind_of(out) == "dead", out + err
    assert "writes train.log" in out
    assert time.time() - t0 < 20
    # check-in, run next, agrees: the trainer was a process nobody launched and its records look fresh,
    # but the watchdog saw it die
    facts = assert_checkin_agrees(run, out.strip())
    assert facts["watchdog"]["verdict"] == "ANOMALY dead" and not facts["watchdog"]["alive"]


def test_sigstop_without_a_start_record_is_a_stall_at_once(tmp_path, shells):
    run = tmp_path / "run"
    p = shells(fake_line(run, "--records", 5000, "--dt", 0.03, "--no-start"))
    wd = start_script("watchdog.py", run, "--poll", "0.5", "--max-stall", "300")
    wait_for_lines(run / "metrics.jsonl", 3)
    wait_for_polls(run, polls(run) + 2, wd)  # a whole poll since the records came: it follows the writer
    os.killpg(p.pid, signal.SIGSTOP)
    try:
        out, err = wd.communicate(timeout=60)
    finally:
        os.killpg(p.pid, signal.SIGCONT)
    assert wd.returncode == 7 and kind_of(out) == "stall" and " state = stopped != running at step " in out, out + err


BAD_RECORDS = [
    '{"step": 1e400, "t": 1, "loss": 0.5}', '{"step": NaN, "t": 1, "loss": 0.5}',
    '{"step": "abc", "t": 1, "loss": 0.5}', '{"step": null, "t": 1, "loss": 0.5}',
    '{"step": "x", "t": 1, "FATAL_": 1}', '{"step": null, "eval_auroc": 0.9}', '{"t": 3, "loss": 0.2}',
    '{"event": "start", "t": 0, "pid": 1e400, "num_labels": "x"}',
    '{"event": "start", "t": 0, "pid": "abc", "num_labels": 1e400, "batch_size": "8"}',
    "[" * 100000 + "]" * 100000, '{"a": ' * 50000 + "1" + "}" * 50000, "\x00\xff garbage",
]


def test_the_watchdog_outlives_every_bad_record(tmp_path, trainer):
    """One bad record used to kill the watchdog; now each is counted and skipped."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("\n".join(BAD_RECORDS) + "\n")
    trainer(run, "--records", 20, "--dt", 0.03)
    rc, out, err = run_script("watchdog.py", run, *FAST, timeout=60)
    assert rc == 0 and out.startswith("OK done"), out + err
    assert "Traceback" not in err
    state = read_json(run / "watchdog.json")
    assert state["records"]["bad_lines"] >= 8


def test_a_fatal_with_a_string_step_is_still_fatal(tmp_path, trainer):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"event":"start","t":0}\n{"step": "x", "t": 1, "FATAL": 42}\n')
    rc, out, err = run_script("watchdog.py", run, *FAST, "--orphan-grace", "30", timeout=60)
    assert rc == 7 and out.startswith("ANOMALY fatal: FATAL = '42' written at step 0"), out + err


@pytest.mark.parametrize("content", ["", "{", "[1, 2]", '"done"'])
def test_a_sentinel_still_being_written_is_not_done(content, tmp_path, trainer):
    run = tmp_path / "run"
    t = trainer(run, "--records", 2000, "--dt", 0.03, "--no-sentinel", "--linger", 60)
    t.wait_for_line(run / "metrics.jsonl", 3)
    (run / "final_val_metrics.json").write_text(content)
    rc, out, err = run_script("watchdog.py", run, *FAST, "--hard-timeout", "3", timeout=60)
    assert rc == 7 and kind_of(out) == "timeout", out + err
    os.unlink(run / "watchdog.json")  # check-in's own view
    rc, out, _ = run_script("checkin.py", run)
    assert out.startswith("RUNNING healthy"), out


@pytest.mark.parametrize("make", ["fifo", "dev_zero"])
def test_a_blind_watchdog_says_so(make, tmp_path):
    """Never a hang, never a healthy look: exit 2 at start; a blind anomaly when it happens later."""
    run = tmp_path / "run"
    run.mkdir()
    target = run / "metrics.jsonl"
    if make == "fifo":
        os.mkfifo(target)
    else:
        target.symlink_to("/dev/zero")
    rc, out, err = run_script("watchdog.py", run, *FAST, timeout=30)
    assert rc == 2 and "not a regular file" in err and len(err.strip().splitlines()) == 1, err
    rc, out, err = run_script("checkin.py", run, timeout=30)
    lines = out.splitlines()
    assert rc == 0 and lines[0].startswith(f"ANOMALY blind  {run}") and kind_of(lines[1]) == "blind", out + err
    assert "not a regular file" in lines[1], out


def test_blind_watchdog_says_so(tmp_path, trainer):
    run = tmp_path / "run"
    t = trainer(run, "--records", 2000, "--dt", 0.03, "--no-sentinel", "--linger", 60)
    t.wait_for_line(run / "metrics.jsonl", 3)
    wd = start_script("watchdog.py", run, *FAST)
    wait_for_polls(run, 2, wd)  # it reads the file: the swap happens under a running watch
    os.unlink(run / "metrics.jsonl")
    os.mkfifo(run / "metrics.jsonl")
    out, err = wd.communicate(timeout=30)
    assert wd.returncode == 7 and out.startswith("ANOMALY blind: read error = "), out + err
    assert_checkin_agrees(run, out.strip())


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_stop_signals_give_one_line_and_save_the_state(sig, tmp_path, trainer):
    run = tmp_path / "run"
    t = trainer(run, "--records", 2000, "--dt", 0.03, "--no-sentinel")
    t.wait_for_line(run / "metrics.jsonl", 3)
    wd = start_script("watchdog.py", run, *FAST)
    wait_for_polls(run, 2, wd)
    wd.send_signal(sig)
    if sig == signal.SIGINT:
        wd.send_signal(sig)  # a second Ctrl-C while stopping changes nothing
    out, err = wd.communicate(timeout=30)
    assert wd.returncode == 0 and out.startswith(f"STOPPED: watchdog ended by {signal.Signals(sig).name}"), out + err
    assert "Traceback" not in err
    assert read_json(run / "watchdog.json")["state"] == "stopped"


@pytest.mark.parametrize("args,needle", [
    (("",), "run directory"), (("{dir}", "--sentinel", ""), "not a file name"),
    (("{dir}", "--sentinel", "../x"), "not a file name"), (("{dir}", "--sentinel", "/tmp/x"), "not a file name"),
    (("{dir}", "--min-auroc", "nan"), "finite"), (("{dir}", "--poll", "9" * 20), "30 days"),
    (("{dir}", "--sustain", "9" * 20), "too"), (("{dir}", "--max-stall", "inf"), "duration"),
])
def test_bad_watchdog_usage_is_one_line_exit_2(args, needle, tmp_path):
    rc, out, err = run_script("watchdog.py", *[a.format(dir=tmp_path) for a in args], timeout=30)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and needle in err, err


AGREE = [
    ("nan", ("--records", 40, "--nan-at", 120, "--no-sentinel", "--linger", 60), "nan"),
    ("fatal", ("--records", 40, "--fatal-at", 100), "fatal"),
    ("chance", ("--records", 60, "--loss", 0.69, "--no-sentinel", "--linger", 60), "chance_loss"),
    ("inverted", ("--records", 60, "--auroc", 0.12, "--no-sentinel", "--linger", 60), "inverted_labels"),
    ("diverged", ("--records", 60, "--loss-from", 200, "--loss-value", 2e4, "--no-sentinel", "--linger", 60), "diverged"),
    ("crash", ("--records", 40, "--crash-at", 100), "crash"),
    ("oom", ("--records", 40, "--oom-at", 100), "oom"),
    ("exit", ("--records", 40, "--exit-at", 150), "dead"),
    ("healthy", ("--records", 20), None),
]


@pytest.mark.parametrize("name,args,kind", AGREE, ids=[a[0] for a in AGREE])
def test_checkin_without_a_watchdog_gives_the_watchdogs_kind(name, args, kind, tmp_path, shells):
    run = tmp_path / "run"
    shells(fake_line(run, "--dt", 0.03, *args))
    rc, out, err = run_script("watchdog.py", run, *FAST, timeout=60)
    assert rc == (7 if kind else 0) and (kind_of(out) == kind if kind else out.startswith("OK done: ")), out + err
    os.unlink(run / "watchdog.json")  # check-in must reach the same verdict on its own
    rc, out, err = run_script("checkin.py", run, "--json")
    facts = json.loads(out)
    assert facts["verdict"] == (f"ANOMALY {kind}" if kind else "DONE"), out


def test_checkin_prints_the_relaunch_line_and_the_watchdog_line(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    start = {"event": "start", "t": 0, "pid": 999999, "run_id": "a", "attempt": 1, "cwd": str(tmp_path),
             "argv": ["train.py", "--out", str(run), "--lr", "0.01"], "resume": ["--resume"]}
    step = '{"step": %d, "t": 1, "loss": %s, "lr": 0.01, "grad_norm": 1.0, "sps": 10}\n'
    (run / "metrics.jsonl").write_text(json.dumps(start) + "\n" + step % (10, "0.5") + step % (20, "NaN"))
    rc, out, err = run_script("checkin.py", run)
    lines = out.splitlines()
    assert lines[0].startswith(f"ANOMALY nan  {run}") and kind_of(lines[1]) == "nan", out
    nxt = [ln[len("next: "):] for ln in lines if ln.startswith("next: ")]
    assert len(nxt) == 2, out
    assert nxt[0].startswith(f"cd {tmp_path} && ") and "--lr 0.005" in nxt[0] and "--resume" in nxt[0], nxt[0]
    assert f"/scripts/launch.py {run} --replace -- " in nxt[0] and "\n" not in nxt[0]  # through the launcher
    assert "watchdog.py" in nxt[1] and str(run) in nxt[1]


def test_three_relaunches_from_the_same_checkpoint_are_no_progress(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    step = '{"step": %d, "t": 1, "loss": 0.5, "lr": 0.01, "grad_norm": 1.0, "sps": 10}\n'

    def start(attempt):  # a writer that declares how to relaunch: only no_progress can withhold the line
        return json.dumps({"event": "start", "t": 0, "attempt": attempt, "argv": ["train.py", "--out", str(run)],
                           "cwd": str(tmp_path), "resume": ["--resume"]}) + "\n"
    text = start(1) + step % 10 + step % 500
    for attempt in (2, 3, 4):  # each relaunch resumed at the same checkpoint and failed (its FATAL) past it, in the
        # environment (a relaunch as is: a bug of the script's own is fixed first, never relaunched at all)
        text += start(attempt) + step % 510 + '{"step": 515, "t": 1, "FATAL": "RuntimeError: NCCL error: unhandled system error"}\n'
    (run / "metrics.jsonl").write_text(text)
    rc, out, err = run_script("watchdog.py", run, *FAST, "--orphan-grace", "30", timeout=60)
    assert rc == 7 and out.startswith("ANOMALY no_progress: relaunches without the checkpoint step moving = 3 >= 3 "
                                      "(the last ended in fatal) at step 510"), out + err
    facts = assert_checkin_agrees(run, out.strip())
    assert [n for n in facts["next"] if n.startswith("no relaunch line: fix first: Stop relaunching")], facts
