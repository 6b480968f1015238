"""Checkpoints you can trust and the disk they fill, on real files and real processes: a real HF
Trainer killed with SIGKILL during a save, real torch/Lightning files, a real writer filling a
48 MB tmpfs (mounted here: the machines and CI run as root)."""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, assert_checkin_agrees, kind_of, missing, need, run_script, start_script, wait_for
from supervise.observe.checkpoints import (CheckpointWatch, checkpoint_dirs, choose_resume, declared_keep, examine,
                                   find_checkpoints, remaining_saves, resume_lines, rule_disk)
from supervise.observe.logs import enospc_line, log_tail
from supervise.thresholds import Thresholds

WRITER = ROOT / "tests" / "ckpt_writer.py"
MB = 1_000_000


@pytest.fixture
def tmpfs(tmp_path):
    """make(size) mounts a tmpfs of that size under tmp_path and returns it; unmounted at the end.
    Skips when this user may not mount (the disk tests need root, as CI and these machines have)."""
    mounted = []

    def make(size="48m", name="vol"):
        d = tmp_path / name
        d.mkdir()
        try:
            p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)],
                               capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError) as e:
            missing(f"cannot mount a tmpfs ({e}): the disk tests need root and mount(8)")
        if p.returncode != 0:
            missing(f"cannot mount a tmpfs ({p.stderr.strip() or 'mount failed'}): the disk tests need root")
        mounted.append(d)
        return d

    yield make
    for d in reversed(mounted):
        if subprocess.run(["umount", str(d)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(d)], capture_output=True)


# ---------------------------------------------------------------------------------------------
# A real HF Trainer, killed with SIGKILL in the middle of its third save
# ---------------------------------------------------------------------------------------------
HF_RUN = r'''
import os, signal, sys
import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint


class Pairs(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return {"input_ids": torch.tensor([3, 4, 5, 6]), "attention_mask": torch.ones(4, dtype=torch.long),
                "labels": torch.tensor(i % 2)}


class KilledDuringSave(Trainer):
    """kill -9 at step KILL_AT, between the optimizer's file and trainer_state.json of the save."""

    def _save_rng_state(self, output_dir):
        if self.state.global_step == int(os.environ.get("KILL_AT", "0")):
            os.kill(os.getpid(), signal.SIGKILL)
        super()._save_rng_state(output_dir)


def trainer(out):
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1,
                                                     num_attention_heads=2, intermediate_size=32,
                                                     max_position_embeddings=16, num_labels=2))
    args = TrainingArguments(output_dir=out, max_steps=8, save_steps=2, per_device_train_batch_size=8,
                             report_to="none", disable_tqdm=True, logging_steps=2)
    return KilledDuringSave(model=model, args=args, train_dataset=Pairs())


out = sys.argv[1]
if sys.argv[2] == "train":
    trainer(out).train()
else:   # resume from what get_last_checkpoint picks, then from the path given
    print("get_last_checkpoint:", get_last_checkpoint(out), flush=True)
    try:
        trainer(out).train(resume_from_checkpoint=get_last_checkpoint(out))
        print("resumed from get_last_checkpoint", flush=True)
    except Exception as e:
        print(f"get_last_checkpoint failed: {type(e).__name__}: {e}", flush=True)
    t = trainer(out)
    t.train(resume_from_checkpoint=sys.argv[3])
    print(f"resumed from {sys.argv[3]} to step {t.state.global_step}", flush=True)
'''


def python(*args, env=None, timeout=120):
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def hf_killed(tmp_path_factory):
    """A real Trainer run saving every 2 steps, SIGKILLed during the save of step 6."""
    need("transformers")
    d = tmp_path_factory.mktemp("hf")
    script = d / "hf_run.py"
    script.write_text(HF_RUN)
    p = python(script, d / "out", "train", env={"KILL_AT": "6"})
    assert p.returncode == -9, p.stderr[-2000:]
    return script, d / "out"


def test_real_trainer_killed_during_a_save_resumes_from_the_previous_checkpoint(hf_killed):
    script, out = hf_killed
    found = find_checkpoints([out])
    assert [(Path(c.path).name, c.step, c.layout, c.complete) for c in found] == \
        [("checkpoint-2", 2, "hf", True), ("checkpoint-4", 4, "hf", True), ("checkpoint-6", 6, "hf", False)]
    assert found[2].why == "still being written or torn: trainer_state.json missing"
    assert all(c.bytes > 16000 for c in found)   # the weights and the optimizer, at least

    chosen, skipped = choose_resume(found, None)
    assert Path(chosen.path).name == "checkpoint-4"
    assert [(Path(c.path).name, why) for c, why in skipped] == \
        [("checkpoint-6", "incomplete: still being written or torn: trainer_state.json missing")]
    lines = resume_lines(*choose_resume(found, None), None)
    assert lines[0] == f"resume from: {out / 'checkpoint-4'} (step 4, {chosen.bytes / 1e3:.1f} kB, complete)"
    assert lines[1].startswith(f"  skipped {out / 'checkpoint-6'} (step 6, ") and "trainer_state.json missing" in lines[1]

    # The Trainer's own pick is the torn one and fails; ours resumes (a copy: the run stays as it was).
    copy = out.parent / "resume"
    shutil.copytree(out, copy)
    p = python(script, copy, "resume", copy / "checkpoint-4")
    assert p.returncode == 0, p.stderr[-2000:]
    assert f"get_last_checkpoint: {copy / 'checkpoint-6'}" in p.stdout
    assert "get_last_checkpoint failed: FileNotFoundError" in p.stdout and "trainer_state.json" in p.stdout
    assert "resumed from" in p.stdout and "to step 8" in p.stdout


def _truncate(name, keep):
    def do(d):
        path = d / name
        path.write_bytes(path.read_bytes()[:keep if keep >= 0 else path.stat().st_size // 2])
    return do


def _shard(d, drop=False):
    """model.safetensors split into two shards and an index, as save_pretrained does for a big model."""
    from safetensors.numpy import load_file, save_file
    tensors = load_file(str(d / "model.safetensors"))
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(d / shard))
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: s for s, keys in shards.items() for k in keys}}))
    (d / "model.safetensors").unlink()
    if drop:
        (d / "model-00002-of-00002.safetensors").unlink()


def _torch_bin(d, torn=False):
    torch = need("torch")
    from safetensors.torch import load_file
    torch.save(load_file(str(d / "model.safetensors")), d / "pytorch_model.bin")
    (d / "model.safetensors").unlink()
    if torn:
        _truncate("pytorch_model.bin", -1)(d)


@pytest.mark.parametrize("damage, why", [
    (lambda d: None, ""),
    (_truncate("model.safetensors", -1), "still being written or torn: model.safetensors is "),
    (_truncate("model.safetensors", 4), "model.safetensors is 4 bytes, shorter than its 8-byte header length"),
    (_truncate("model.safetensors", 0), "model.safetensors is 0 bytes, shorter than its 8-byte header length"),
    (lambda d: (d / "model.safetensors").unlink(), "still being written or torn: model.safetensors missing"),
    (lambda d: (d / "trainer_state.json").unlink(), "still being written or torn: trainer_state.json missing"),
    (_truncate("trainer_state.json", -1), "trainer_state.json does not parse (JSONDecodeError)"),
    (_truncate("optimizer.pt", -1), "optimizer.pt is not a readable zip"),
    (lambda d: (d / "model.safetensors").rename(d / "adapter_model.safetensors"), ""),   # PEFT
    (_shard, ""),
    (lambda d: _shard(d, drop=True), "still being written or torn: model-00002-of-00002.safetensors missing"),
    (_torch_bin, ""),
    (lambda d: _torch_bin(d, torn=True), "pytorch_model.bin is not a readable zip"),
], ids=["as-saved", "weights-half", "weights-4-bytes", "weights-empty", "weights-gone", "state-gone",
        "state-half", "optimizer-half", "peft-adapter", "sharded", "shard-gone", "bin", "bin-half"])
def test_a_real_hf_checkpoint_is_complete_only_when_whole(hf_killed, tmp_path, damage, why):
    need("safetensors")
    d = tmp_path / "checkpoint-4"
    shutil.copytree(hf_killed[1] / "checkpoint-4", d)
    damage(d)
    c = examine(d)
    assert (c.step, c.layout, c.complete) == (4, "hf", not why)
    assert why in c.why and (c.why == "") == (why == ""), c.why


# ---------------------------------------------------------------------------------------------
# Poisoned checkpoints: written at or after the first non-finite record
# ---------------------------------------------------------------------------------------------
def _hf_save(folder: Path, step: int, mb: float = 0.01, state=True):
    from safetensors.numpy import save_file
    import numpy as np
    folder.mkdir(parents=True)
    save_file({"w": np.ones(int(mb * MB / 4), dtype=np.float32)}, str(folder / "model.safetensors"))
    if state:
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))


@pytest.mark.parametrize("saves, torn, first_bad, chosen, skipped", [
    ([50, 70], [], 60, 50, ["70: poisoned: written at step 70 >= first non-finite record at step 60"]),
    ([50, 70], [], None, 70, []),
    ([50, 70], [], 70, 50, ["70: poisoned: written at step 70 >= first non-finite record at step 70"]),
    ([50, 70], [], 50, None, ["70: poisoned: written at step 70 >= first non-finite record at step 50",
                              "50: poisoned: written at step 50 >= first non-finite record at step 50"]),
    ([30, 50, 70], [50], 60, 30, ["70: poisoned: written at step 70 >= first non-finite record at step 60",
                                  "50: incomplete: still being written or torn: trainer_state.json missing"]),
    ([], [], 60, None, []),
])
def test_resume_skips_torn_and_poisoned_checkpoints(tmp_path, saves, torn, first_bad, chosen, skipped):
    need("safetensors")
    for s in saves:
        _hf_save(tmp_path / f"checkpoint-{s}", s, state=s not in torn)
    got, why = choose_resume(find_checkpoints([tmp_path]), first_bad)
    assert (got.step if got else None) == chosen
    assert [f"{c.step}: {w}" for c, w in why] == skipped
    lines = resume_lines(got, why, first_bad)
    if chosen is None:
        assert lines[0].startswith("resume from: none (") and lines[0].endswith("the relaunch starts fresh")
    else:
        assert lines[0].startswith(f"resume from: {tmp_path / f'checkpoint-{chosen}'} (step {chosen}, ")


def test_torch_lightning_and_template_files(tmp_path):
    torch = need("torch")
    d = tmp_path / "ck"
    d.mkdir()
    m = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(m.parameters())
    m(torch.ones(1, 4)).sum().backward()
    opt.step()   # AdamW's state holds a tensor "step": not the checkpoint's
    torch.save({"model": m.state_dict(), "optimizer": opt.state_dict(), "state": {"step": 150}, "step": 150},
               d / "last.pt")                                                        # train_torch.py's
    torch.save({"model": m.state_dict(), "step": 100}, d / "best.pt")
    (d / ".tmp.last.pt").write_bytes((d / "last.pt").read_bytes()[:100])             # a save cut short
    torch.save({"epoch": 0, "global_step": 50, "state_dict": m.state_dict()}, d / "epoch=0-step=50.ckpt")
    torch.save({"epoch": 1, "global_step": 90, "state_dict": m.state_dict()}, d / "last.ckpt", pickle_protocol=4)
    torch.save({"model": m.state_dict(), "optimizer": opt.state_dict(), "iter_num": 2000}, d / "ckpt.pt")  # nanoGPT
    torch.save(m.state_dict(), d / "weights.pth")
    (d / "torn_step7.pt").write_bytes((d / "weights.pth").read_bytes()[:-30])
    (d / "notes.txt").write_text("not a checkpoint")
    got = {Path(c.path).name: (c.layout, c.step, c.complete) for c in find_checkpoints([d])}
    assert got == {"last.pt": ("template", 150, True), "best.pt": ("template", 100, True),
                   ".tmp.last.pt": ("template", None, False), "epoch=0-step=50.ckpt": ("lightning", 50, True),
                   "last.ckpt": ("lightning", 90, True), "ckpt.pt": ("torch", 2000, True),
                   "weights.pth": ("torch", None, True), "torn_step7.pt": ("torch", 7, False)}
    assert [Path(c.path).name for c in find_checkpoints([d])] == [
        ".tmp.last.pt", "weights.pth", "torn_step7.pt", "epoch=0-step=50.ckpt", "last.ckpt", "best.pt", "last.pt",
        "ckpt.pt"]   # oldest step first; unknown steps first, by mtime
    by = {Path(c.path).name: c for c in find_checkpoints([d])}
    assert by["torn_step7.pt"].why.startswith("still being written or torn: torn_step7.pt is not a readable zip")
    assert by[".tmp.last.pt"].why == "temporary name: written under it, then renamed into place"
    chosen, skipped = choose_resume(by.values(), 120)
    assert Path(chosen.path).name == "best.pt"
    assert [(Path(c.path).name, why) for c, why in skipped] == [
        ("ckpt.pt", "poisoned: written at step 2000 >= first non-finite record at step 120"),
        ("last.pt", "poisoned: written at step 150 >= first non-finite record at step 120")]
    assert choose_resume([by["weights.pth"]], None)[0] == by["weights.pth"]
    none, [(_, why)] = choose_resume([by["weights.pth"]], 120)
    assert none is None and why.startswith("poisoned?: its step is unknown, so it cannot be shown to predate")


def test_template_hf_staging_names_are_never_complete(tmp_path):
    need("safetensors")
    ck = tmp_path / "checkpoints"
    _hf_save(ck / "checkpoint-50", 50)
    _hf_save(ck / ".staging" / "checkpoint-100", 100)             # being written by TemplateTrainer
    _hf_save(ck / ".ready-checkpoint-100", 100)                   # written, not renamed yet
    _hf_save(ck / ".trash-checkpoint-20", 20)                     # an old one on its way out
    _hf_save(ck / "tmp-checkpoint-120", 120)                      # transformers 4.4x's temporary name
    got = [(Path(c.path).name, c.step, c.complete, c.layout) for c in find_checkpoints([ck])]
    assert got == [(".trash-checkpoint-20", 20, False, "template"), ("checkpoint-50", 50, True, "hf"),
                   ("checkpoint-100", 100, False, "template"), (".ready-checkpoint-100", 100, False, "template"),
                   ("tmp-checkpoint-120", 120, False, "hf")]
    chosen, skipped = choose_resume(find_checkpoints([ck]), None)
    assert Path(chosen.path).name == "checkpoint-50" and len(skipped) == 3
    assert all(why.startswith(("incomplete: temporary name", "incomplete: staging folder")) for _, why in skipped)


# ---------------------------------------------------------------------------------------------
# Where the checkpoints are
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("explicit, start, make, expected", [
    (["/data/ck"], {"checkpoint_dir": "/elsewhere"}, True, ["/data/ck"]),
    ([], {"checkpoint_dir": "/out/hf"}, True, ["/out/hf"]),
    ([], {"checkpoint_dir": ["out/a", "/abs/b", "out/a"], "cwd": "/work/proj"}, False, ["/work/proj/out/a", "/abs/b"]),
    ([], {}, True, ["RUN/checkpoints"]),
    ([], {"checkpoint_dir": 5}, True, ["RUN/checkpoints"]),
    ([], None, False, []),
], ids=["explicit-first", "start-record", "start-list-relative", "template-folder", "bad-field", "nothing"])
def test_checkpoint_dirs(tmp_path, explicit, start, make, expected):
    if make:
        (tmp_path / "checkpoints").mkdir()
    got = checkpoint_dirs(tmp_path, start, explicit)
    assert got == [Path(str(e).replace("RUN", str(tmp_path))) for e in expected]


def test_declared_keep(tmp_path):
    assert declared_keep(tmp_path, {"save_total_limit": 2}) == 3     # the new one is written before the old goes
    assert declared_keep(tmp_path, {"checkpoint_keep": 4}) == 4
    assert declared_keep(tmp_path, {}) is None
    (tmp_path / "hparams.json").write_text(json.dumps({"keep": 2}))  # the templates' --keep
    assert declared_keep(tmp_path, {}) == 2


# ---------------------------------------------------------------------------------------------
# The probe and the rule, on a real 48 MB file system filled by a real writer
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def writer(trainer):
    """start(run, ckpt_dir, *flags): tests/ckpt_writer.py as a real process; its train.log beside
    the volume (a full disk could not take the traceback). ``.failed()``: its log says ENOSPC."""
    def start(run: Path, ckpt: Path, *args):
        w = trainer(run, "--ckpt-dir", ckpt, *args, script=WRITER)
        w.failed = lambda: enospc_line(w.log_path.read_text().splitlines()) is not None
        return w
    return start


def _poll_until(watch, w, th, total_steps, until):
    """Poll every 50 ms while the writer lives; (anomaly, state, writer alive, writer failed) at the
    first anomaly, or (None, last state, ...) when ``until(state)`` holds or the writer ends."""
    def look():
        st = watch.poll(time.time())
        step = max((c.step for c in st.checkpoints if c.step is not None), default=0)
        found = rule_disk(st, th, remaining_saves(st, total_steps, step), step)
        if found is not None or until(st) or w.proc.poll() is not None:
            return found, st, w.proc.poll() is None, w.failed()
        return None
    return wait_for(look, "the writer to fill the disk or finish", timeout=60)


@pytest.mark.parametrize("total_known, th, said", [
    (False, Thresholds(), "free space = {free} < next save 6.0 MB x 1.5 margin on {vol} at step {step}. "
                          "Delete or rotate old checkpoints (save_total_limit=2), or move the checkpoints to "
                          "another volume, before the next save fails."),
    (True, Thresholds(disk_min_saves=3), "free space = {free} < {n} remaining saves x 6.0 MB (every save kept) = "),
], ids=["next-save", "remaining-saves"])
def test_a_disk_filling_up_is_caught_before_any_save_fails(tmpfs, tmp_path, writer, total_known, th, said):
    vol = tmpfs("48m")
    w = writer(tmp_path / "run", vol / "out", "--every", 1, "--mb", 6, "--keep", 0, "--saves", 20)
    watch = CheckpointWatch([vol / "out"])
    found, st, alive, failed = _poll_until(watch, w, th, 200 if total_known else None, lambda st: False)
    assert found is not None, (st, w.log_path.read_text()[-2000:])
    assert alive and not failed, w.log_path.read_text()[-2000:]
    assert found.kind == "disk" and found.message.startswith("ANOMALY disk: free space = ")
    from supervise.observe.checkpoints import size
    step = max(c.step for c in st.checkpoints)
    assert found.step == step
    assert said.format(free=size(st.free_bytes), vol=vol, step=step, n=f"{(200 - step) / 10:.0f}") in found.message
    # the probe's figures
    n = len(st.checkpoints)
    assert 6 * MB <= st.bytes_per_save <= 6.01 * MB and st.steps_per_save == 10
    assert st.saves == n and st.kept_bytes >= n * 6 * MB and not st.rotating and st.deleted == 0
    assert 1800 <= st.saves_per_hour <= 5400   # one a second, give or take a busy machine
    assert st.mount == str(vol) and 48 * 2**20 - 1 <= st.total_bytes <= 48 * 2**20
    assert st.first_save_at == min(c.mtime for c in st.checkpoints)
    assert (n <= 7) if total_known is False else (n <= 5)   # the projection sees it sooner
    # the writer really was about to fail: let it run out of space, and the log says so
    w.proc.wait(timeout=60)
    assert w.proc.returncode == 1 and w.failed()
    assert "No space left on device" in enospc_line(log_tail(w.log_path))


def test_a_rotating_writer_never_fills_the_disk(tmpfs, tmp_path, writer):
    vol = tmpfs("48m")
    w = writer(tmp_path / "run", vol / "out", "--every", 1, "--mb", 6, "--keep", 2, "--saves", 10)
    watch = CheckpointWatch([vol / "out"])
    found, st, alive, failed = _poll_until(watch, w, Thresholds(disk_min_saves=2), 200, lambda st: False)
    assert found is None, found.message
    assert w.proc.wait(timeout=30) == 0 and not failed   # 10 saves of 6 MB: 60 MB through a 48 MB disk
    st = watch.poll(time.time())
    assert [c.step for c in st.checkpoints] == [90, 100]
    assert st.rotating and st.keep in (2, 3) and st.deleted >= 8 and st.saves == 10
    assert 6 * MB <= st.bytes_per_save <= 6.01 * MB and st.kept_bytes <= 2 * 6.01 * MB
    assert rule_disk(st, Thresholds(), remaining_saves(st, 1000, 100), 100) is None


def test_probe_sees_saves_in_place_and_files_still_being_written(tmp_path):
    """A plain loop overwriting ckpt.pt (nanoGPT) rotates by itself; a trainer_state.json created
    empty and filled later turns its checkpoint complete at the next poll."""
    torch = need("torch")
    need("safetensors")
    d = tmp_path / "out"
    d.mkdir()
    watch = CheckpointWatch([d])
    torch.save({"iter_num": 100, "w": torch.ones(1000)}, d / "ckpt.pt")
    st = watch.poll(time.time())
    assert (st.saves, st.rotating, st.checkpoints[0].step) == (1, False, 100)
    time.sleep(0.02)
    torch.save({"iter_num": 200, "w": torch.ones(1000)}, d / "ckpt.pt")   # in place: the folder's mtime stays
    st = watch.poll(time.time())
    assert (st.saves, st.deleted, st.rotating, st.keep, st.checkpoints[0].step) == (2, 1, True, 1, 200)

    _hf_save(d / "checkpoint-300", 300, state=False)
    (d / "checkpoint-300" / "trainer_state.json").write_text("")          # created, not yet written
    st = watch.poll(time.time())
    assert st.checkpoints[-1].complete is False and "trainer_state.json does not parse" in st.checkpoints[-1].why
    (d / "checkpoint-300" / "trainer_state.json").write_text('{"global_step": 300}')
    st = watch.poll(time.time())
    assert st.checkpoints[-1].complete and st.saves == 3


@pytest.mark.parametrize("code, expected", [
    ("import json; json.dump(list(range(10**6)), open(D + '/a.json', 'w'))", "OSError: [Errno 28] No space left on device"),
    ("import torch; torch.save({'w': torch.zeros(2_000_000)}, D + '/a.pt')", "unexpected pos"),
    ("import torch; torch.save({'w': torch.zeros(2_000_000)}, D + '/a.pt', _use_new_zipfile_serialization=False)",
     "failed with No space left on device"),
    ("import numpy as np; from safetensors.numpy import save_file; save_file({'w': np.ones(2_000_000, np.float32)}, "
     "D + '/m.safetensors')", "No space left on device (os error 28)"),
    ("import numpy as np; np.save(D + '/a.npy', np.zeros(2_000_000))", "requested and"),
], ids=["json", "torch.save", "torch.save-legacy", "safetensors", "numpy"])
def test_enospc_line_finds_what_a_full_disk_prints(tmpfs, tmp_path, code, expected):
    vol = tmpfs("1m")
    log = tmp_path / "train.log"
    with open(log, "wb") as f:
        p = subprocess.run([sys.executable, "-c", f"D = {str(vol)!r}; print('step 10', flush=True); {code}"],
                           stdout=f, stderr=subprocess.STDOUT, timeout=120)
    assert p.returncode == 1
    line = enospc_line(log_tail(log))
    assert line is not None and expected in line, log.read_text()[-1500:]


@pytest.mark.parametrize("log", ["torchrun_raise_record.log", "torchrun_sigkill.log"])
def test_enospc_line_is_silent_on_other_failures(log):
    assert enospc_line(log_tail(ROOT / "tests" / "data" / log)) is None


# ---------------------------------------------------------------------------------------------
# The watchdog and check-in, end to end
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("flags, said", [   # each row turns the other rule off: one can fire
    (["--disk-min-saves", "2"], "remaining saves x 6.0 MB (every save kept)"),    # projected after 2 saves
    (["--disk-min-saves", "1000"], "< next save 6.0 MB x 1.5 margin"),           # never projected: the next save
], ids=["projected", "next-save"])
def test_watchdog_on_a_writer_filling_a_48mb_disk_exits_7_while_it_lives(tmpfs, tmp_path, writer, flags, said):
    vol = tmpfs("48m")
    run = tmp_path / "run"
    w = writer(run, vol / "out", "--every", 1, "--mb", 6, "--keep", 0, "--saves", 20)   # every save kept
    wd = start_script("watchdog.py", run, "--poll", "0.2", "--startup-grace", "60", *flags)
    out, err = wd.communicate(timeout=90)
    alive, failed = w.proc.poll() is None, w.failed()
    assert wd.returncode == 7 and out.startswith("ANOMALY disk: free space = "), out + err
    assert alive and not failed, w.log_path.read_text()[-2000:]    # before any write failed
    assert f" on {vol} at step " in out and said in out, out
    assert_checkin_agrees(run, out.strip())


def test_watchdog_on_a_writer_rotating_through_a_48mb_disk_is_ok_done(tmpfs, tmp_path, writer):
    vol = tmpfs("48m")
    run = tmp_path / "run"
    w = writer(run, vol / "out", "--every", 1, "--mb", 6, "--keep", 2, "--saves", 10)   # 60 MB through 48 MB
    wd = start_script("watchdog.py", run, "--poll", "0.2", "--disk-min-saves", "2")
    out, err = wd.communicate(timeout=90)
    assert wd.returncode == 0 and out.startswith("OK done"), out + err
    assert not w.failed() and w.proc.wait(timeout=30) == 0, w.log_path.read_text()[-2000:]


def test_a_crash_on_a_full_disk_is_disk_and_checkin_relaunches_only_once_there_is_room(tmpfs, tmp_path, writer):
    """An old run's 14 MB fills the volume; the second 6 MB save dies on ENOSPC. Check-in names the
    last whole checkpoint but gives no relaunch into the full volume, only what to free; once the
    old file is gone, the relaunch from that checkpoint."""
    vol = tmpfs("24m")
    (vol / "old-run.bin").write_bytes(b"\0" * (14 << 20))
    run = tmp_path / "run"
    w = writer(run, vol / "out", "--every", 0.2, "--mb", 6, "--keep", 0, "--saves", 5)
    assert w.proc.wait(timeout=60) == 1 and w.failed()   # the second save ran out of space
    rc, out, err = run_script("watchdog.py", run, "--poll", "0.2", "--orphan-grace", "0.5")
    assert rc == 7, out + err
    assert out.startswith("ANOMALY disk: log line = ") and "No space left on device" in out, out
    rc, out, err = run_script("checkin.py", run)
    assert rc == 0 and kind_of(out.splitlines()[1]) == "disk", out + err
    assert f"resume from: {vol / 'out' / 'checkpoint-10'} (step 10, 6.0 MB, complete)" in out, out
    assert f"  skipped {vol / 'out' / 'checkpoint-20'} (step 20, " in out and "model.safetensors" in out, out
    assert f"next: no relaunch line until there is room: free at least " in out and f" on {vol} " in out, out
    assert "next: cd " not in out and "--resume_from_checkpoint" not in out, out
    rc, out, err = run_script("checkin.py", run, "--json")
    disk = json.loads(out)["disk"]
    assert rc == 0 and disk.startswith("disk: ") and f" on {vol}; 2 checkpoints = 6.0 MB" in disk, disk
    (vol / "old-run.bin").unlink()
    rc, out, err = run_script("checkin.py", run)
    assert rc == 0 and kind_of(out.splitlines()[1]) == "disk", out + err
    assert "next: cd " in out and f"--resume_from_checkpoint {vol / 'out' / 'checkpoint-10'}\n" in out, out


def test_checkin_after_nan_at_60_resumes_from_the_save_at_50(tmp_path):
    need("safetensors")
    run, out = tmp_path / "run", tmp_path / "out"
    for s in (50, 70):
        _hf_save(out / f"checkpoint-{s}", s)
    run.mkdir()
    recs = [{"event": "start", "t": 0, "pid": 999999, "total_steps": 100, "num_labels": 2, "checkpoint_dir": str(out),
             "argv": ["train.py", "--output_dir", str(out)], "cwd": str(tmp_path)}]
    recs += [{"step": s, "t": s / 10, "loss": 0.5 if s < 60 else float("nan"), "lr": 1e-3, "grad_norm": 1.0,
              "sps": 100.0} for s in range(10, 80, 10)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    rc, text, err = run_script("checkin.py", run)
    assert rc == 0 and kind_of(text.splitlines()[1]) == "nan", text + err
    assert text.splitlines()[1].startswith("ANOMALY nan: loss = nan is not finite at step 60. "), text
    assert f"resume from: {out / 'checkpoint-50'} (step 50, " in text, text
    assert f"  skipped {out / 'checkpoint-70'} (step 70, 10.1 kB): poisoned: written at step 70 >= first " \
           "non-finite record at step 60" in text, text
