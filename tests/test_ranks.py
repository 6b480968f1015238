"""Per-rank heartbeats: the incremental reader over real files, and the rules that name a rank."""
import json
import os
import socket

import pytest

from conftest import missing
from supervise.observe import ranks as R
from supervise.judge.table import KINDS
from supervise.observe.logs import root_cause
from supervise.observe.probes import Here, here
from supervise.observe.ranks import RankFiles, local_pids, rank_dead, rank_fatal, rank_hang, rank_lines, \
    root_cause_anomaly, straggler

T0 = 1_800_000_000.0
HOST = "node-a"


def beat(rank, step, time, sps=10.0, pid=None, host=HOST, **extra):
    rec = {"rank": rank, "local_rank": rank % 8, "host": host, "pid": pid or 4200 + rank, "step": step,
           "t": round(time - T0, 3), "time": time, "sps": sps, **extra}
    return json.dumps(rec) + "\n"


def write(run_dir, rank, text, mode="a"):
    d = run_dir / "ranks"
    d.mkdir(parents=True, exist_ok=True)
    with open(d / f"rank-{rank}.jsonl", mode) as f:
        f.write(text)


def run_of(tmp_path, spec):
    """spec: {rank: [(step, time, sps), ...]} -> RankFiles polled once."""
    for rank, beats in spec.items():
        write(tmp_path, rank, "".join(beat(rank, s, t, sps) for s, t, sps in beats))
    files = RankFiles(tmp_path)
    return files, files.poll()


# --- the reader ------------------------------------------------------------------------------

def test_reads_only_appended_bytes_and_waits_for_a_torn_line(tmp_path):
    write(tmp_path, 0, beat(0, 10, T0 + 1) + beat(0, 20, T0 + 2))
    files = RankFiles(tmp_path)
    s = files.poll()[0]
    assert (s.rank, s.local_rank, s.host, s.pid, s.step, s.time, s.sps) == (0, 0, HOST, 4200, 20, T0 + 2, 10.0)
    line = beat(0, 30, T0 + 3, sps=12.5)
    write(tmp_path, 0, line[:25])                       # the writer is mid-line
    assert files.poll()[0].step == 20
    write(tmp_path, 0, line[25:])
    s = files.poll()[0]
    assert (s.step, s.sps, s.records) == (30, 12.5, 3)
    assert list(s.history) == [(T0 + 1, 10.0), (T0 + 2, 10.0), (T0 + 3, 12.5)]


def test_garbage_missing_and_odd_files_are_tolerated(tmp_path):
    files = RankFiles(tmp_path)
    assert files.poll() == {}                           # no ranks/ folder yet
    write(tmp_path, 0, "not json\n[1, 2]\n{\"step\": \"x\"}\n" + beat(0, 5, T0 + 1) + "\x00\xff garbage\n")
    write(tmp_path, 1, "")                              # empty: not a rank yet
    os.mkfifo(tmp_path / "ranks" / "rank-2.jsonl")      # would block a naive open
    (tmp_path / "ranks" / "rank-3.jsonl").mkdir()
    (tmp_path / "ranks" / "rank-x.jsonl").write_text(beat(9, 1, T0))
    (tmp_path / "ranks" / "notes.txt").write_text("hello")
    got = files.poll()
    assert list(got) == [0] and got[0].step == 5 and got[0].records == 1
    assert files.skipped == 3  # two non-JSON lines and a list; the dict without a step is ignored


def test_a_truncated_or_replaced_file_is_read_again(tmp_path):
    write(tmp_path, 0, beat(0, 10, T0 + 1) + beat(0, 20, T0 + 2))
    files = RankFiles(tmp_path)
    assert files.poll()[0].step == 20
    write(tmp_path, 0, beat(0, 2, T0 + 9), mode="w")     # a relaunch truncated it
    assert files.poll()[0].step == 2
    tmp = tmp_path / "ranks" / "new"
    tmp.write_text(beat(0, 7, T0 + 10) + beat(0, 8, T0 + 11))
    os.replace(tmp, tmp_path / "ranks" / "rank-0.jsonl")  # replaced (another inode)
    assert files.poll()[0].step == 8


def test_a_long_file_and_a_huge_append_are_read_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(R, "FIRST_READ", 2048)
    monkeypatch.setattr(R, "MAX_READ", 4096)
    write(tmp_path, 0, "".join(beat(0, s, T0 + s) for s in range(1, 2001)))
    files = RankFiles(tmp_path)
    s = files.poll()[0]
    assert s.step == 2000 and 5 < s.records < 20        # attached: only the last 2 KiB were parsed
    write(tmp_path, 0, "".join(beat(0, s, T0 + s) for s in range(2001, 4001)))
    s = files.poll()[0]
    assert s.step == 4000 and s.records < 60            # then at most 4 KiB per poll
    assert files.skipped == 0                           # the cut first lines are dropped, not garbage
    write(tmp_path, 0, beat(0, 4001, T0 + 4001))
    assert files.poll()[0].step == 4001                 # and it goes on from there


def test_fatal_line_of_a_rank(tmp_path):
    write(tmp_path, 1, beat(1, 10, T0 + 1) + json.dumps({"step": 12, "t": 2.0, "FATAL": "non-finite loss nan at step 12",
                                                        "rank": 1, "pid": 4201}) + "\n")
    write(tmp_path, 0, beat(0, 10, T0 + 1))
    ranks = RankFiles(tmp_path).poll()
    a = rank_fatal(ranks)
    assert a.kind == "fatal" and a.step == 12
    assert a.message.startswith("ANOMALY fatal: rank 1 (pid 4201 on node-a) FATAL = 'non-finite loss nan at step 12'")
    assert rank_fatal({0: ranks[0]}) is None


# --- the rules: scenario tables ---------------------------------------------------------------

NOW = T0 + 100
HEALTHY = {0: [(118, NOW - 4, 10.0), (120, NOW - 2, 10.0)], 1: [(118, NOW - 4, 10.0), (120, NOW - 2, 10.0)]}


@pytest.mark.parametrize("name, spec, procs, stall_s, kind, words", [
    ("healthy", HEALTHY, {4200: "running", 4201: "sleeping"}, 30, None, []),
    ("stopped rank named at once", HEALTHY, {4200: "sleeping", 4201: "stopped"}, 30, "rank_hang",
     ["rank 1 (pid 4201 on node-a) state = stopped != running at step 120", "kill -CONT 4201"]),
    ("silent while rank 0 writes", {0: [(150, NOW - 1, 10.0)], 1: [(120, NOW - 31, 10.0)]}, {}, 30, "rank_hang",
     ["rank 1 (pid 4201 on node-a) silent = 31s > 30s while rank 0 wrote at step 150", "at step 120",
      "py-spy dump --pid 4201 on node-a"]),
    ("a learned stall time applies", {0: [(150, NOW - 1, 10.0)], 1: [(120, NOW - 31, 10.0)]}, {}, 45, None, []),
    ("all silent, one behind", {0: [(130, NOW - 40, 10.0)], 1: [(120, NOW - 50, 10.0)], 2: [(130, NOW - 40, 10.0)]},
     {}, 30, "rank_hang", ["rank 1 (pid 4201 on node-a) silent = 50s > 30s behind rank 0 at step 130"]),
    ("all silent at one step: the run's stall, not a rank's", {0: [(130, NOW - 40, 10.0)], 1: [(130, NOW - 41, 10.0)]},
     {}, 30, None, []),
    # rank 0 wrote a moment after rank 1 and fell silent too (a job killed whole): not rank 1's hang, whichever
    # side of 30 s the poll falls between their last writes (the stall rule, or the one behind, says it)
    ("silent together, one a moment later", {0: [(130, NOW - 29.9, 10.0)], 1: [(130, NOW - 30.4, 10.0)]},
     {}, 30, None, []),
    ("a gone rank is dead, not hung", {0: [(150, NOW - 1, 10.0)], 1: [(120, NOW - 31, 10.0)]}, {4201: "gone"}, 30,
     None, []),
])
def test_rank_hang(tmp_path, name, spec, procs, stall_s, kind, words):
    _, ranks = run_of(tmp_path, spec)
    a = rank_hang(ranks, NOW, procs, stall_s=stall_s)
    assert (a.kind if a else None) == kind, name
    for w in words:
        assert w in a.message
    if a:
        assert a.message.startswith(f"ANOMALY {kind}: ") and a.kind in KINDS


def test_several_silent_ranks_are_all_counted(tmp_path):
    spec = {r: [(100, NOW - 60, 10.0)] for r in range(1, 4)}
    spec[0] = [(200, NOW - 1, 10.0)]
    _, ranks = run_of(tmp_path, spec)
    assert "(and ranks 2-3)" in rank_hang(ranks, NOW, {}, stall_s=30).message


@pytest.mark.parametrize("procs, kind, words", [
    ({4200: "running", 4201: "running"}, None, []),
    ({4200: "running", 4201: "gone"}, "dead", ["rank 1 (pid 4201 on node-a) = gone != alive at step 120"]),
    ({4200: "zombie", 4201: "gone"}, "dead", ["rank 0 (pid 4200 on node-a) = zombie != alive", "(and rank 1)"]),
    ({}, None, []),                                     # remote ranks: not judged by pid
])
def test_rank_dead(tmp_path, procs, kind, words):
    _, ranks = run_of(tmp_path, HEALTHY)
    a = rank_dead(ranks, procs)
    assert (a.kind if a else None) == kind
    for w in words:
        assert w in a.message


def sps_run(tmp_path, slow_rank, slow, start, end, n_ranks=4, every=10):
    spec = {}
    for r in range(n_ranks):
        spec[r] = [(int(t - T0), t, slow if (r == slow_rank and t >= start) else 10.0)
                   for t in [T0 + k for k in range(0, int(end - T0) + 1, every)]]
    return run_of(tmp_path, spec)[1]


@pytest.mark.parametrize("slow, since, window, kind", [
    (5.0, T0 + 100, 300, "straggler"),      # half speed for 500 s > 300 s window
    (5.0, T0 + 400, 300, None),             # half speed for 200 s only
    (8.0, T0 + 100, 300, None),             # 0.8 x median: above the 0.75 floor
    (7.4, T0 + 100, 300, "straggler"),
])
def test_straggler_sustained_over_the_window(tmp_path, slow, since, window, kind):
    ranks = sps_run(tmp_path, 2, slow, since, T0 + 600)
    a = straggler(ranks, T0 + 600, window_s=window)
    assert (a.kind if a else None) == kind
    if a:
        assert a.message.startswith(f"ANOMALY straggler: rank 2 (pid 4202 on node-a) median sps = {slow:.4g} < 7.5 "
                                    "(0.75 x the other ranks' median 10)")


def test_straggler_needs_two_ranks(tmp_path):
    ranks = sps_run(tmp_path, 0, 1.0, T0, T0 + 600, n_ranks=1)
    assert straggler(ranks, T0 + 600, window_s=300) is None


def test_root_cause_anomaly_names_the_first_failing_rank():
    text = open(os.path.join(os.path.dirname(__file__), "data", "torchrun_sigkill.log")).read().splitlines()
    cause = root_cause(text)
    a = root_cause_anomaly(cause, step=42)
    assert a.kind == "crash" and a.step == 42
    assert "rank 1 (local_rank 1, pid 5831 on localhost) exitcode -9 (SIGKILL): killed by SIGKILL (not shown to be OOM)" in a.message
    assert root_cause_anomaly(cause, step=42, killed="killed by the OOM killer (cgroup oom_kill 0 -> 1)", oom=True).kind == "oom"


def test_local_pids_are_this_hosts_ranks(tmp_path):
    me = socket.gethostname()
    write(tmp_path, 0, beat(0, 1, T0, host=me, pid=11))
    write(tmp_path, 1, beat(1, 1, T0, host="elsewhere", pid=12))
    assert local_pids(RankFiles(tmp_path).poll()) == [11]


def test_local_pids_are_this_pid_namespaces_and_boots_ranks(tmp_path):
    """Contract v0.4: a heartbeat's host is not enough; its pid_ns and boot_id, when written,
    must be this process's too (a sidecar container shares the host name, not the pids)."""
    me = here()
    if me.pid_ns is None or me.boot_id is None or not me.proc_own:
        missing(f"this /proc has no namespace link or boot id ({me}): a Linux with /proc is needed")
    ours = {"pid_ns": me.pid_ns, "boot_id": me.boot_id}
    write(tmp_path, 0, beat(0, 1, T0, host=me.host, pid=11, **ours))
    write(tmp_path, 1, beat(1, 1, T0, host=me.host, pid=12, **{**ours, "pid_ns": me.pid_ns + 1}))
    write(tmp_path, 2, beat(2, 1, T0, host=me.host, pid=13, **{**ours, "boot_id": "another-boot"}))
    write(tmp_path, 3, beat(3, 1, T0, host=me.host, pid=14))                    # an older writer: host alone
    write(tmp_path, 4, beat(4, 1, T0, host="elsewhere", pid=15, **ours))
    write(tmp_path, 5, beat(5, 1, T0, host=me.host, pid=16, **{**ours, "pid_ns": "4026531836"}))   # not a number
    write(tmp_path, 1, json.dumps({"step": 1, "t": 1.0, "FATAL": "boom", "rank": 1, "pid": 12}) + "\n")  # keeps its namespace
    ranks = RankFiles(tmp_path).poll()
    assert (ranks[1].pid_ns, ranks[2].boot_id) == (me.pid_ns + 1, "another-boot")
    assert local_pids(ranks) == local_pids(ranks, me) == [11, 14, 16]   # a pid_ns that is no count is not read
    assert R.rank_where(ranks, me) == {1: "pid_ns", 2: "boot", 4: "host"}
    assert R.rank_where(ranks, Here(me.host, me.pid_ns, me.boot_id, proc_own=False)) == {1: "pid_ns", 2: "boot", 4: "host",
                                                                                        0: "pid_ns"}


def test_a_rank_of_another_pid_namespace_is_judged_by_its_records(tmp_path):
    """Rank 1 runs in another PID namespace with the same pid number as local rank 0: rank 0's
    state is never rank 1's; rank 1 is silent, stopped or dead only by its heartbeats."""
    write(tmp_path, 0, beat(0, 120, NOW - 2, pid=7))
    write(tmp_path, 1, beat(1, 120, NOW - 2, pid=7))
    ranks = RankFiles(tmp_path).poll()
    away = {1: "pid_ns"}
    a = rank_dead(ranks, {7: "gone"}, where=away)
    assert a.message.startswith("ANOMALY dead: rank 0 (pid 7 on node-a) = gone != alive at step 120") and "and rank" not in a.message
    assert rank_dead(ranks, {7: "running"}, where={0: "pid_ns", 1: "pid_ns"}) is None
    a = rank_hang(ranks, NOW, {7: "stopped"}, stall_s=30, where=away)
    assert a.message.startswith("ANOMALY rank_hang: rank 0 (pid 7 on node-a) state = stopped") and "and rank" not in a.message
    assert rank_lines(ranks, NOW, {7: "running"}, where=away) == [
        "rank 0: step 120, 10 sps, 2.0s ago, running, pid 7 on node-a",
        "rank 1: step 120, 10 sps, 2.0s ago, in another PID namespace: judged by its records, pid 7 on node-a"]
    write(tmp_path, 0, beat(0, 150, NOW + 35, pid=7))   # rank 0 goes on; rank 1's heartbeats stop at 120
    ranks = RankFiles(tmp_path).poll()
    a = rank_hang(ranks, NOW + 36, {7: "running"}, stall_s=30, where=away)
    assert a is not None and a.message.startswith("ANOMALY rank_hang: rank 1 (pid 7 on node-a) silent = 38s > 30s "
                                                  "while rank 0 wrote at step 150"), a
    assert "py-spy dump --pid 7 inside its own PID namespace (its container) on node-a" in a.message


# --- check-in lines ---------------------------------------------------------------------------

def test_rank_lines_one_per_rank_for_a_few(tmp_path):
    _, ranks = run_of(tmp_path, HEALTHY)
    out = rank_lines(ranks, NOW, {4200: "running", 4201: "stopped"})
    assert out == ["rank 0: step 120, 10 sps, 2.0s ago, running, pid 4200 on node-a",
                   "rank 1: step 120, 10 sps, 2.0s ago, stopped, pid 4201 on node-a"]


def test_rank_lines_64_ranks_fit_and_name_the_unhealthy(tmp_path):
    spec = {r: [(118, NOW - 5, 9.5 + (r % 5) * 0.1), (120, NOW - 1 - r % 3, 9.5 + (r % 5) * 0.1)] for r in range(64)}
    spec[17] = [(90, NOW - 400, 9.0)]
    _, ranks = run_of(tmp_path, spec)
    out = rank_lines(ranks, NOW, {4200 + 33: "stopped"}, stall_s=300)
    text = "\n".join(out)
    assert len(text) <= 600
    assert out[0] == "ranks 0-16,18-32,34-63 healthy: steps 120-120, sps 9.5-9.9, last heartbeat <= 3.0s ago"
    assert "rank 17: step 90, 9 sps, 400s ago" in text and "rank 33: step 120" in text and "stopped" in text


def test_rank_lines_many_unhealthy_stay_within_the_limit(tmp_path):
    spec = {r: [(100, NOW - 1000, 9.0)] for r in range(64)}
    _, ranks = run_of(tmp_path, spec)
    out = rank_lines(ranks, NOW, stall_s=300, limit_chars=600)
    assert sum(len(x) + 1 for x in out) <= 601
    assert out[-1].startswith("... ") and "more unhealthy: ranks " in out[-1]


def test_rank_dead_names_the_root_cause_rank_when_all_are_gone(tmp_path):
    _, ranks = run_of(tmp_path, HEALTHY)
    gone = {4200: "gone", 4201: "gone"}
    assert rank_dead(ranks, gone).message.startswith("ANOMALY dead: rank 0 (pid 4200 on node-a) = gone != alive (and rank 1)")
    cause = root_cause(open(os.path.join(os.path.dirname(__file__), "data", "torchrun_sigkill.log")).read().splitlines())
    assert rank_dead(ranks, gone, cause).message.startswith("ANOMALY dead: rank 1 (pid 4201 on node-a) = gone != alive (and rank 0)")


def test_files_of_an_earlier_launch_are_left_out(tmp_path):
    """A relaunch with world size 2 into a folder where a 4-rank run wrote: ranks 2 and 3 are
    history, not silent ranks of this run."""
    for r in range(4):
        write(tmp_path, r, beat(r, 500, NOW - 3000))
    for r in range(2):
        write(tmp_path, r, beat(r, 10, NOW - 1, pid=9000 + r))
    files = RankFiles(tmp_path)
    assert rank_hang(files.poll(), NOW, {}, stall_s=30).message.startswith("ANOMALY rank_hang: rank 2 ")
    ranks = files.poll(since=NOW - 60)
    assert sorted(ranks) == [0, 1] and ranks[1].pid == 9001
    assert rank_hang(ranks, NOW, {}, stall_s=30) is None


def test_a_relaunched_rank_forgets_its_old_fatal(tmp_path):
    write(tmp_path, 1, beat(1, 10, T0 + 1) + json.dumps({"step": 12, "FATAL": "old", "rank": 1, "pid": 4201}) + "\n")
    files = RankFiles(tmp_path)
    assert files.poll()[1].fatal == "old"
    write(tmp_path, 1, beat(1, 2, T0 + 50, pid=5555))
    s = files.poll()[1]
    assert (s.fatal, s.pid, s.step, list(s.history)) == (None, 5555, 2, [(T0 + 50, 10.0)])
