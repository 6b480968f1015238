"""Bench ~15 real optimizer steps at the real shape, then project the whole run against the
window, before any more code is written. Model mode times a model here; command mode runs the
user's own script for a few steps and reads sps from its metrics.jsonl."""
from __future__ import annotations

import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from supervise.cli import Parser, UsageError, count, duration, front_door, positive_float, positive_int
from supervise.contract import TailReader, is_finite, kind_of
from supervise.vocabulary import BUNDLE, EXIT_ANOMALY, EXIT_OK, METRICS, QUIET


def progress(msg: str) -> None:
    print(f"bench: {msg}", file=sys.stderr, flush=True)


@dataclass
class Measure:
    sps: float                      # samples/s, median over the timed steps
    sps_spread: tuple               # (min, max)
    batch: int
    peak_mem_gb: Optional[float]
    device: str
    eval_sps: Optional[float] = None
    oom_batches: list = field(default_factory=list)
    checkpoint_bytes: Optional[int] = None  # one full save: weights + AdamW moments


def _is_oom(e: BaseException) -> bool:
    return "out of memory" in str(e).lower() or type(e).__name__ == "OutOfMemoryError"


def build_model(model: Optional[str], num_labels: int, seq_len: int, task: str = "classification"):
    """(model, vocabulary size): ``model`` from a path or the hub, else a tiny one built from a
    config, offline (BERT for classification, Llama for a causal LM)."""
    if task == "lm":
        if model:
            from transformers import AutoModelForCausalLM
            m = AutoModelForCausalLM.from_pretrained(model)
            return m, m.config.get_text_config().vocab_size
        from transformers import LlamaConfig, LlamaForCausalLM
        cfg = LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max(seq_len, 8))
        return LlamaForCausalLM(cfg), cfg.vocab_size
    if model:
        from transformers import AutoModelForSequenceClassification
        m = AutoModelForSequenceClassification.from_pretrained(model, num_labels=num_labels)
        return m, m.config.vocab_size
    from transformers import BertConfig, BertForSequenceClassification
    cfg = BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=128, max_position_embeddings=max(seq_len, 8), num_labels=num_labels)
    return BertForSequenceClassification(cfg), cfg.vocab_size


def checkpoint_bytes(model) -> int:
    """Bytes a full checkpoint takes: the weights, and AdamW's two moments of each trained one."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    trained = sum(p.numel() * 4 for p in model.parameters() if p.requires_grad)
    return weights + 2 * trained


def time_steps(model, vocab: int, batch: int, seq_len: int, steps: int, warmup: int, precision: str,
               device) -> list[float]:
    """Seconds of each of ``steps`` real AdamW steps (forward, backward, update) after ``warmup``."""
    import torch
    model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    ids = torch.randint(5, vocab, (batch, seq_len), device=device)
    lm = type(model).__name__.endswith(("CausalLM", "LMHeadModel"))
    labels = ids if lm else torch.randint(0, model.config.num_labels, (batch,), device=device)
    out = []

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for i in range(warmup + steps):
        sync()
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        sync()
        if i >= warmup:
            out.append(time.perf_counter() - t0)
        progress(f"step {i + 1}/{warmup + steps} batch {batch}: {time.perf_counter() - t0:.3f}s")
    return out


def time_eval(model, vocab: int, batch: int, seq_len: int, precision: str, device, passes: int = 5) -> float:
    import torch
    model.eval()
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
    ids = torch.randint(5, vocab, (batch, seq_len), device=device)
    times = []
    with torch.no_grad(), torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
        for _ in range(passes + 1):
            t0 = time.perf_counter()
            model(input_ids=ids)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t0)
    model.train()
    return batch / statistics.median(times[1:])


DEVICE = re.compile(r"^(auto|cpu|cuda|cuda:\d{1,3}|mps)$")


def resolve_device(name: str):
    """'auto' -> cuda when present, else cpu; a device that is not here is a UsageError."""
    import torch
    if not DEVICE.match(name):
        raise UsageError(f"--device {name[:40]!r} is not a device; use auto, cpu, cuda, cuda:N or mps")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise UsageError(f"--device {name}: no CUDA GPU is visible here (torch {torch.__version__}, "
                             f"CUDA build {torch.version.cuda or 'none'}); use --device cpu or run on the GPU machine")
        if device.index is not None and device.index >= n:
            raise UsageError(f"--device {name}: only {n} CUDA device(s) here (cuda:0 to cuda:{n - 1})")
    if device.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        raise UsageError(f"--device {name}: MPS is not available here; use --device cpu")
    return device


def measure_model(*, model: Optional[str] = None, task: str = "classification", num_labels: int = 2,
                  seq_len: int = 128, batch: int = 32, steps: int = 15, warmup: int = 3, precision: str = "fp32",
                  device: str = "auto") -> Measure:
    """~``steps`` timed training steps of the model (``model``: a local path or hub name, else a
    tiny one from a config) at the real ``seq_len``, ``batch`` and ``precision``; an OOM step
    halves the batch and retries."""
    import torch
    device = resolve_device(device)
    model, vocab = build_model(model, num_labels, seq_len, task)
    ooms = []
    while True:
        try:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            times = time_steps(model, vocab, batch, seq_len, steps, warmup, precision, device)
            break
        except Exception as e:  # an OOM step: halve the batch and try again
            if not _is_oom(e) or batch == 1:
                raise
            ooms.append(batch)
            progress(f"out of memory at batch {batch}; retrying at {batch // 2}")
            batch //= 2
            if device.type == "cuda":
                torch.cuda.empty_cache()
    sps = [batch / t for t in times]
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) / 1e9
    else:
        import resource
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # KiB on Linux -> GB
    return Measure(statistics.median(sps), (min(sps), max(sps)), batch, peak, str(device),
                   time_eval(model, vocab, batch * 2, seq_len, precision, device), ooms, checkpoint_bytes(model))


def measure_command(cmd: str, run_dir) -> Measure:
    """The user's own command (~20 steps), its sps read from the records it writes to RUN_DIR."""
    run = Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    progress(f"running {cmd} > {run / 'bench.log'} 2>&1")
    with open(run / "bench.log", "wb") as log:
        p = subprocess.run(shlex.split(cmd), stdout=log, stderr=subprocess.STDOUT,
                           env={**os.environ, "PYTHONUNBUFFERED": "1", **QUIET})
    steps = [r for r in TailReader(str(run / METRICS)).records() if kind_of(r) == "step"]
    sps = [r["sps"] for r in steps[1:] or steps if is_finite(r.get("sps")) and r["sps"] > 0]  # [0]: warm-up
    if not sps:
        raise ValueError(f"the command (exit {p.returncode}) wrote no step record with a positive sps to {run / METRICS}; "
                         f"see {run / 'bench.log'}")
    start = next((r for r in TailReader(str(run / METRICS)).records() if kind_of(r) == "start"), {})
    batch = start.get("batch_size")
    return Measure(statistics.median(sps), (min(sps), max(sps)), int(batch) if is_finite(batch) else 0, None, "command")


def project(m: Measure, samples: int, epochs: float, eval_samples: int, window: Optional[float],
            preprocess_rate: Optional[float]) -> dict:
    train = samples * epochs / m.sps
    evals = eval_samples * max(epochs, 1) / m.eval_sps if m.eval_sps and eval_samples else 0.0
    prep = samples / preprocess_rate if preprocess_rate else 0.0
    total = train + evals + prep
    out = {"train_s": train, "eval_s": evals, "preprocess_s": prep, "total_s": total, "window_s": window}
    if window:
        left = window - evals - prep
        fit = max(0, int(left * m.sps / epochs)) if left > 0 else 0
        out.update(fits=total <= window, max_samples=min(fit, samples), fraction=min(1.0, fit / samples))
    return out


def _h(s: float) -> str:
    return f"{s / 3600:.2f} h" if s >= 600 else f"{s:.0f} s"


def report(m: Measure, p: dict, *, samples: int, epochs: float, eval_samples: int = 0,
           preprocess_rate: Optional[float] = None, precision: Optional[str] = None,
           seq_len: Optional[int] = None) -> str:
    """The bench's text: what was measured, the projection ``p`` (``project``), the verdict.
    ``precision`` and ``seq_len`` are shown for a model bench (None: a command's)."""
    lines = [f"device {m.device}, batch {m.batch}" + (f", precision {precision}, seq_len {seq_len}" if precision else ""),
             f"samples/s: median {m.sps:.1f} (spread {m.sps_spread[0]:.1f}-{m.sps_spread[1]:.1f})"]
    if m.oom_batches:
        lines.append(f"out of memory at batch {', '.join(map(str, m.oom_batches))}: largest batch that fits = {m.batch}")
    if m.peak_mem_gb is not None:
        lines.append(f"peak memory: {m.peak_mem_gb:.2f} GB ({'CUDA max allocated' if m.device.startswith('cuda') else 'RSS'})")
    if m.checkpoint_bytes:
        import shutil
        try:
            free = f"; {shutil.disk_usage('.').free / 1e9:.1f} GB free here"
        except OSError:
            free = ""
        lines.append(f"checkpoint: {m.checkpoint_bytes / 1e9:.3g} GB per save (weights + AdamW moments){free}")
    lines.append(f"train: {samples:,} x {epochs:g} epochs / {m.sps:.1f} sps = {_h(p['train_s'])}")
    if p["eval_s"]:
        lines.append(f"eval: {eval_samples:,} x {max(epochs, 1):g} / {m.eval_sps:.1f} sps = {_h(p['eval_s'])}")
    if p["preprocess_s"]:
        lines.append(f"preprocess: {samples:,} / {preprocess_rate:g} rows/s = {_h(p['preprocess_s'])}")
    total = f"total: {_h(p['total_s'])}"
    if p["window_s"]:
        total += f" against a window of {_h(p['window_s'])}"
        lines.append(total)
        lines.append("FITS" if p["fits"] else f"DOES NOT FIT: subsample to {p['max_samples']:,} samples "
                     f"({p['fraction']:.0%}) before writing more code")
    else:
        lines.append(total + " (give --window to get a verdict)")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = Parser(prog="bench.py", description="Bench ~15 real training steps and project the run's time against "
               "the window: FITS, or DOES NOT FIT with the largest sample count that fits.")
    p.add_argument("--model", help="a local path or hub name, loaded for --task [--config tiny: BERT, or Llama for lm]")
    p.add_argument("--task", choices=["classification", "lm"], default="classification",
                   help="a sequence classifier, or a causal LM (labels = the input ids) (default: classification)")
    p.add_argument("--config", choices=["tiny"], default="tiny", help="an offline model built from a config (default: tiny)")
    p.add_argument("--seq-len", type=positive_int, default=128, help="tokens per sample (default: 128)")
    p.add_argument("--batch", type=positive_int, default=32, help="per-device batch (default: 32)")
    p.add_argument("--precision", choices=["fp32", "fp16", "bf16"], default="fp32", help="autocast dtype (default: fp32)")
    p.add_argument("--device", default="auto", help="cuda, cuda:1, cpu (default: cuda when present)")
    p.add_argument("--steps", type=positive_int, default=15, help="timed steps (default: 15)")
    p.add_argument("--warmup", type=count, default=3, help="untimed first steps (default: 3)")
    p.add_argument("--num-labels", type=positive_int, default=2, help="classes (default: 2)")
    p.add_argument("--samples", type=positive_int, default=100_000, metavar="N", help="training samples of the full run (default: 100000)")
    p.add_argument("--epochs", type=positive_float, default=1.0, metavar="E", help="epochs (default: 1)")
    p.add_argument("--eval-samples", type=count, default=0, metavar="M", help="eval samples per epoch (default: 0)")
    p.add_argument("--window", type=duration, help="the GPU window, e.g. 8h")
    p.add_argument("--preprocess-rate", type=positive_float, metavar="ROWS_PER_S", help="tokenization/preprocessing rows/s")
    p.add_argument("--cmd", help='command mode: your script for ~20 steps, e.g. "python -u train.py --max-steps 20 --out runs/bench"')
    p.add_argument("--run-dir", help="command mode: the run directory the command writes")
    p.add_argument("--json", action="store_true", help="one JSON object instead of text")
    return front_door(p, lambda a: _main(p, a), argv)


def _main(p, a) -> int:
    if a.cmd is not None and not a.cmd.strip():
        p.error("--cmd is empty; give the command that runs your script for ~20 steps")
    if a.cmd and not (a.run_dir or "").strip():
        p.error("--cmd needs --run-dir (the folder its metrics.jsonl goes to)")
    if a.cmd and os.path.exists(a.run_dir) and not os.path.isdir(a.run_dir):
        p.error(f"--run-dir {a.run_dir} is a file; pass the folder the command writes its metrics.jsonl to")
    try:
        m = measure_command(a.cmd, a.run_dir) if a.cmd else measure_model(
            model=a.model, task=a.task, num_labels=a.num_labels, seq_len=a.seq_len, batch=a.batch, steps=a.steps,
            warmup=a.warmup, precision=a.precision, device=a.device)
    except ImportError as e:
        bundle = shlex.quote(str(BUNDLE) + "[hf]")
        raise UsageError(f"model mode needs torch and transformers ({e.name} missing): pip install -e "
              f"{bundle} and a torch build for your GPU")
    except (ValueError, OSError) as e:
        raise UsageError(f"{(str(e).splitlines() or [type(e).__name__])[0]}")
    except (RuntimeError, MemoryError) as e:  # e.g. a shape that cannot be allocated on this device
        raise UsageError(f"the bench step failed: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}; "
              "try a smaller --batch or --seq-len")
    proj = project(m, a.samples, a.epochs, a.eval_samples, a.window, a.preprocess_rate)
    if a.json:
        print(json.dumps({**asdict(m), **proj}))
    else:
        print(report(m, proj, samples=a.samples, epochs=a.epochs, eval_samples=a.eval_samples,
                     preprocess_rate=a.preprocess_rate, precision=None if a.cmd else a.precision,
                     seq_len=None if a.cmd else a.seq_len))
    return EXIT_ANOMALY if proj.get("fits") is False else EXIT_OK
