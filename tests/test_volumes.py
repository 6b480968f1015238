"""A volume of the run filling with files the project cannot parse (random-bytes ``.pt`` files, a
log, a rotating writer), on real tmpfs volumes mounted here (root, as test_checkpoints.py's disk
tests), and the free-space rule on scripted readings (a clock of its own: nothing here depends
on the machine's speed)."""
import dataclasses
import os
from collections import namedtuple
from pathlib import Path

import pytest

from conftest import ROOT, assert_checkin_agrees, kind_of, run_script, start_script, wait_for
from test_checkpoints import tmpfs  # noqa: F401  (the fixture: a real tmpfs of a given size)
from supervise.judge.table import judge
from supervise.observe.logs import enospc_line
from supervise.observe.observation import Observation, Proc, Records
from supervise.thresholds import Thresholds
from supervise.observe.volumes import VolumeState, VolumeWatch, rule_ahead, rule_full

WRITER = ROOT / "tests" / "disk_writer.py"
MB = 1_000_000
Vfs = namedtuple("Vfs", "f_bavail f_frsize f_blocks")


# ---------------------------------------------------------------------------------------------
# The rule on scripted readings
# ---------------------------------------------------------------------------------------------
def scripted(tmp_path, frees, total, dt, th=Thresholds()):
    """Poll a VolumeWatch over ``frees`` (bytes free per reading, ``dt`` s apart, on a statvfs of
    our own for tmp_path's volume): (index of the first reading with an anomaly, its message) or
    (None, None)."""
    it = {"free": frees[0]}
    watch = VolumeWatch(statvfs=lambda p: Vfs(it["free"], 1, total))
    for i, free in enumerate(frees):
        it["free"] = int(free)
        found = rule_ahead(watch.poll(1000.0 + i * dt, [(str(tmp_path), "run folder")], th), th, i)
        if found is not None:
            return i, found.message
    return None, None


def staircase(start, write, every, n, dt):
    """free space falling by ``write`` every ``every`` s, read every ``dt`` s, ``n`` readings."""
    return [start - write * int(i * dt // every) for i in range(n)]


def rotating(ceiling, write, every, gone_after, n, dt):
    """a writer that saves ``write`` bytes every ``every`` s and deletes the oldest ``gone_after`` s later."""
    return [ceiling - (write if (i * dt) % every < gone_after else 0) for i in range(n)]


def long_saves(ceiling, write, every, lasts, first, n, dt):
    """a rotating writer whose save of ``write`` bytes takes ``lasts`` s (several readings), the
    first at ``first`` s, then one every ``every`` s; the oldest deleted once a save is written."""
    out = []
    for i in range(n):
        t = i * dt - first
        into = t % every if t >= 0 else lasts
        out.append(ceiling - (write * into / lasts if into < lasts else 0))
    return out


def test_a_staircase_of_writes_fires_before_the_write_that_would_fail(tmp_path):
    frees = staircase(50 * MB, 4 * MB, 2.0, 125, 0.2)   # full at 25 s
    i, said = scripted(tmp_path, frees, 50 * MB, 0.2)
    assert i is not None and frees[i] >= 8 * MB, (i, said)   # two writes or more still fit
    assert said.startswith("ANOMALY disk: time to full = ") and " (run folder): " in said and " MB/s" in said, said


def test_a_steady_log_fires_before_the_volume_is_full(tmp_path):
    frees = [50 * MB - 2 * MB * i * 0.2 for i in range(125)]
    i, said = scripted(tmp_path, frees, 50 * MB, 0.2)
    assert i is not None and frees[i] > 10 * MB, (i, said)
    assert "falling 2.0 MB/s" in said


def test_slow_saves_fire_on_the_next_write_that_will_not_fit(tmp_path):
    """10 GB saves every 40 min (polls every 30 s): too far apart for a slope over the 30 min
    window; the second one, with nothing freed, leaves less than 1.5 saves free."""
    frees = staircase(32e9, 10e9, 2400.0, 240, 30.0)
    i, said = scripted(tmp_path, frees, 100e9, 30.0)
    assert i is not None and frees[i] == 12e9, (i, said)
    assert said.startswith("ANOMALY disk: free space = 12 GB < next write 10 GB x 1.5 margin on ") \
        and "(2 writes of up to 10 GB, none freed since)" in said and "before the next write fails" in said, said


@pytest.mark.parametrize("frees, total, dt", [
    (rotating(38 * MB, 6 * MB, 1.0, 0.3, 300, 0.2), 50 * MB, 0.2),     # saves deleted by the rotation
    (rotating(12 * MB, 6 * MB, 2.0, 0.4, 300, 0.2), 50 * MB, 0.2),     # a tight rotation: 2 saves free
    (rotating(20e9, 10e9, 2400.0, 60.0, 500, 30.0), 100e9, 30.0),      # slow saves, each deleted after a minute
    (long_saves(25e9, 10e9, 1200.0, 240.0, 600.0, 600, 30.0), 100e9, 30.0),   # 4 min saves over 8 polls
    ([40 * MB - (20 * MB if 10 <= i < 20 else 0) for i in range(200)], 50 * MB, 0.2),   # one burst, deleted
    ([40 * MB - (20 * MB if 10 <= i < 20 or 60 <= i < 70 else 0) for i in range(200)], 50 * MB, 0.2),   # twice
    (staircase(900e9, 4 * MB, 2.0, 600, 0.2), 1e12, 0.2),              # plenty of free space
    ([30 * MB] * 200, 50 * MB, 0.2),                                   # nothing moves
], ids=["rotation", "tight-rotation", "slow-rotation", "long-saves", "burst-then-deleted", "two-bursts-deleted", "plenty",
        "static"])
def test_no_false_disk(tmp_path, frees, total, dt):
    i, said = scripted(tmp_path, frees, total, dt)
    assert i is None, said


def test_the_floor_and_the_death_on_a_full_volume():
    th = Thresholds()
    full = VolumeState("/v", ("run folder",), free=0, total=50 * MB)
    roomy = VolumeState("/v", ("run folder",), free=30 * MB, total=50 * MB)
    low = VolumeState("/v", ("checkpoints",), free=8 * MB, total=50 * MB, writes=((1.0, 10 * MB),))
    assert rule_full([roomy], th, 5, "pid 1 died") is None
    said = rule_full([roomy, full], th, 5, "pid 1 (start record) died", other_error=True).message
    assert said.startswith("ANOMALY disk: free space = 0 B < 5.0 MB floor on /v (run folder) "
                           "after pid 1 (start record) died at step 5. The volume is full: "), said
    assert rule_full([low], th, 5, "pid 1 died").message.startswith(
        "ANOMALY disk: free space = 8.0 MB < one write 10 MB on /v (checkpoints) after pid 1 died")
    assert rule_full([low], th, 5, "pid 1 died", other_error=True) is None   # the log names another error
    assert rule_ahead([full], th, 5).message.startswith(
        "ANOMALY disk: free space = 0 B < 5.0 MB floor on /v (run folder) while the run "
        "writes there at step 5. ")
    big = VolumeState("/data", ("run folder",), free=10 * MB, total=10**12)
    assert "< 64 MB floor on /data" in rule_ahead([big], th, 5).message
    assert rule_ahead([big], Thresholds(disk_free_min=5), 5) is None


def test_judge_names_a_trainer_dead_on_a_full_volume_disk_not_dead():
    th = Thresholds()
    gone = Proc(4242, "zombie", "start record", seen_alive=True, gone_for=5.0)
    rec = Records(start={"event": "start", "t": 0, "pid": 4242}, last_step=120, n_steps=12)
    obs = Observation(now=100.0, watch_started=0.0, records=rec, processes=(gone,), started=0.0, metrics_mtime=90.0,
                      quiet_since=90.0, volumes=(VolumeState("/v", ("run folder",), free=4096, total=50 * MB),))
    v = judge(obs, th)
    assert v.kind == "disk" and "after pid 4242 (start record) died" in v.line, v.line
    roomy = dataclasses.replace(obs, volumes=(VolumeState("/v", ("run folder",), free=30 * MB, total=50 * MB),))
    assert judge(roomy, th).kind == "dead"


# ---------------------------------------------------------------------------------------------
# Real volumes: the probe on a tmpfs, with a clock of its own
# ---------------------------------------------------------------------------------------------
def test_probe_on_a_real_volume_names_the_growing_folder(tmpfs, tmp_path):
    vol = tmpfs("48m")
    out = vol / "out"
    out.mkdir()
    (out / "old.bin").write_bytes(b"\0" * 5 * MB)   # there before: not what fills it
    watch = VolumeWatch()
    th = Thresholds()
    paths = [(str(tmp_path / "run"), "run folder"), (str(out), "checkpoints")]
    (tmp_path / "run").mkdir()
    found = None
    for k in range(1, 120):
        if k % 10 == 0:
            (out / f"step_{k * 10}.pt").write_bytes(os.urandom(4 * MB))
        states = watch.poll(1000.0 + k * 0.2, paths, th)
        found = rule_ahead(states, th, k)
        if found:
            break
    # (the clock moves 0.2 s per poll: a save every 2 s)
    vol_state = next(s for s in states if s.mount == str(vol))
    assert found is not None and vol_state.free >= 8 * MB, vol_state
    assert f" on {vol} (checkpoints): " in found.message and "; growing: out +" in found.message, found.message
    assert "new files)" in found.message and "old.bin" not in found.message


def test_probe_on_a_real_volume_burst_then_deleted_and_plenty_of_room(tmpfs, tmp_path):
    th = Thresholds()
    for size_, n_mb, delete in (("48m", 30, True), ("2g", 4, False)):
        vol = tmpfs(size_, name=f"vol{size_}")
        watch = VolumeWatch()
        for k in range(60):
            if delete and k in (10, 11, 12):          # one 30 MB save in three parts
                with open(vol / "save.bin", "ab") as f:
                    f.write(os.urandom(10 * MB))
            if delete and k == 20:
                (vol / "save.bin").unlink()
            if not delete and k % 5 == 0:             # 4 MB every 1 s on a 2 GB volume, kept
                (vol / f"step_{k}.pt").write_bytes(os.urandom(n_mb * MB))
            found = rule_ahead(watch.poll(1000.0 + k * 0.2, [(str(vol), "run folder")], th), th, k)
            assert found is None, (size_, k, found.message)


# ---------------------------------------------------------------------------------------------
# The watchdog and check-in, end to end, on a real writer
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def filler(trainer):
    """start(run, *flags): tests/disk_writer.py as a real process, stdout/stderr to RUN/train.log."""
    def start(run: Path, *args):
        w = trainer(run, *args, script=WRITER)
        w.failed = lambda: enospc_line(w.log_path.read_text(errors="replace").splitlines()) is not None
        return w
    return start


@pytest.mark.parametrize("flags, said, end", [   # each row turns the other rules off: one can fire
    (["--disk-margin", "1", "--disk-free-min", "0.001"], "ANOMALY disk: time to full = ", "before the volume fills."),
    (["--disk-horizon", "1", "--disk-margin", "2.5", "--disk-free-min", "0.001"],
     "< next write 4.0 MB x 2.5 margin", "before the next write fails."),
], ids=["slope", "next-write"])
def test_random_bytes_pt_files_filling_a_volume_are_disk_before_a_write_fails(tmpfs, tmp_path, filler, flags, said,
                                                                              end):
    vol = tmpfs("48m")
    run = tmp_path / "run"          # train.log beside the volume; the checkpoint folder on it
    w = filler(run, "--fill", "pt", "--dir", vol / "out", "--every", 2, "--mb", 4, "--ticks", 40)
    wd = start_script("watchdog.py", run, "--poll", "0.2", *flags)
    out, err = wd.communicate(timeout=120)
    alive, failed = w.proc.poll() is None, w.failed()
    print(f"\nwatchdog: {out.strip()}")
    assert wd.returncode == 7 and kind_of(out) == "disk", out + err
    assert alive and not failed, w.log_path.read_text()[-2000:]
    assert all(p.stat().st_size == 4 * MB for p in (vol / "out").iterdir()), "a write failed before the verdict"
    assert f" on {vol} (checkpoints)" in out and "growing: out +" in out and "new files)" in out, out
    assert said in out and out.strip().endswith(end), out
    assert_checkin_agrees(run, out.strip())
    # the writer really was filling it: it dies of it, and its log (off the volume) says so
    assert w.proc.wait(timeout=120) == 1 and w.failed()


@pytest.mark.parametrize("fill", ["train.log", "logs/app.log"])
def test_a_log_filling_the_run_volume_is_disk_first_and_disk_when_the_trainer_dies_of_it(tmpfs, filler, fill):
    vol = tmpfs("48m")
    run = vol / "run"               # the run folder on the volume: train.log and metrics.jsonl too
    how = ("--fill", "stdout") if fill == "train.log" else ("--fill", "log", "--log", run / fill)
    w = filler(run, *how, "--every", 0.25, "--mb", 0.5, "--ticks", 2000)
    wd = start_script("watchdog.py", run, "--poll", "0.2")
    out, err = wd.communicate(timeout=120)
    alive = w.proc.poll() is None
    print(f"\nwatchdog while it lives: {out.strip()}")
    assert wd.returncode == 7 and kind_of(out) == "disk", out + err
    assert alive, w.log_path.read_text(errors="replace")[-2000:]
    assert f" on {vol} (run folder)" in out and f"growing: run/{fill} +" in out, out
    assert_checkin_agrees(run, out.strip())

    # it dies on the full volume, and its traceback cannot reach train.log there
    assert w.proc.wait(timeout=180) == 1
    wait_for(lambda: os.statvfs(vol).f_bavail * os.statvfs(vol).f_frsize < MB, "the volume to be full")
    rc, again, err = run_script("watchdog.py", run, "--poll", "0.2", "--orphan-grace", "0.5")
    print(f"watchdog after the death: {again.strip()}")
    assert rc == 7 and kind_of(again) == "disk", again + err    # not dead: ... zombie
    assert f" on {vol} (run folder) after pid {w.pid} (start record) died" in again, again
    assert f"recently written: run/{fill} " in again and "The volume is full: " in again, again
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 1, err   # its state may not fit: one line
    rc, text, err = run_script("checkin.py", run)
    assert rc == 0 and kind_of(text.splitlines()[1]) == "disk", text + err


def test_a_trainer_that_filled_its_run_volume_before_any_watchdog_is_disk_not_dead(tmpfs, filler):
    vol = tmpfs("24m")
    run = vol / "run"
    w = filler(run, "--fill", "stdout", "--every", 0.1, "--mb", 1, "--ticks", 400)
    assert w.proc.wait(timeout=120) == 1
    assert os.statvfs(vol).f_bavail == 0
    rc, out, err = run_script("watchdog.py", run, "--poll", "0.2", "--orphan-grace", "0.5")
    print(f"\nwatchdog: {out.strip()}\nits stderr: {err.strip()}")
    assert rc == 7 and kind_of(out) == "disk", out + err
    assert out.startswith(f"ANOMALY disk: free space = 0 B < 2.5 MB floor on {vol} (run folder) after pid {w.pid} "
                          "(start record) died; recently written: run/train.log "), out
    assert err.startswith("watchdog.py: warning: cannot write ") and len(err.strip().splitlines()) == 1, err
    assert_checkin_agrees(run, out.strip())   # no watchdog.json fits: check-in's own look says the same


def test_a_rotating_writer_of_unreadable_files_stays_healthy(tmpfs, tmp_path, filler):
    vol = tmpfs("48m")
    run = tmp_path / "run"
    w = filler(run, "--fill", "pt", "--dir", vol / "out", "--every", 0.5, "--mb", 6, "--keep", 2, "--ticks", 24)
    wd = start_script("watchdog.py", run, "--poll", "0.2")
    out, err = wd.communicate(timeout=120)
    print(f"\nwatchdog: {out.strip()}")
    assert wd.returncode == 0 and out.startswith("OK done: "), out + err   # 144 MB through a 48 MB volume
    assert w.proc.wait(timeout=30) == 0 and not w.failed()
    assert sorted(p.name for p in (vol / "out").iterdir()) == ["step_230.pt", "step_240.pt"]
