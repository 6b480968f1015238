"""A watchdog in another PID namespace on the same host (issue 37): a sidecar container of a
training pod, or ``unshare --pid --fork --mount-proc``. It shares the host name with the trainer
but not its pids, so the pids the start record and the heartbeats name are not its to probe:
it judges the run by its records, as it judges a remote one. Real runs, as root: a two-rank
torchrun (gloo, CPU) of tests/ddp_loop.py launched through the README's shell line, and
scripts/watchdog.py inside ``unshare`` (its own PID namespace and /proc), or beside the trainer
for the control.

What a death becomes when the pids are not visible: a rank's SIGKILL is still the ``crash``
torchrun reports in train.log, named with its root cause; a SIGKILL of the whole trainer (torchrun
and its workers, nothing written after it) is a ``stall`` once the records are older than the
stall limit, the line saying that no process of the run is visible from here and why. The same
kill seen from the trainer's own namespace is ``dead`` at once (pid-based)."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, STOPPER, WATCHDOG, end_launched, keeps_writing, kind_of, launch, missing, records, \
    wait_for_polls
from supervise.observe.probes import here
from supervise.observe.state import read_launch
from torchrun_job import job  # noqa: F401  (the fixture)

PLAIN = ROOT / "tests" / "resumable_loop.py"   # a plain loop with Telemetry, standard library only
CHECKIN = WATCHDOG.with_name("checkin.py")
UNSHARE = shutil.which("unshare")
STALL = 20    # s: --max-stall (ddp_loop has no eval, so the stall limit is this); generous for a busy machine
OWN_NS = [UNSHARE or "unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
NS_LINE = "in another PID namespace on "


def _can_unshare() -> str:
    """'' when this process may make a PID namespace with its own /proc here, else why not."""
    if not sys.platform.startswith("linux"):
        return "PID namespaces are Linux's"
    if os.geteuid() != 0:
        return "unshare --pid --mount-proc needs root (run the tests as root, as CI does)"
    if UNSHARE is None:
        return "unshare (util-linux) is not on PATH"
    p = subprocess.run([*OWN_NS, sys.executable, "-c", "import os; print(os.getpid())"],
                       capture_output=True, text=True, timeout=60)
    if p.returncode != 0 or p.stdout.strip() != "1":
        return f"unshare --pid --fork --mount-proc --kill-child failed here (rc {p.returncode}): {p.stderr.strip()[:200]}"
    return ""


_why = _can_unshare()
if _why:
    missing(_why)


@pytest.fixture
def watchdogs():
    """watchdogs(run_dir, own_ns=True): scripts/watchdog.py --poll 0.2 --max-stall STALL, in a PID
    namespace of its own (and its own /proc) or beside the trainer; killed after the test."""
    made = []

    def start(run_dir, own_ns=True):
        argv = [sys.executable, str(WATCHDOG), str(run_dir), "--poll", "0.2", "--max-stall", str(STALL)]
        p = subprocess.Popen([*OWN_NS, *argv] if own_ns else argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        made.append(p)
        return p

    yield start
    for p in made:
        if p.poll() is None:
            p.kill()   # unshare --kill-child takes the watchdog with it
        p.communicate()


def watching(run_dir, wd, own_ns: bool) -> dict:
    """Its state after a few polls of the live run: it is in the namespace meant, watching."""
    state = wait_for_polls(run_dir, 3, wd, timeout=120)
    assert state["state"] == "watching", state
    assert (state["watchdog_pid"] == 1) is own_ns, state   # unshare --fork: the watchdog is its namespace's pid 1
    return state


def test_the_records_name_the_writers_pid_namespace_and_boot(job):
    """Contract v0.4: the start record and every heartbeat carry the writer's pid_ns and boot_id."""
    j = job()
    ranks = j.wait_for_steps(2)
    me = here()
    start = json.loads((j.run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert start["event"] == "start" and (start["pid_ns"], start["boot_id"]) == (me.pid_ns, me.boot_id)
    for r, s in ranks.items():
        assert (s.host, s.pid_ns, s.boot_id) == (me.host, me.pid_ns, me.boot_id), r
        assert s.pid_ns == os.stat(f"/proc/{s.pid}/ns/pid").st_ino   # what the kernel says of that process


def test_the_fields_are_left_out_where_proc_has_none(tmp_path):
    """A writer with no /proc at all (macOS has none; here a mount namespace without it): the
    records simply lack pid_ns and boot_id, and nothing fails."""
    code = ("import sys; sys.path.insert(0, sys.argv[2]); import os; assert not os.path.exists('/proc/self');"
            "from supervise.telemetry import Telemetry; tm = Telemetry(sys.argv[1], batch_size=4);"
            "tm.step(1, 1.0); tm.step(2, 0.9); tm.done()")
    p = subprocess.run([UNSHARE, "--mount", "--propagation", "private", "sh", "-c",
                        'umount -l /proc && exec "$0" -c "$1" "$2" "$3"', sys.executable, code, str(tmp_path), str(ROOT)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    start = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    beats = [json.loads(x) for x in (tmp_path / "ranks" / "rank-0.jsonl").read_text().splitlines()]
    assert start["event"] == "start" and start["host"] and len(beats) == 2
    assert not {"pid_ns", "boot_id"} & (set(start) | set().union(*beats)), (start, beats)


def test_here_without_its_own_proc_probes_no_recorded_pid(tmp_path):
    """``unshare --pid --fork`` without --mount-proc: /proc is the parent namespace's, so no pid
    recorded with a PID namespace is probed, not even one recorded in this very namespace."""
    code = ("import sys, os, json; sys.path.insert(0, sys.argv[1]); from supervise.observe.probes import here, locality;"
            "me = here(); print(json.dumps([os.getpid(), me.proc_own, me.pid_ns == os.stat('/proc/self/ns/pid').st_ino,"
            " locality(me.host, me.pid_ns, me.boot_id, me), locality(me.host, None, None, me)]))")
    p = subprocess.run([UNSHARE, "--pid", "--fork", sys.executable, "-c", code, str(ROOT)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == [1, False, True, "pid_ns", ""]


def test_a_healthy_run_is_ok_done_for_a_watchdog_in_its_own_pid_namespace(job, watchdogs):
    """(a) Both ranks train: the watchdog, which cannot see their pids, says nothing until the
    sentinel, then OK done (exit 0); a check-in from another namespace says why no pid is probed."""
    j = job("--steps", 60, "--step-time", 0.3)   # 60 steps (no chance_loss yet on random labels), ~20 s
    j.wait_for_steps(4)
    wd = watchdogs(j.run_dir)
    state = watching(j.run_dir, wd, own_ns=True)
    assert state["pids"] == [], state   # not one process of the run is visible from there
    p = subprocess.run([*OWN_NS, sys.executable, str(CHECKIN), str(j.run_dir), "--json"], capture_output=True,
                       text=True, timeout=120)
    facts = json.loads(p.stdout)
    if j.proc.poll() is None and not (j.run_dir / "final_val_metrics.json").exists():
        assert facts["verdict"] == "RUNNING healthy", p.stdout
        assert any("process not visible here: the start record's pid" in n and NS_LINE in n and "judged by its records" in n
                   for n in facts["notes"]), facts["notes"]
        assert len(facts["ranks"]) == 2 and all("in another PID namespace: judged by its records" in ln
                                                for ln in facts["ranks"]), facts["ranks"]
    out, err = wd.communicate(timeout=300)
    assert wd.returncode == 0 and out.startswith("OK done: final_val_metrics.json written at step 60"), out + err
    assert j.proc.wait(timeout=120) == 0


def test_a_killed_rank_is_still_the_crash_torchrun_reports(job, watchdogs):
    """(b) SIGKILL of rank 1: torchrun reports it in train.log, which the watchdog reads whatever
    the namespace: crash, naming rank 1 and its pid, soon (never dead: no pid was probed)."""
    j = job()
    ranks = j.wait_for_steps(4)
    wd = watchdogs(j.run_dir)
    watching(j.run_dir, wd, own_ns=True)
    pid1 = ranks[1].pid
    os.kill(pid1, signal.SIGKILL)
    t0 = time.time()
    out, err = wd.communicate(timeout=120)
    took = time.time() - t0
    assert wd.returncode == 7 and kind_of(out) == "crash" and out.startswith("ANOMALY crash: root cause = "), out + err
    assert f"rank 1 (local_rank 1, pid {pid1} on " in out and "SIGKILL" in out, out
    assert took < 60, took
    print(f"\nrank 1 SIGKILL, watchdog in its own PID namespace: {kind_of(out)} after {took:.1f}s: {out.strip()}")


def test_a_killed_trainer_is_a_stall_by_its_records_for_a_watchdog_in_its_own_pid_namespace(job, watchdogs):
    """(b) SIGKILL of the whole trainer, nothing reporting it: the pids cannot be probed from
    there, so the death shows as the records stopping: stall, once the metrics are older than
    the stall limit, and not before; the line says that no process of the run is visible and why."""
    j = job()
    j.wait_for_steps(4)
    wd = watchdogs(j.run_dir)
    watching(j.run_dir, wd, own_ns=True)
    ranks = j.freeze_at_one_step()
    last = max(s.last_seen for s in ranks.values())
    j.kill_all()
    step = [r for r in records(j.run_dir) if "loss" in r][-1]["step"]   # the last step record: nothing comes after it
    t0 = time.time()
    out, err = wd.communicate(timeout=STALL + 120)
    took = time.time() - t0
    assert wd.returncode == 7 and kind_of(out) == "stall", out + err
    m = re.match(r"ANOMALY stall: metrics age = (\d+(?:\.\d)?)s > (\d+)s.* at step (\d+)\. ", out)
    assert m and float(m[1]) >= STALL and int(m[2]) == STALL and int(m[3]) == step, out
    assert "no process of the run is visible from here: the start record's pid " in out and NS_LINE in out, out
    assert "judged by its records, it died or hangs where it runs" in out, out
    assert time.time() - last > STALL   # judged by the records' age, not by a pid
    print(f"\nwhole-trainer SIGKILL, watchdog in its own PID namespace: {kind_of(out)} after {took:.1f}s "
          f"(stall limit {STALL}s, last record {t0 - last:.1f}s before the kill): {out.strip()}")


def test_the_control_a_watchdog_beside_the_trainer_says_dead_at_once(job, watchdogs):
    """(c) The same kill seen from the trainer's own namespace: the pids are probed, and their
    being gone is dead at once, naming the ranks."""
    j = job()
    j.wait_for_steps(4)
    wd = watchdogs(j.run_dir, own_ns=False)
    state = watching(j.run_dir, wd, own_ns=False)
    assert state["pids"], state   # it follows torchrun and the start record's pid
    j.kill_all()
    t0 = time.time()
    out, err = wd.communicate(timeout=120)
    took = time.time() - t0
    assert wd.returncode == 7 and kind_of(out) == "dead", out + err
    assert re.match(r"ANOMALY dead: rank [01] \(pid \d+ on \S+\) = (gone|zombie) != alive \(and rank [01]\)", out), out
    assert took < STALL, took   # well before any record-based rule could fire
    print(f"\nwhole-trainer SIGKILL, watchdog beside it: {kind_of(out)} after {took:.1f}s: {out.strip()}")


def test_a_launched_run_is_not_dead_for_a_watchdog_in_its_own_pid_namespace(tmp_path, watchdogs):
    """launch.json names the launcher's PID namespace too: a watchdog in another one does not
    probe its pid (it would read gone: dead), it judges the records, to OK done; and stop.py from
    there refuses, saying where the trainer runs (its pid and group are not that namespace's)."""
    work, run = tmp_path / "work", tmp_path / "work" / "run"
    work.mkdir()
    try:
        p = launch(work, run, sys.executable, "-u", PLAIN, "--out", run, "--steps", 300, "--dt", 0.05)
        assert p.returncode == 0, p.stdout + p.stderr
        rec = read_launch(run)
        assert (rec["pid_ns"], rec["boot_id"]) == (here().pid_ns, here().boot_id), rec
        keeps_writing(run / "metrics.jsonl", 3)
        wd = watchdogs(run)
        assert watching(run, wd, own_ns=True)["pids"] == []
        s = subprocess.run([*OWN_NS, sys.executable, str(STOPPER), str(run)], capture_output=True, text=True, timeout=120)
        assert s.returncode == 2 and f"pid {rec['pid']} (group {rec['pgid']}) was launched {NS_LINE}" in s.stderr, s.stderr
        assert s.stderr.strip().endswith("run stop.py there") and len(s.stderr.strip().splitlines()) == 1, s.stderr
        out, err = wd.communicate(timeout=240)
        assert wd.returncode == 0 and out.startswith("OK done: final_val_metrics.json written at step 300"), out + err
    finally:
        end_launched(tmp_path)
