"""What a scan learned, kept beside watchdog.json (supervise/observe/scan.py, issue 27 item 1): a fold
resumed from the scan file equals the fold of every record (every record sequence of
test_rules, split at every record, and through the engine on files); a NaN in the middle of a
2,000,000-line file is named by a watchdog's first poll, warm after appends, after a truncation
and after the file is replaced, and a cold check-in reads only the file's tail and says what it
left out (issue 35); a corrupt or foreign scan file is ignored with no traceback; check-ins at
once never leave a broken file; a re-attaching watchdog takes the scan up, never a partial one."""
import json
import math
import os
import subprocess
import sys
import time

import pytest

from conftest import SCRIPTS, run_script
from test_rules import SEQUENCES, falling, fold, steps
from supervise.observe import scan as sc
from supervise.contract import TailReader, atomic_write_json
from supervise.judge.assess import assess
from supervise.judge.table import RECORD_RULES, judge
from supervise.observe.observation import Observation, Records, frozen
from supervise.observe.records import RecordRules
from supervise.thresholds import Thresholds
from supervise.vocabulary import SCAN_STATE
from supervise.tools.watch import Watchdog

TH = Thresholds()
START = {"event": "start", "t": 0, "run_id": "r1", "num_labels": 2}

# More sequences: the stateful rules (throughput's baseline and held drop, overfit's evals, the
# stall clock's announced pause, several attempts, FATAL) mid-way through their state.
MORE = [
    ("throughput drop held", steps(20, dt=10) + steps(40, start=210, t0=200, dt=10, sps=60.0), None),
    ("overfit", [r for pair in zip(falling(40)[::8], [{"step": 100 * i, "eval_loss": v} for i, v in
                                                      enumerate([1.0, 0.9, 0.95, 1.0, 1.1], 1)]) for r in pair], None),
    ("expect then steps", steps(5) + [{"event": "expect", "seconds": 90, "why": "eval"}] + steps(5, start=60), None),
    ("three attempts", steps(4) + [dict(START, attempt=2)] + steps(4, start=30) + [dict(START, attempt=3)]
     + steps(3, start=30, loss=math.nan), None),
    ("evals and a FATAL", steps(6) + [{"step": 60, "eval_auroc": 0.8, "eval_acc": 0.7}]
     + [{"step": 65, "t": 6, "FATAL": "CUDA error"}], None),
]
TABLE = [(name, records, start) for name, records, start, *_ in SEQUENCES] + MORE


def state_text(rules) -> str:
    return json.dumps(sc.fold_state(rules), separators=(",", ":"))


def verdict_line(rules) -> str:
    found = {k: a for k, a in rules.hits.items()}
    obs = Observation(now=0, watch_started=0, records=Records(hits=frozen(found), last_step=rules.run.last_step))
    return judge(obs, rules.th).line


@pytest.mark.parametrize("name,records,start", TABLE, ids=[t[0] for t in TABLE])
def test_a_resumed_fold_equals_the_fold_of_every_record(name, records, start):
    """Fold the first k records, keep the fold (JSON and back, as the file holds it), fold the
    rest into a fresh RecordRules restored from it: the whole state (each rule's own, the run's
    recent records, the stall clock, first hits, attempts) and the verdict equal one fold of
    all, for every k."""
    whole = fold(records, start=start)
    for k in range(len(records) + 1):
        first = fold(records[:k], start=start)
        kept = json.loads(state_text(first))
        resumed = RecordRules(TH, RECORD_RULES)
        sc.restore_fold(resumed, kept)
        for rec in records[k:]:
            resumed.add(rec)
        assert state_text(resumed) == state_text(whole), f"{name}: split at {k}"
        assert verdict_line(resumed) == verdict_line(whole)


def write_records(path, records, mode="w"):
    with open(path, mode) as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def look(run):
    """One check-in's look: (observer, verdict), no GPU, no processes."""
    observer, _, verdict = assess(run, gpu=NoGpu())
    return observer, verdict


class NoGpu:
    def read(self):
        from supervise.observe.probes import GpuReport
        return GpuReport(note="no GPU: test")


def facts(observer, verdict) -> tuple:
    r, rules = observer.reader, observer.rules
    return (verdict.line, state_text(rules), r.lines, r.bad_lines)


@pytest.mark.parametrize("name,records,start", TABLE[::3], ids=[t[0] for t in TABLE[::3]])
def test_through_the_engine_a_resumed_look_equals_a_cold_one(name, records, start, tmp_path):
    """The same on files: check-in after part of the records, the rest appended, check-in again
    (resumed from the scan file) equals a check-in with no scan file."""
    run = tmp_path / "run"
    run.mkdir()
    head = [dict(START, **(start or {}))]
    for k in (1, len(records) // 2, len(records)):
        write_records(run / "metrics.jsonl", head + records[:k])
        (run / SCAN_STATE).unlink(missing_ok=True)
        look(run)
        write_records(run / "metrics.jsonl", records[k:], "a")
        observer, verdict = look(run)
        assert observer.scan.note.startswith("resumed at byte"), observer.scan.note
        resumed = facts(observer, verdict)
        (run / SCAN_STATE).unlink()
        observer, verdict = look(run)
        assert observer.scan.note == ""
        assert resumed == facts(observer, verdict), f"{name}: split at {k}"


STEP = '{"step":%d,"t":%d.5,"loss":0.31,"lr":0.0001,"grad_norm":1.1,"sps":812.0}\n'
NAN = '{"step":%d,"t":%d.5,"loss":NaN,"lr":0.0001,"grad_norm":1.1,"sps":812.0}\n'


def big_file(path, lines: int, nan_at: int, run_id="a"):
    with open(path, "w") as f:
        f.write(json.dumps({"event": "start", "t": 0, "run_id": run_id}) + "\n")
        for lo in range(1, lines, 20000):
            f.write("".join((NAN if i == nan_at else STEP) % (i * 10, i) for i in range(lo, min(lo + 20000, lines))))


def append(path, first: int, n: int):
    with open(path, "a") as f:
        f.write("".join(STEP % (i * 10, i) for i in range(first, first + n)))


def watch(run):
    """One watchdog poll (it reads every notable line), then its watchdog.json gone: (observer, verdict)."""
    w = Watchdog(run, Thresholds(poll=1, max_stall=1e9, hard_timeout=1e9, orphan_grace=0), gpu=NoGpu())
    v = w.poll()
    (run / "watchdog.json").unlink(missing_ok=True)
    return w.observer, v


def kept_reader(run) -> dict:
    return json.loads((run / SCAN_STATE).read_bytes())["reader"]


def test_a_nan_in_the_middle_of_2m_lines_cold_warm_truncated_replaced(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    m = run / "metrics.jsonl"
    big_file(m, 2_000_000, 1_000_000)
    size = m.stat().st_size
    assert size > 150e6
    # a cold check-in reads the head and the last scan.WINDOW bytes only (issue 35): the NaN in the
    # middle is left out, and said to be; what it kept says so (a watchdog never takes it up)
    observer, v = look(run)
    assert v.state != "anomaly" and observer.reader.unseen > size - sc.WINDOW - (1 << 20), v.line
    assert observer.reader.bytes_read < sc.WINDOW + (1 << 20)
    assert kept_reader(run)["unseen"] == observer.reader.unseen
    rc, out, err = run_script("checkin.py", run)
    assert rc == 0 and "no watchdog has read it whole: this look left" in out, out + err
    # the watchdog's first poll ignores that scan, reads every notable line, names the NaN, keeps its scan
    observer, v = watch(run)
    assert observer.scan.note.startswith("ignored: a one-shot look kept it without reading"), observer.scan.note
    assert v.kind == "nan" and v.anomaly.step == 10_000_000, v.line
    assert observer.reader.bytes_read > 0.9 * size and kept_reader(run)["unseen"] == 0
    # warm, after appends: only what was appended is read
    append(m, 2_000_000, 500)
    observer, v = look(run)
    assert observer.scan.note == f"resumed at byte {size}"
    assert v.kind == "nan" and v.anomaly.step == 10_000_000, v.line
    assert observer.reader.bytes_read < 64 << 10
    # as a command too
    rc, out, err = run_script("checkin.py", run)
    assert rc == 0 and out.startswith("ANOMALY nan  ") and "at step 10000000" in out, out + err
    assert "this look left" not in out
    # truncated to 1.5 M lines (the NaN stays): the scan is ignored, the file scanned again
    with open(m, "r+b") as f:
        f.truncate(size * 3 // 4)
    observer, v = look(run)
    assert observer.scan.note.startswith("ignored: metrics.jsonl was truncated"), observer.scan.note
    observer, v = watch(run)
    assert v.kind == "nan" and v.anomaly.step == 10_000_000, v.line
    assert observer.reader.bytes_read > 0.5 * size
    # replaced (a new file renamed over it, its NaN elsewhere): ignored, the new NaN named
    big_file(run / "new.jsonl", 2_000_000, 1_500_000, run_id="b")
    os.replace(run / "new.jsonl", m)
    observer, v = watch(run)
    assert observer.scan.note.startswith("ignored: metrics.jsonl was replaced"), observer.scan.note
    assert v.kind == "nan" and v.anomaly.step == 15_000_000, v.line
    # rewritten in place (same inode and size) just before the kept offset: not the bytes it read
    observer, v = look(run)
    assert observer.scan.note.startswith("resumed")
    assert v.kind == "nan" and v.anomaly.step == 15_000_000, v.line
    end = m.stat().st_size
    with open(m, "r+b") as f:
        f.seek(end - 2000)
        tail = f.read()
        f.seek(end - 2000)
        f.write(tail.replace(b'"lr":0.0001', b'"lr":0.0002', 1))
    observer, v = look(run)
    assert observer.scan.note.startswith("ignored: metrics.jsonl changed before the kept offset"), observer.scan.note


def small_run(tmp_path, n=3000, nan_at=1500):
    run = tmp_path / "run"
    run.mkdir()
    with open(run / "metrics.jsonl", "w") as f:
        f.write(json.dumps(START) + "\n")
        f.write("".join((NAN if i == nan_at else STEP) % (i * 10, i) for i in range(1, n)))
    return run


FOREIGN = [
    ("garbage", b"\x00\xff not json at all"),
    ("a json list", b"[1, 2, 3]"),
    ("empty", b""),
    ("torn", None),          # the kept file cut in half
    ("another format", None),
    ("another kind", None),
    ("tampered state", None),
    ("typed wrong, crc right", None),
    ("deep nesting", b"[" * 100000 + b"]" * 100000),
    ("huge", b" " * (5 << 20)),
]


@pytest.mark.parametrize("case,data", FOREIGN, ids=[c[0] for c in FOREIGN])
def test_a_corrupt_or_foreign_scan_file_is_ignored(case, data, tmp_path):
    run = small_run(tmp_path)
    _, cold = look(run)
    assert cold.kind == "nan"
    good = json.loads((run / SCAN_STATE).read_bytes())
    if case == "torn":
        data = (run / SCAN_STATE).read_bytes()[:3000]
    elif case == "another format":
        data = json.dumps(dict(good, format=99)).encode()
    elif case == "another kind":
        data = json.dumps(dict(good, kind="something else")).encode()
    elif case == "tampered state":
        good["state"]["hits"] = {"D": {}}
        data = json.dumps(good).encode()
    elif case == "typed wrong, crc right":
        good["state"]["run"]["last_step"] = "many"
        good["crc"] = __import__("zlib").crc32(json.dumps(good["state"], separators=(",", ":")).encode())
        data = json.dumps(good).encode()
    (run / SCAN_STATE).write_bytes(data)
    observer, v = look(run)
    assert observer.scan.note.startswith("ignored: "), observer.scan.note
    assert v.line == cold.line
    rc, out, err = run_script("checkin.py", run)
    assert rc == 0 and out.startswith("ANOMALY nan  ") and not err, out + err
    assert sc.Scan(run, run / "metrics.jsonl", TH, RECORD_RULES).load() is not None  # written anew


@pytest.mark.parametrize("what", ["directory", "fifo", "symlink_to_dev_zero"])
def test_a_scan_path_that_is_not_a_file_is_ignored(what, tmp_path):
    run = small_run(tmp_path)
    p = run / SCAN_STATE
    if what == "directory":
        p.mkdir()
    elif what == "fifo":
        os.mkfifo(p)
    else:
        p.symlink_to("/dev/zero")
    rc, out, err = run_script("checkin.py", run, timeout=30)
    assert rc == 0 and out.startswith("ANOMALY nan  ") and not err, out + err


def test_check_ins_at_once_never_break_the_scan_file(tmp_path):
    """Six check-ins at once, three times, while records are appended: every one names the
    NaN, none says more than its one output, and the file left is a whole scan."""
    run = small_run(tmp_path, n=20000, nan_at=5000)
    step = 20000
    for _ in range(3):
        ps = [subprocess.Popen([sys.executable, str(SCRIPTS / "checkin.py"), str(run)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True) for _ in range(6)]
        append(run / "metrics.jsonl", step, 300)
        step += 300
        for p in ps:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0 and out.startswith("ANOMALY nan  ") and not err, out + err
        kept = sc.Scan(run, run / "metrics.jsonl", TH, RECORD_RULES)
        assert kept.load() is not None, kept.note
    assert not [n for n in os.listdir(run) if n.startswith(f".{SCAN_STATE}.")]  # no temp file left


def test_a_look_that_skipped_the_middle_keeps_a_scan_no_watchdog_takes_up(tmp_path):
    """With a live watchdog beside the run and no scan file, check-in reads the head and tail
    only: the scan it keeps says how much it did not read; the next check-in takes it up with
    that count (and says so), a watchdog never does (a NaN there would be lost)."""
    run = small_run(tmp_path, n=200_000, nan_at=100_000)
    atomic_write_json(run / "watchdog.json", {"run_dir": str(run), "watchdog_pid": os.getpid(),
                                              "state": "watching", "last_poll": time.time()})
    observer, v = look(run)
    unseen = observer.reader.unseen
    assert unseen > 0 and kept_reader(run)["unseen"] == unseen and v.state != "anomaly"
    append(run / "metrics.jsonl", 200_000, 100)
    observer, _ = look(run)
    assert observer.scan.note.startswith("resumed") and observer.reader.unseen == unseen
    assert observer.reader.bytes_read < 64 << 10
    (run / "watchdog.json").unlink()
    observer, v = watch(run)
    assert observer.scan.note.startswith("ignored: a one-shot look kept it without reading"), observer.scan.note
    assert v.kind == "nan" and v.anomaly.step == 1_000_000, v.line
    observer, v = look(run)   # the watchdog's scan: every record seen
    assert observer.scan.note.startswith("resumed") and observer.reader.unseen == 0 and v.kind == "nan"


def test_a_reattaching_watchdog_takes_up_the_scan(tmp_path):
    run = small_run(tmp_path, n=200_000, nan_at=100_000)
    look(run)  # a check-in kept the scan
    append(run / "metrics.jsonl", 200_000, 100)
    w = Watchdog(run, Thresholds(poll=1, max_stall=1e9, hard_timeout=1e9, orphan_grace=0), gpu=NoGpu())
    v = w.poll()
    r = w.observer.reader
    assert w.observer.scan.note.startswith("resumed"), w.observer.scan.note
    assert v.kind == "nan" and v.anomaly.step == 1_000_000 and r.bytes_read < 64 << 10, (v.line, r.bytes_read)


def test_much_appended_since_is_skimmed_like_the_middle(tmp_path):
    """More than the tail appended since the kept offset: the gap's notable lines (a NaN among
    them) and the tail are read, not every line."""
    run = small_run(tmp_path, n=1000, nan_at=10 ** 9)
    observer, v = look(run)
    assert v.state != "anomaly"
    with open(run / "metrics.jsonl", "a") as f:
        f.write("".join((NAN if i == 60_000 else STEP) % (i * 10, i) for i in range(1000, 100_000)))
    observer, v = look(run)
    assert observer.scan.note.startswith("resumed") and v.kind == "nan" and v.anomaly.step == 600_000, v.line
    assert observer.reader.lines < 2000 and observer.reader.unseen == 0


def test_a_torn_last_line_is_read_whole_by_the_next_look(tmp_path):
    run = small_run(tmp_path, n=100, nan_at=10 ** 9)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step":1000,"t":100.5,"loss":Na')
    look(run)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('N,"lr":0.0001,"grad_norm":1.1,"sps":812.0}\n')
    observer, v = look(run)
    assert observer.scan.note.startswith("resumed") and v.kind == "nan" and v.anomaly.step == 1000, v.line
    assert observer.reader.bad_lines == 0


def test_another_threshold_or_code_is_another_fold(tmp_path):
    run = small_run(tmp_path)
    look(run)
    other = sc.Scan(run, run / "metrics.jsonl", Thresholds(sustain=7), RECORD_RULES)
    assert other.load() is None and other.note.startswith("ignored: another fold")
    same = sc.Scan(run, run / "metrics.jsonl", Thresholds(poll=1, max_stall=10), RECORD_RULES)  # not folded
    assert same.load() is not None


def test_cpu_percent_between_looks_and_over_the_lifetime():
    s = sc.Scan("/nonexistent", "/nonexistent/m", TH, RECORD_RULES)
    assert s.cpu_percent(42, 1000.0, 50.0, 1100.0) == pytest.approx(50.0)     # lifetime: 50 s of 100 s
    assert s.cpu_percent(42, 1000.0, 60.0, 1110.0) == pytest.approx(100.0)    # since: 10 s of 10 s
    assert s.cpu_percent(43, 1105.0, 1.0, 1115.0) == pytest.approx(10.0)      # another process: lifetime
    assert s.cpu_percent(43, 1105.0, None, 1120.0) is None


# ---- issue 35: the one-shot look reads only the tail of a big file; the skim finds what it found
def test_the_skim_by_one_byte_finds_the_lines_the_token_search_finds():
    import random
    from supervise.contract import _notable_lines, _token_lines
    rnd = random.Random(35)
    parts = [b"NaN", b"Infinity", b"null", b"FATAL", b'"eval_auroc"', b'"event"', b"N", b"u", b"v", b"I", b"F",
             b"step", b"\n", b"\n", b"\n", b"1.5", b'"num_tokens"']
    for trial in range(2000):
        data = b"".join(rnd.choice(parts) for _ in range(rnd.randint(0, 4000 if trial % 10 == 0 else 60)))
        assert _notable_lines(data) == _token_lines(data), data


def issue_file(path, lines: int, nan_at=None):
    """The issue's metrics.jsonl (no start record, an eval every 25,000 lines), ``lines`` long."""
    line = json.dumps({"step": 0, "t": 0.0, "loss": 0.4, "lr": 2e-5, "grad_norm": 1.2, "sps": 250.0}) + "\n"
    with open(path, "w") as f:
        for s in range(1, lines + 1):
            f.write(line.replace('"step": 0', f'"step": {s * 10}', 1).replace("0.4", "NaN") if s == nan_at else
                    line.replace('"step": 0', f'"step": {s * 10}', 1))
            if s % 25_000 == 0:
                f.write(json.dumps({"step": s * 10, "eval_auroc": round(0.9 + 0.05 * s / lines, 4), "eval_acc": 0.88}) + "\n")


@pytest.mark.parametrize("window", [None, 1 << 20])
def test_a_bounded_look_reads_the_window_and_says_what_it_left(window, tmp_path):
    """TailReader with a 1 MiB window on a 4 MB file: the head, the notable lines of the last
    MiB and the tail are read, the rest is counted unseen (a NaN there is not folded); with no
    window every notable line is read, the NaN among them."""
    path = tmp_path / "metrics.jsonl"
    issue_file(path, 50_000, nan_at=20_000)
    size = path.stat().st_size
    r = TailReader(str(path), window=window, catchup=1 << 20, head=32 << 10, tail=64 << 10)
    recs = list(r.records())
    nans = [x for x in recs if "loss" in x and not (isinstance(x["loss"], float) and math.isfinite(x["loss"]))]
    evals = [x["step"] for x in recs if "eval_auroc" in x]
    if window is None:
        assert r.unseen == 0 and len(nans) == 1 and evals == [250_000, 500_000]
    else:
        assert len(nans) == 0 and evals == [500_000] and r.unseen == r.unseen_bytes
        assert size - window - (64 << 10) - (32 << 10) - 200 < r.unseen < size - window
        assert r.bytes_read < window + (100 << 10)
    assert r.offset == size and recs[-1]["step"] == 500_000


def test_a_bounded_look_finds_the_last_start_record_in_its_window(tmp_path):
    """An attempt that began inside the window is read from its start record, whole; one that
    began before it is read from the file's head, the middle left out."""
    path = tmp_path / "metrics.jsonl"
    with open(path, "w") as f:
        f.write(json.dumps({"event": "start", "t": 0, "run_id": "a"}) + "\n")
        f.write("".join(STEP % (i * 10, i) for i in range(1, 40_000)))
        f.write(json.dumps({"event": "start", "t": 0, "run_id": "b"}) + "\n")
        f.write("".join(STEP % (i * 10, i) for i in range(1, 5_000)))
    r = TailReader(str(path), window=1 << 20, catchup=1 << 20, head=32 << 10, tail=64 << 10)
    recs = list(r.records())
    assert recs[0].get("run_id") == "b" and r.unseen == 0
    r = TailReader(str(path), window=100 << 10, catchup=1 << 20, head=32 << 10, tail=64 << 10)
    recs = list(r.records())
    assert recs[0].get("run_id") == "a" and r.unseen > 2e6


def rchar() -> int:
    with open("/proc/self/io") as f:
        return int(next(ln for ln in f if ln.startswith("rchar")).split()[1])


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="Linux /proc/self/io")
def test_a_cold_check_in_on_a_big_file_reads_its_tail_only(tmp_path):
    """The issue's file (an eval every 25,000 lines, no start record), 600,000 lines (50 MB) beside
    a progress-bar train.log: a cold check-in reads at most the window and the log's tail, says
    what it left out, and shows the best eval as of what it read; the next one resumes and reads
    only what was appended; a watchdog reads it all, and the check-in after shows the whole best."""
    run = tmp_path / "run"
    run.mkdir()
    issue_file(run / "metrics.jsonl", 600_000)
    with open(run / "train.log", "w") as f:
        f.write("100%|##########| 500/500 [00:10<00:00, 48.1it/s] Loading weights\n" * 100_000)
    size = (run / "metrics.jsonl").stat().st_size
    from supervise.tools import checkin
    r0 = rchar()
    facts = checkin.gather(run, look=assess(run, gpu=NoGpu()))
    read = rchar() - r0
    assert read < sc.WINDOW + (2 << 20), read
    text = checkin.render(facts)
    assert "no watchdog has read it whole: this look left" in text and " of what was read" in text, text
    assert f"eval @{6_000_000}: auroc=0.95" in text   # the last eval, from the tail
    assert facts["unread_mb"] > (size - sc.WINDOW) / 1e6 - 1
    r0 = rchar()
    observer, v = look(run)
    assert observer.scan.note == f"resumed at byte {size}" and rchar() - r0 < 1 << 20
    observer, v = watch(run)
    assert observer.reader.unseen == 0 and v.state != "anomaly"
    facts = checkin.gather(run, look=assess(run, gpu=NoGpu()))
    assert facts["unread_mb"] is None and facts["best_eval"]["step"] == 6_000_000
    assert "this look left" not in checkin.render(facts)
