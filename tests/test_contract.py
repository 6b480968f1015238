"""The contract: the validator names line and field; the tail reader reads only what was
appended and survives what real files hold."""
import math
import os

import pytest

from fake_trainer import MetricsWriter
from supervise.contract import TailReader, atomic_write_json, read_json, tail_lines, \
    validate_file, validate_record

STEP = {"step": 10, "t": 1.5, "loss": 0.6, "lr": 1e-4, "grad_norm": 1.2, "sps": 90.0}


@pytest.mark.parametrize("rec,problem", [
    (STEP, None),
    ({**STEP, "loss": float("nan")}, None),                 # valid in shape: the rules catch it
    ({**STEP, "grad_norm": None}, None),
    ({"step": 250, "eval_auroc": 0.91, "eval_acc": 0.85, "eval_loss": 0.3}, None),
    ({"event": "start", "t": 0, "pid": 12}, None),         # a partial start record is fine
    ({"step": 3, "t": 1.0, "FATAL": "non-finite loss"}, None),
    *[({k: v for k, v in STEP.items() if k != name}, None) for name in ("lr", "grad_norm", "sps")],  # not measured
    ({k: v for k, v in STEP.items() if k != "t"}, "step record lacks field 't'"),
    ({**STEP, "lr": "0.001"}, "step field 'lr' = '0.001' is not a number"),
    ({**STEP, "step": 1.5}, "step field 'step' = 1.5 is not a integer"),
    ({"step": 250, "eval_loss": 2.1}, None),               # v0.2: any eval_* metric
    ({"step": 250, "eval_auroc": "x"}, "eval field 'eval_auroc' = 'x' is not a number"),
    ({"eval_loss": 2.1}, "eval record lacks field 'step'"),
    ({"event": "expect", "seconds": 600, "why": "eval"}, None),
    ({"event": "start", "t": 0, "run_id": "ab12", "attempt": 2, "task": "lm", "vocab_size": 32000}, None),
    ({"epoch": 1}, "not a start, step, eval or FATAL record"),
    ([1, 2], "not a JSON object"),
])
def test_validate_record(rec, problem):
    problems = validate_record(rec)
    if problem is None:
        assert problems == []
    else:
        assert any(problem in p for p in problems), problems


def test_validate_file_names_the_line(tmp_path):
    f = tmp_path / "metrics.jsonl"
    f.write_text('{"event":"start","t":0}\n{"step":1,"t":0,"loss":0.7,"lr":0,"grad_norm":1,"sps":3}\n'
                 'Epoch 1: 10%|#\n{"step":2,"loss":0.7,"lr":0,"grad_norm":1}\n{"step":3')
    problems = validate_file(f)
    assert problems[0].startswith("line 3: not JSON")
    assert problems[1] == "line 4: step record lacks field 't'"
    assert problems[2] == "line 5: torn (no newline at the end of the file)"


def test_writer_round_trip_keeps_nonfinite_values(tmp_path):
    w = MetricsWriter(tmp_path / "m.jsonl")
    w.start(total_steps=100, num_labels=2)
    w.step(10, float("nan"), 1e-4, float("inf"), 50.0)
    w.eval(10, 0.5, 0.5)
    w.fatal(10, "non-finite loss")
    w.close()
    recs = list(TailReader(str(tmp_path / "m.jsonl")).records())
    assert [r.get("event", "") for r in recs][0] == "start" and recs[0]["pid"] == os.getpid()
    assert math.isnan(recs[1]["loss"]) and recs[1]["grad_norm"] == math.inf
    assert recs[3]["FATAL"] == "non-finite loss"
    assert validate_file(tmp_path / "m.jsonl") == []


def test_tail_reader_reads_only_what_was_appended(tmp_path):
    f = tmp_path / "m.jsonl"
    f.write_bytes(b'{"step": 1, "loss": NaN}\n' * 1000)
    r = TailReader(str(f))
    assert len(list(r.records())) == 1000
    first = r.bytes_read
    with open(f, "ab") as fh:
        fh.write(b'{"step": 2, "loss": Infinity, "grad_norm": null}\n')
    recs = list(r.records())
    assert len(recs) == 1 and recs[0]["loss"] == math.inf and recs[0]["grad_norm"] is None
    assert r.bytes_read - first == len(b'{"step": 2, "loss": Infinity, "grad_norm": null}\n')
    assert list(r.records()) == []  # nothing new, nothing read
    assert r.bytes_read - first == 49


def test_torn_line_is_buffered_not_garbage(tmp_path):
    f = tmp_path / "m.jsonl"
    f.write_bytes(b'{"step": 1, "loss": 0.5}\n{"step": 2, "lo')
    r = TailReader(str(f))
    assert [x["step"] for x in r.records()] == [1]
    assert r.torn and r.bad_lines == 0
    with open(f, "ab") as fh:
        fh.write(b'ss": 0.4}\n')
    assert [x["step"] for x in r.records()] == [2]
    assert not r.torn and r.bad_lines == 0


def test_garbage_is_counted_and_skipped(tmp_path):
    f = tmp_path / "m.jsonl"
    f.write_bytes(b'not json\n{"step": 1, "loss": 0.5}\n[1,2]\n\n  \n{"step": 2, "loss": 0.4}\n\xff\xfe\n')
    r = TailReader(str(f))
    assert [x["step"] for x in r.records()] == [1, 2]
    assert r.bad_lines == 3 and r.last_bad


def test_overlong_line_is_dropped_with_bounded_memory(tmp_path):
    f = tmp_path / "m.jsonl"
    f.write_bytes(b"x" * 3000 + b"\n" + b'{"step": 1, "loss": 0.5}\n')
    r = TailReader(str(f), chunk=512, max_line=1024)
    assert [x["step"] for x in r.records()] == [1]
    assert r.bad_lines == 1


@pytest.mark.parametrize("how", ["truncate", "replace", "rewrite_longer"])
def test_truncated_or_replaced_file_starts_over(how, tmp_path):
    f = tmp_path / "m.jsonl"
    f.write_bytes(b'{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.5}\n')
    r = TailReader(str(f))
    assert len(list(r.records())) == 2
    new = b'{"step": 7, "loss": 0.3}\n'
    if how == "truncate":
        with open(f, "r+b") as fh:
            fh.truncate(0)
        f.write_bytes(new)
    elif how == "replace":
        tmp = tmp_path / "new"
        tmp.write_bytes(new)
        os.replace(tmp, f)
    else:  # same inode, rewritten in place with more bytes than before
        with open(f, "r+b") as fh:
            fh.write(new * 5)
    assert [x["step"] for x in r.records()][0] == 7
    assert r.resets == 1


def test_missing_file_is_not_an_error(tmp_path):
    r = TailReader(str(tmp_path / "absent.jsonl"))
    assert list(r.records()) == []


def test_tail_lines_reads_a_bounded_end(tmp_path):
    f = tmp_path / "log"
    f.write_bytes(b"".join(b"line %d\n" % i for i in range(100000)))
    assert tail_lines(f, 3, max_bytes=100) == [b"line 99997", b"line 99998", b"line 99999"]


def test_atomic_write_leaves_no_temp(tmp_path):
    atomic_write_json(tmp_path / "s.json", {"a": 1})
    atomic_write_json(tmp_path / "s.json", {"a": 2})
    assert read_json(tmp_path / "s.json") == {"a": 2}
    assert os.listdir(tmp_path) == ["s.json"]


@pytest.mark.parametrize("line,expect", [
    # every value in a record is untrusted: coerce it, or drop the record and count it
    ('{"step": 1e400, "t": 1, "loss": 0.5}', None),
    ('{"step": NaN, "t": 1, "loss": 0.5}', None),
    ('{"step": "abc", "t": 1, "loss": 0.5}', None),
    ('{"step": null, "t": 1, "loss": 0.5}', None),
    ('{"t": 1, "loss": 0.5}', None),
    ('{"step": null, "eval_auroc": 0.9}', None),
    ('{"step": 5, "t": 1, "loss": "abc"}', None),
    ('{"step": "7", "t": "x", "loss": "0.5"}', {"step": 7, "t": None, "loss": 0.5}),
    ('{"step": "x", "t": 1, "FATAL": 42}', {"step": None, "FATAL": "42"}),
    ('{"event": "start", "t": 0, "pid": 1e400, "num_labels": "two", "batch_size": "8"}',
     {"pid": None, "num_labels": None, "batch_size": 8}),
    ('{"step": 3, "t": 1, "loss": 1e400, "grad_norm": null}', {"loss": math.inf, "grad_norm": None}),
    ('{"step": 3, "eval_auroc": "high", "eval_loss": 2}', {"eval_auroc": None, "eval_loss": 2.0}),
    ('{"event": "expect", "seconds": "forever"}', None),
    ('[' * 100000 + ']' * 100000, None),
])
def test_tail_reader_coerces_or_skips_untrusted_values(tmp_path, line, expect):
    f = tmp_path / "metrics.jsonl"
    f.write_text(line + "\n" + '{"step": 9, "t": 2, "loss": 0.4}\n')
    r = TailReader(str(f))
    recs = list(r.records())
    assert recs[-1]["step"] == 9  # the reader goes on after any line
    if expect is None:
        assert len(recs) == 1 and r.bad_lines == 1
    else:
        assert len(recs) == 2 and r.bad_lines == 0
        assert {k: recs[0][k] for k in expect} == expect


@pytest.mark.parametrize("make", ["fifo", "link_to_fifo", "link_to_dev_zero", "directory"])
def test_non_regular_files_are_refused_without_blocking(tmp_path, make):
    f = tmp_path / "metrics.jsonl"
    if make == "fifo":
        os.mkfifo(f)
    elif make == "link_to_fifo":
        os.mkfifo(tmp_path / "pipe")
        f.symlink_to(tmp_path / "pipe")
    elif make == "link_to_dev_zero":
        f.symlink_to("/dev/zero")
    else:
        f.mkdir()
    r = TailReader(str(f))
    assert list(r.records()) == [] and "not a regular file" in r.error
    assert read_json(f) is None and tail_lines(f, 5) == []


def test_reattach_reads_head_notable_lines_and_tail(tmp_path):
    """A long file: the run's start and baseline from the head, every NaN/FATAL/eval line of the
    middle, and the tail in full; an older attempt before the last start record is not read."""
    f = tmp_path / "metrics.jsonl"
    step = '{"step": %d, "t": %d, "loss": 0.5, "lr": 0.001, "grad_norm": 1.0, "sps": 100}\n'
    with open(f, "w") as out:
        out.write('{"event": "start", "t": 0, "run_id": "old"}\n' + '{"step": 1, "t": 0, "FATAL": "old"}\n')
        out.write('{"event": "start", "t": 0, "run_id": "new"}\n')
        for i in range(1, 200001):
            out.write(step % (i, i) if i != 150000 else '{"step": %d, "eval_auroc": 0.2}\n' % i)
    r = TailReader(str(f), catchup=1 << 20, head=64 << 10, tail=64 << 10)
    recs = list(r.records())
    assert recs[0]["run_id"] == "new" and not any("FATAL" in x for x in recs)
    assert any(x.get("eval_auroc") == 0.2 for x in recs)
    assert recs[-1]["step"] == 200000 and r.skipped_bytes > f.stat().st_size / 2
    assert len(recs) < 10000 and r.bad_lines == 0
    f.open("a").write(step % (200001, 1))
    assert [x["step"] for x in r.records()] == [200001]


def test_a_one_shot_reader_reads_head_and_tail_only(tmp_path):
    f = tmp_path / "metrics.jsonl"
    step = '{"step": %d, "t": %d, "loss": 0.5, "lr": 0.001, "grad_norm": 1.0, "sps": 100}\n'
    with open(f, "w") as out:
        out.write('{"event": "start", "t": 0, "run_id": "r"}\n')
        out.write("".join(step % (i, i) for i in range(1, 100001)))
    r = TailReader(str(f), catchup=1 << 20, head=16 << 10, tail=16 << 10, notable=False)
    recs = list(r.records())
    assert recs[0]["run_id"] == "r" and recs[-1]["step"] == 100000 and r.bad_lines == 0
    assert r.bytes_read < 64 << 10 and len(recs) < 1000
