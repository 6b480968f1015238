"""Log knowledge on real torchrun output (tests/data/, recorded from tests/ddp_loop.py):
the first failing rank's root cause, never the banner or the other ranks' fallout."""
import os
import subprocess
from pathlib import Path

import pytest

from conftest import missing

from supervise.observe.logs import (KILLED_NOT_OOM, cgroup_dir, is_fallout, kernel_oom_lines, killed_reason,
                            last_error, log_tail, oom_kills, root_cause)

DATA = Path(__file__).parent / "data"


def lines(name):
    return (DATA / name).read_text().splitlines()


@pytest.mark.parametrize("log, rank, exitcode, signal, message", [
    ("torchrun_raise_record.log", 1, 1, None, "RuntimeError: injected failure on rank 1 at step 10"),
    ("torchrun_raise_norecord.log", 1, 1, None, "RuntimeError: injected failure on rank 1 at step 10"),
    ("torchrun_raise_errorfile.log", 1, 1, None, "RuntimeError: injected failure on rank 1 at step 6"),
    ("torchrun_sigkill.log", 1, -9, "SIGKILL", None),
])
def test_root_cause_of_real_torchrun_logs(log, rank, exitcode, signal, message):
    for text in (lines(log), log_tail(DATA / log)):   # raw, and through the watchdog's filter
        cause = root_cause(text)
        assert (cause.rank, cause.local_rank, cause.exitcode, cause.signal, cause.message) == \
            (rank, rank, exitcode, signal, message)
        assert cause.host == "localhost" and cause.pid > 0 and cause.time.startswith("2026-")
        assert not cause.fallout


@pytest.mark.parametrize("field", ["time", "host", "rank", "exitcode", "error_file"])
def test_a_block_torchrun_is_still_writing_is_no_cause_yet(field):
    """Read mid-write (the watchdog polls while torchrun prints): no cause until the rank is known,
    so a poll never names a rank the finished block does not."""
    text = lines("torchrun_sigkill.log")
    head = text.index("Root Cause (first observed failure):")
    cut = text[:next(i for i, ln in enumerate(text) if i > head and ln.strip().startswith(field))]
    assert any(ln.strip() == "Root Cause (first observed failure):" for ln in cut)
    assert root_cause(cut) is None
    assert root_cause(text).rank == 1


def test_a_fallout_first_failure_yields_to_the_rank_that_failed_on_its_own():
    """Rank 1 SIGKILLed; rank 0's gloo aborts (SIGABRT) before torchrun reaps rank 1, so the block's
    "first observed failure" is rank 0's fallout and rank 1 sits under "Failures:": rank 1 is the cause."""
    text = lines("torchrun_sigkill.log")
    head, fails = text.index("Root Cause (first observed failure):"), text.index("Failures:")
    root, other = text[head + 1:head + 8], text[fails + 1:fails + 8]
    swapped = (["[rank0]: Traceback (most recent call last):", '[rank0]:   File "ddp_loop.py", line 40, in <module>',
                "[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:6272"]
               + text[:fails + 1] + ["[1]:"] + root[1:] + [text[fails + 8]] + [text[head], "[0]:"]
               + [ln.replace("-15 (pid: 5830)  (SIGTERM)", "-6 (pid: 5830)  (SIGABRT)").replace("Signal 15 (SIGTERM)", "Signal 6 (SIGABRT)")
                  for ln in other[1:]] + text[head + 8:])
    cause = root_cause(swapped)
    assert (cause.rank, cause.exitcode, cause.signal, cause.fallout) == (1, -9, "SIGKILL", False)
    alone = [ln for i, ln in enumerate(swapped) if not (fails < i <= fails + 8)]   # no Failures entry: say the fallout
    assert root_cause(alone).rank == 0 and root_cause(alone).fallout


def test_a_fallout_first_failure_with_no_other_failure_listed_yields_to_the_rank_that_raised():
    """Under load torchrun can see rank 0 abort on the closed connection while rank 1, which raised,
    is still exiting; it then stops rank 1 unlisted ("<NO_OTHER_FAILURES>"). Rank 1's own traceback
    in the log names the cause; its exitcode and pid are unknown, so the line does not invent them."""
    text = lines("torchrun_raise_record.log")
    head, fails = text.index("Root Cause (first observed failure):"), text.index("Failures:")
    rank0 = [ln.replace("-15 (pid: 5081)  (SIGTERM)", "-6 (pid: 5081)  (SIGABRT)")
             for ln in text[fails + 2:text.index("-" * 60, fails)]]
    aborted = text[:fails + 1] + ["  <NO_OTHER_FAILURES>", "-" * 60, text[head], "[0]:"] + rank0 + ["=" * 60]
    cause = root_cause(aborted)
    assert (cause.rank, cause.local_rank, cause.host, cause.exitcode, cause.pid, cause.fallout) == \
        (1, 1, "localhost", None, None, False)
    assert last_error(aborted) == "rank 1 (local_rank 1 on localhost): RuntimeError: injected failure on rank 1 at step 10"
    assert "Connection closed by peer" in root_cause(aborted[fails - 1:]).message   # no rank traceback: say the fallout
    earlier = ["[rank1]: Traceback (most recent call last):", "[rank1]: ValueError: an earlier attempt",
               text[head], "=" * 60, *aborted[fails - 1:]]     # an earlier attempt's block, then this one's
    assert root_cause(earlier).fallout                         # the earlier attempt's traceback is not this one's


def test_a_chained_teardown_error_does_not_hide_the_rank_own_error():
    """Rank 1 raises, then its teardown fails on the closed group: the cause is the first error."""
    text = lines("torchrun_raise_norecord.log")
    last = max(i for i, ln in enumerate(text) if ln.startswith("[rank1]: RuntimeError: injected"))
    chained = text[:last + 1] + ["[rank1]: ", "[rank1]: During handling of the above exception, another exception occurred:",
                                 "[rank1]: ", "[rank1]: Traceback (most recent call last):",
                                 '[rank1]:   File "ddp_loop.py", line 90, in <module>',
                                 "[rank1]: torch.distributed.DistBackendError: [../gloo/pair.cc:553] Connection closed by peer"] \
        + text[last + 1:]
    assert root_cause(chained).message == "RuntimeError: injected failure on rank 1 at step 10"


@pytest.mark.parametrize("log, expected", [
    ("torchrun_raise_record.log", "exitcode 1: RuntimeError: injected failure on rank 1 at step 10"),
    ("torchrun_raise_norecord.log", "exitcode 1: RuntimeError: injected failure on rank 1 at step 10"),
    ("torchrun_sigkill.log", "exitcode -9 (SIGKILL): killed by SIGKILL (not shown to be OOM)"),
])
def test_last_error_is_the_root_cause_not_the_banner(log, expected):
    err = last_error(log_tail(DATA / log))
    assert err.startswith("rank 1 (local_rank 1, pid ") and err.endswith(expected)
    assert "=====" not in err and "ChildFailedError" not in err and "Connection closed" not in err


def test_without_the_block_the_failing_rank_beats_the_fallout():
    """torchrun still running (no failure block yet): rank 0's 'Connection closed by peer'
    comes later in the log than rank 1's error, yet rank 1's is the one reported."""
    text = lines("torchrun_raise_record.log")
    cut = text[:text.index("Traceback (most recent call last):")]  # torchrun's own traceback
    assert any("Connection closed by peer" in ln for ln in cut[-5:])
    assert last_error(cut) == "RuntimeError: injected failure on rank 1 at step 10"
    only_fallout = [ln for ln in cut if ln.startswith("[rank0]")]
    assert "Connection closed by peer" in last_error(only_fallout)  # nothing better: say it


def test_error_file_gives_the_message(tmp_path):
    """The block names the worker's error file; when it still exists its message is read."""
    err = tmp_path / "error.json"
    err.write_bytes((DATA / "torchelastic_error.json").read_bytes())
    text = [ln.replace(ln.split(": ", 1)[1], str(err)) if ln.startswith("  error_file:") else ln
            for ln in lines("torchrun_raise_norecord.log")]
    cause = root_cause(text)
    assert cause.error_file == str(err)
    assert cause.message == "RuntimeError: injected failure on rank 1 at step 6"  # the file's, not the log's step 10
    # the launch's own TORCHELASTIC_ERROR_FILE (torchrun copies the child's into it)
    assert root_cause(lines("torchrun_sigkill.log"), error_files=[err]).message == \
        "RuntimeError: injected failure on rank 1 at step 6"


@pytest.mark.parametrize("make", ["fifo", "dir", "garbage", "huge", "missing"])
def test_a_bad_error_file_is_ignored_without_hanging(tmp_path, make):
    p = tmp_path / "error.json"
    if make == "fifo":
        os.mkfifo(p)
    elif make == "dir":
        p.mkdir()
    elif make == "garbage":
        p.write_bytes(b"\x00\xff not json")
    elif make == "huge":
        p.write_text('{"message": "' + "x" * (1 << 20) + '"}')
    text = [f"  error_file: {p}" if ln.startswith("  error_file:") else ln for ln in lines("torchrun_raise_norecord.log")]
    cause = root_cause(text)
    assert cause.error_file == str(p)
    assert cause.message == "RuntimeError: injected failure on rank 1 at step 10"  # from the rank's own lines


def test_no_block_no_cause_and_plain_tracebacks_still_work():
    assert root_cause(["Traceback (most recent call last):", '  File "x.py", line 1', "ValueError: boom"]) is None
    assert last_error(["step 1", "Traceback (most recent call last):", '  File "x.py", line 1, in <module>',
                       "    f()", "ValueError: boom", "some later print"]) == "ValueError: boom"
    assert last_error(["all good"]) is None
    # a message continued on indented lines, then ordinary output
    assert last_error(["Traceback (most recent call last):", '  File "t.py", line 9, in <module>',
                       "RuntimeError: Error(s) in loading state_dict for Net:", "\tMissing key(s): fc.weight",
                       "step 5", "step 6"]) == "RuntimeError: Error(s) in loading state_dict for Net:"
    # a chained exception: the last one raised
    assert last_error(["Traceback (most recent call last):", '  File "t.py", line 3', "KeyError: 'label'", "",
                       "During handling of the above exception, another exception occurred:", "",
                       "Traceback (most recent call last):", '  File "t.py", line 5',
                       "ValueError: no label column"]) == "ValueError: no label column"


@pytest.mark.parametrize("line, fallout", [
    ("[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:6272", True),
    ("RuntimeError: [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE) ran for 600000 milliseconds before timing out.", True),
    ("torch.distributed.DistBackendError: NCCL communicator was aborted on rank 3.", True),
    ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 1800000ms for recv operation to complete", True),
    ("W1203 07:55:20.636000 5076 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 5081 closing signal SIGTERM", True),
    ("  traceback : Signal 15 (SIGTERM) received by PID 5177", True),
    ("Rank 2 terminated by SIGTERM", True),
    ("RuntimeError: injected failure on rank 1 at step 10", False),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", False),
    ("ValueError: Expected input batch_size (8) to match target batch_size (4).", False),
])
def test_fallout_is_classified(line, fallout):
    assert is_fallout(line) is fallout


def test_sigkill_is_oom_only_when_the_kernel_or_cgroup_says_so():
    assert killed_reason(4242) == (False, KILLED_NOT_OOM)
    assert killed_reason(4242, before=3, after=3) == (False, KILLED_NOT_OOM)
    assert killed_reason(4242, before=None, after=4).oom is False       # no baseline: not shown
    oom = killed_reason(4242, before=3, after=4)
    assert oom.oom and "oom_kill 3 -> 4" in oom.text
    kernel = ["[ 812.1] Out of memory: Killed process 4242 (python3) total-vm:81234kB, anon-rss:7000000kB",
              "[ 900.2] Out of memory: Killed process 5151 (python3) total-vm:1kB"]
    assert killed_reason(4242, kernel_lines=kernel).oom
    assert killed_reason(7777, kernel_lines=kernel) == (False, KILLED_NOT_OOM)  # another pid's OOM


def test_kernel_oom_lines_from_dmesg_or_nothing():
    dmesg = ("[  1.5] EXT4-fs (vda): mounted filesystem\n"
             "[812.0] python3 invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE), order=0\n"
             "[812.1] Memory cgroup out of memory: Killed process 4242 (python3) total-vm:8123kB\n")
    ok = lambda argv, **kw: subprocess.CompletedProcess(argv, 0, dmesg, "")
    assert kernel_oom_lines(4242, runner=ok) == ["[812.1] Memory cgroup out of memory: Killed process 4242 (python3) total-vm:8123kB"]
    assert kernel_oom_lines(99, runner=ok) == []
    refused = lambda argv, **kw: subprocess.CompletedProcess(argv, 1, "", "dmesg: read kernel buffer failed: Operation not permitted")
    assert kernel_oom_lines(4242, runner=refused) == []

    def missing(argv, **kw):
        raise FileNotFoundError(argv[0])
    assert kernel_oom_lines(4242, runner=missing) == []
    assert isinstance(kernel_oom_lines(None), list)  # the real dmesg (or none): never raises


@pytest.mark.parametrize("name, text, expected", [
    ("memory.events", "low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\noom_group_kill 0\n", 2),   # cgroup v2
    ("memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 5\n", 5),              # cgroup v1
    ("memory.events", "garbage\n", None),
])
def test_oom_kill_counter(tmp_path, name, text, expected):
    (tmp_path / name).write_text(text)
    assert oom_kills(tmp_path) == expected
    assert oom_kills(tmp_path / "absent") is None and oom_kills(None) is None


def test_this_process_cgroup_counter_is_readable_when_the_host_has_one():
    d = cgroup_dir()
    if d is None:
        missing("no memory cgroup readable here (/proc/self/cgroup names none under /sys/fs/cgroup)")
    assert isinstance(oom_kills(d), int)


def test_a_first_failure_that_is_itself_a_timeout_says_so():
    """SIGSTOP on rank 1 under NCCL: rank 0 times out first and torchrun calls that the root cause."""
    block = ["Root Cause (first observed failure):", "[0]:", "  time      : 2026-12-03_09:00:00", "  host      : node-b",
             "  rank      : 0 (local_rank: 0)", "  exitcode  : 1 (pid: 777)", "  error_file: <N/A>",
             "  traceback : Traceback (most recent call last):", '    File "train.py", line 9, in <module>',
             "  torch.distributed.DistBackendError: [Rank 0] Watchdog caught collective operation timeout: "
             "WorkNCCL(SeqNum=42, OpType=ALLREDUCE) ran for 600000 milliseconds before timing out.", "=" * 60]
    cause = root_cause(block)
    assert cause.fallout and cause.rank == 0 and cause.host == "node-b"
    assert cause.summary().endswith("(itself fallout: another rank hung or died first; the rank heartbeats name it)")
