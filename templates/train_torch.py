"""Train a small text classifier with a hand-written PyTorch loop, writing the telemetry
contract that scripts/watchdog.py reads. One file: copy it into your repository.

Launch in the background, on ONE physical line (newlines collapse into spaces in background shells):

    mkdir -p runs/torch && PYTHONUNBUFFERED=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error TOKENIZERS_PARALLELISM=false python -u train_torch.py --out runs/torch > runs/torch/train.log 2>&1

Several processes (rank 0 writes the telemetry; sps is global across ranks; gloo on a CPU):

    torchrun --nproc_per_node 2 train_torch.py --out runs/ddp

Smoke preflight first (2,000 samples, 1 epoch, eval every 20 steps):

    python -u train_torch.py --out runs/smoke --smoke

With no flags it trains a bag-of-embeddings + GRU classifier on a generated sentiment task
(offline, a CPU, well under two minutes); --data FILE (CSV/JSONL with text and label columns)
switches to your data. TensorBoard: tensorboard --logdir runs/torch/tb --port 6006, then from a
laptop ssh -N -L 6006:localhost:6006 you@gpu-host and open http://localhost:6006.

RUN_DIR (--out) receives metrics.jsonl, checkpoints/ (best two by AUROC, state dicts),
tb/, and final_val_metrics.json last: the completion sentinel.
"""
import argparse
import json
import math
import os
import random
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

# ----------------------------------------------------------------------------- config
OUT = "runs/torch"
DATA = None              # None: the generated task; else a CSV/JSONL with TEXT_COL and LABEL_COL
EVAL_DATA = None
TEXT_COL = "text"
LABEL_COL = "label"
NUM_LABELS = 2
SAMPLES = 6000
EVAL_SAMPLES = 600
EVAL_FRACTION = 0.1
EPOCHS = 2
BATCH = 32               # per process
LR = 1e-2
MAX_LEN = 32
MAX_STEPS = -1           # -1: EPOCHS decide
LOGGING_STEPS = 10
EVAL_STEPS = 50
MAX_GRAD_NORM = 1.0
PRECISION = "fp32"       # fp32 | fp16 | bf16: autocast on the device
KEEP = 2                 # checkpoints kept, best AUROC first
DIM = 64
SEED = 0
SMOKE = False
# -----------------------------------------------------------------------------


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=OUT, help="run directory [%(default)s]")
    p.add_argument("--model", default=None, help="a state dict (.pt) to start from [fresh weights]")
    p.add_argument("--data", default=DATA, help="CSV/JSONL with text and label columns [generated]")
    p.add_argument("--eval-data", default=EVAL_DATA, help="separate eval CSV/JSONL [hold out from --data]")
    p.add_argument("--text-col", default=TEXT_COL)
    p.add_argument("--label-col", default=LABEL_COL)
    p.add_argument("--num-labels", type=int, default=NUM_LABELS)
    p.add_argument("--samples", type=int, default=SAMPLES)
    p.add_argument("--eval-samples", type=int, default=EVAL_SAMPLES)
    p.add_argument("--epochs", type=int, default=EPOCHS)
    p.add_argument("--batch", type=int, default=BATCH)
    p.add_argument("--lr", type=float, default=LR)
    p.add_argument("--max-len", type=int, default=MAX_LEN)
    p.add_argument("--max-steps", type=int, default=MAX_STEPS)
    p.add_argument("--logging-steps", type=int, default=LOGGING_STEPS)
    p.add_argument("--eval-steps", type=int, default=EVAL_STEPS)
    p.add_argument("--max-grad-norm", type=float, default=MAX_GRAD_NORM)
    p.add_argument("--precision", choices=["fp32", "fp16", "bf16"], default=PRECISION)
    p.add_argument("--keep", type=int, default=KEEP, help="checkpoints kept; 0 saves none")
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--smoke", action="store_true", default=SMOKE)
    a = p.parse_args()
    if a.smoke:
        a.samples, a.epochs, a.eval_steps = 2000, 1, 20
        a.batch = min(a.batch, 16)  # ~125 steps: enough to see the loss leave chance
        a.eval_samples = min(a.eval_samples, 400)
    return a


# ----------------------------------------------------------------------------- data
POSITIVE = "good great excellent superb lovely delightful brilliant wonderful fantastic pleasant".split()
NEGATIVE = "bad awful terrible poor dreadful horrible boring nasty dismal painful".split()
NEUTRAL = ("the a movie film plot actor scene story it was is and with of to in this that very "
           "quite rather so really at times some parts ending music camera script cast").split()


def generated_task(n, seed):
    """Reviews of neutral words around one sentiment word, negated one time in ten ("not
    good" is negative); label 1 = positive."""
    rng = random.Random(seed)
    texts, labels = [], []
    for _ in range(n):
        label = rng.randint(0, 1)
        negate = rng.random() < 0.1
        word = rng.choice(POSITIVE if label != negate else NEGATIVE)
        words = [rng.choice(NEUTRAL) for _ in range(rng.randint(6, 14))]
        words.insert(rng.randrange(len(words) + 1), f"not {word}" if negate else word)
        texts.append(" ".join(words))
        labels.append(label)
    return texts, labels


def read_table(path, text_col, label_col):
    import pandas as pd
    df = pd.read_json(path, lines=True) if path.endswith(".jsonl") else pd.read_csv(path)
    missing = [c for c in (text_col, label_col) if c not in df.columns]
    if missing:
        sys.exit(f"error: {path} has no column {missing[0]!r}; columns are {list(df.columns)} "
                 f"(use --text-col / --label-col)")
    labels = [int(v) if isinstance(v, float) and v.is_integer() else v for v in df[label_col].tolist()]
    return df[text_col].astype(str).tolist(), labels


def check_labels(labels, num_labels, split, label_col):
    """Fail loud before training: integer labels in [0, num_labels), every class present."""
    bad = sorted({repr(v) for v in labels if isinstance(v, bool) or not isinstance(v, int)
                  or not 0 <= v < num_labels}, key=str)[:5]
    if bad:
        sys.exit(f"error: label column {label_col!r} in {split} holds {', '.join(bad)}; labels must be "
                 f"integers in [0, {num_labels}) (set --num-labels or map the labels)")
    found = sorted(set(labels))
    if len(found) < num_labels:
        sys.exit(f"error: label column {label_col!r} in {split} holds only {found}; every class "
                 f"0..{num_labels - 1} must be present (check the split or the sampling)")


def load_data(a):
    if a.data is None:
        texts, labels = generated_task(a.samples + a.eval_samples, a.seed)
        return (texts[:a.samples], labels[:a.samples]), (texts[a.samples:], labels[a.samples:])
    texts, labels = read_table(a.data, a.text_col, a.label_col)
    if a.eval_data:
        ev_x, ev_y = read_table(a.eval_data, a.text_col, a.label_col)
        return (texts[:a.samples], labels[:a.samples]), (ev_x[:a.eval_samples], ev_y[:a.eval_samples])
    order = list(range(len(texts)))
    random.Random(a.seed).shuffle(order)
    n_eval = max(1, int(len(order) * EVAL_FRACTION))
    ev, tr = order[:n_eval], order[n_eval:][:a.samples]
    return ([texts[i] for i in tr], [labels[i] for i in tr]), ([texts[i] for i in ev], [labels[i] for i in ev])


def encode(texts, vocab, max_len):
    ids = torch.zeros(len(texts), max_len, dtype=torch.long)  # 0 = padding, 1 = unknown
    for i, t in enumerate(texts):
        toks = [vocab.get(w, 1) for w in t.lower().split()][:max_len]
        ids[i, :len(toks)] = torch.tensor(toks, dtype=torch.long)
    return ids


class Classifier(nn.Module):
    def __init__(self, vocab_size, dim, num_labels):
        super().__init__()
        self.emb = nn.Embedding(vocab_size, dim, padding_idx=0)
        self.rnn = nn.GRU(dim, dim, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * dim, num_labels)

    def forward(self, ids):
        h, _ = self.rnn(self.emb(ids))
        mask = (ids != 0).unsqueeze(-1).float()
        pooled = (h * mask).sum(1) / mask.sum(1).clamp(min=1)
        return self.head(pooled)


def load_checkpoint(path):
    """Rebuild the model a checkpoint was saved from (smoke.py's strict reload check)."""
    ckpt = torch.load(path, map_location="cpu")
    model = Classifier(len(ckpt["vocab"]), ckpt["dim"], ckpt["num_labels"])
    model.load_state_dict(ckpt["model"], strict=True)
    return model


# ----------------------------------------------------------------------------- telemetry
class Telemetry:
    """The contract: one JSON object per line in RUN_DIR/metrics.jsonl, one os.write per line
    (flushed as it is written); only rank 0 writes."""

    def __init__(self, run_dir, enabled):
        self.enabled = enabled
        self.t0 = time.time()
        self.fd = os.open(os.path.join(run_dir, "metrics.jsonl"),
                          os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if enabled else None

    def write(self, **rec):
        if self.enabled:
            rec.setdefault("t", round(time.time() - self.t0, 3))
            os.write(self.fd, (json.dumps(rec) + "\n").encode())


def atomic_write_json(path, obj):
    fd, tmp = tempfile.mkstemp(prefix=".tmp.", dir=os.path.dirname(path) or ".")
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def auroc(scores, labels):
    """Rank AUROC (Mann-Whitney U, ties averaged) of scores for class 1: no extra dependency."""
    order = sorted(range(len(scores)), key=scores.__getitem__)
    ranks = [0.0] * len(scores)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and scores[order[j + 1]] == scores[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    pos = sum(1 for y in labels if y == 1)
    neg = len(labels) - pos
    if pos == 0 or neg == 0:
        return float("nan")
    return (sum(r for r, y in zip(ranks, labels) if y == 1) - pos * (pos + 1) / 2) / (pos * neg)


@torch.no_grad()
def evaluate(model, ids, labels, device, batch=256):
    model.eval()
    logits = torch.cat([model(ids[i:i + batch].to(device)).float().cpu() for i in range(0, len(ids), batch)])
    model.train()
    probs = logits.softmax(-1)
    y = torch.tensor(labels)
    if probs.shape[1] == 2:
        auc = auroc(probs[:, 1].tolist(), labels)
    else:  # one-vs-rest, averaged
        auc = sum(auroc(probs[:, c].tolist(), [int(v == c) for v in labels]) for c in range(probs.shape[1])) / probs.shape[1]
    return {"eval_auroc": auc, "eval_acc": (probs.argmax(-1) == y).float().mean().item(),
            "eval_loss": F.cross_entropy(logits, y).item()}


# ----------------------------------------------------------------------------- main
def main():
    a = parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank = dist.get_rank() if world > 1 else 0
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    torch.manual_seed(a.seed)
    os.makedirs(os.path.join(a.out, "checkpoints"), exist_ok=True)

    (tr_x, tr_y), (ev_x, ev_y) = load_data(a)
    check_labels(tr_y, a.num_labels, "train", a.label_col)
    check_labels(ev_y, a.num_labels, "eval", a.label_col)
    vocab = {"<pad>": 0, "<unk>": 1}
    for t in tr_x:
        for w in t.lower().split():
            vocab.setdefault(w, len(vocab))
    tr_ids, ev_ids = encode(tr_x, vocab, a.max_len), encode(ev_x, vocab, a.max_len)
    tr_lab = torch.tensor(tr_y)

    model = Classifier(len(vocab), DIM, a.num_labels).to(device)
    if a.model:
        model.load_state_dict(torch.load(a.model, map_location=device)["model"], strict=True)
    ddp = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(a.precision)
    scaler = torch.amp.GradScaler(device.type, enabled=a.precision == "fp16")

    steps_per_epoch = len(tr_ids) // (a.batch * world)
    total = a.max_steps if a.max_steps > 0 else steps_per_epoch * a.epochs
    tel = Telemetry(a.out, rank == 0)
    tel.write(event="start", t=0, pid=os.getpid(), total_steps=total, num_labels=a.num_labels,
              world_size=world, batch_size=a.batch)
    tb = None
    if rank == 0:
        try:
            from torch.utils.tensorboard import SummaryWriter
            tb = SummaryWriter(os.path.join(a.out, "tb"))
        except ImportError:
            pass

    saved = []  # (auroc, step, path), best first
    step, t_last, step_last, losses = 0, time.time(), 0, []
    gen = torch.Generator().manual_seed(a.seed)
    while step < total:
        order = torch.randperm(len(tr_ids), generator=gen)  # the same on every rank
        for b in range(steps_per_epoch):
            if step >= total:
                break
            idx = order[(b * world + rank) * a.batch:(b * world + rank + 1) * a.batch]
            ids, y = tr_ids[idx].to(device), tr_lab[idx].to(device)
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                loss = F.cross_entropy(ddp(ids).float(), y)
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), a.max_grad_norm).item()  # pre-clip
            scaler.step(opt)
            scaler.update()
            step += 1
            losses.append(loss.item())
            if not math.isfinite(losses[-1]) or not math.isfinite(grad_norm):
                bad = ("loss", losses[-1]) if not math.isfinite(losses[-1]) else ("grad_norm", grad_norm)
                reason = f"non-finite {bad[0]} {bad[1]} at step {step}"
                tel.write(step=step, FATAL=reason)
                raise FloatingPointError(reason + "; lower --lr or check the inputs")
            if step % a.logging_steps == 0:
                now = time.time()
                sps = (step - step_last) * a.batch * world / max(now - t_last, 1e-9)  # global
                mean_loss = sum(losses) / len(losses)
                tel.write(step=step, loss=mean_loss, lr=opt.param_groups[0]["lr"], grad_norm=grad_norm,
                          sps=round(sps, 2), epoch=round(step / steps_per_epoch, 3))
                if tb:
                    tb.add_scalar("train/loss", mean_loss, step)
                    tb.add_scalar("train/grad_norm", grad_norm, step)
                    tb.add_scalar("train/sps", sps, step)
                losses = []
            if step % a.eval_steps == 0 or step == total:
                t_eval = time.time()
                if rank == 0:
                    m = evaluate(model, ev_ids, ev_y, device)
                    tel.write(step=step, **m)
                    if tb:
                        tb.add_scalar("eval/auroc", m["eval_auroc"], step)
                    if a.keep > 0:
                        path = os.path.join(a.out, "checkpoints", f"step-{step}.pt")
                        torch.save({"model": model.state_dict(), "vocab": vocab, "dim": DIM,
                                    "num_labels": a.num_labels, "step": step, **m}, path + ".tmp")
                        os.replace(path + ".tmp", path)
                        saved = sorted(saved + [(m["eval_auroc"], step, path)], key=lambda s: (-s[0], -s[1]))
                        for _, _, old in saved[a.keep:]:
                            os.remove(old)
                        saved = saved[:a.keep]
                if world > 1:
                    dist.barrier()
                t_last += time.time() - t_eval  # eval time is not training time
            if step % a.logging_steps == 0:
                t_last, step_last = time.time(), step

    if rank == 0:
        best = saved[0][2] if saved else None
        if best:
            model.load_state_dict(torch.load(best, map_location=device)["model"], strict=True)
        final = evaluate(model, ev_ids, ev_y, device)
        atomic_write_json(os.path.join(a.out, "final_val_metrics.json"), {
            **final, "step": step, "best_checkpoint": best, "seconds": round(time.time() - tel.t0, 1),
            "world_size": world})
        if tb:
            tb.close()
        print(f"done: eval_auroc={final['eval_auroc']:.4f} best={best}", flush=True)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
