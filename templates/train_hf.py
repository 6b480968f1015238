"""Fine-tune a sequence classifier with the Hugging Face Trainer (transformers v5), writing the
telemetry contract that scripts/watchdog.py reads. Run it in the background, on ONE physical line:

    mkdir -p runs/hf && PYTHONUNBUFFERED=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error TOKENIZERS_PARALLELISM=false python -u train_hf.py --out runs/hf >> runs/hf/train.log 2>&1

After a crash, a kill or a preemption, the same line with --resume continues from the last
checkpoint (the Trainer's resume_from_checkpoint; a new attempt in the same metrics.jsonl;
without a checkpoint it starts fresh):

    PYTHONUNBUFFERED=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error TOKENIZERS_PARALLELISM=false python -u train_hf.py --out runs/hf --resume >> runs/hf/train.log 2>&1

Smoke preflight first (2,000 samples, 1 epoch, eval every 20 steps):

    python -u train_hf.py --out runs/smoke --smoke

With no flags it trains a tiny BERT built from a config on a generated sentiment task (offline,
a CPU, under two minutes); --model PATH_OR_NAME and --data FILE (CSV/JSON/JSONL with text and
label columns) switch to real ones. TensorBoard: tensorboard --logdir runs/hf/tb --port 6006,
then from a laptop ssh -N -L 6006:localhost:6006 you@gpu-host and open http://localhost:6006.

RUN_DIR (--out) receives metrics.jsonl, hparams.json (the resolved config), checkpoints/
(checkpoint-N: the last and the best by AUROC, two at most; each written under a temporary
name and renamed into place), tb/, and final_val_metrics.json last: the completion sentinel.
The records are written by Telemetry and TrainerTelemetry, the installed package's
(supervise.telemetry, supervise.hf) when it is importable, else the verbatim copies at the end
of this file (the config, the training loop and its helpers come first).
TrainerTelemetry reads each micro-batch's raw loss (and logging_nan_inf_filter=False lets the
Trainer's own log show a NaN too); sps is Telemetry.step's: samples per second across all
ranks since the last step record, evals and checkpoint saves left out.
"""
import argparse
import math
import os
import random
import shutil
import sys
import time

import torch
from transformers import (AutoModelForSequenceClassification, AutoTokenizer, BertConfig,
                          BertForSequenceClassification, Trainer, TrainerCallback, TrainingArguments,
                          set_seed)

# ----------------------------------------------------------------------------- config
OUT = "runs/hf"          # the run directory
MODEL = None             # None: a tiny BERT from a config; else a local path or hub name
DATA = None              # None: the generated task; else a CSV/JSON/JSONL with TEXT_COL and LABEL_COL
EVAL_DATA = None         # None: hold out EVAL_FRACTION of DATA
TEXT_COL = "text"
LABEL_COL = "label"
NUM_LABELS = 2
SAMPLES = 6000           # training rows (generated task) or a cap on DATA's rows
EVAL_SAMPLES = 600
EVAL_FRACTION = 0.1
EPOCHS = 2
BATCH_SIZE = 32          # per device and micro-step
GRAD_ACCUM = 1           # micro-steps per optimizer step (an OOM relaunch halves the batch, doubles this)
LR = 2e-3                # tiny models from scratch like it high; use ~2e-5 for a pretrained model
WARMUP_STEPS = 20        # linear warm-up, then linear decay
MAX_LEN = 32
MAX_STEPS = -1           # -1: EPOCHS decide
LOGGING_STEPS = 10       # a step record every this many optimizer steps
EVAL_STEPS = 50          # an eval record (and a checkpoint) every this many steps
MAX_GRAD_NORM = 1.0
PRECISION = "fp32"       # fp32 | fp16 | bf16 (GPU)
KEEP = 2                 # checkpoints kept: 2 = last + best, 1 = last, 0 = none
SEED = 0
SMOKE = False            # --smoke: 2,000 samples, 1 epoch, eval every 20 steps, batch <= 16
RESUME = False           # --resume: continue from the last checkpoint in --out
# -----------------------------------------------------------------------------


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=OUT, help="run directory [%(default)s]")
    p.add_argument("--model", default=MODEL, help="local path or hub name [tiny BERT from a config]")
    p.add_argument("--data", default=DATA, help="CSV/JSON/JSONL with text and label columns [generated]")
    p.add_argument("--eval-data", default=EVAL_DATA, help="separate eval file [hold out from --data]")
    p.add_argument("--text-col", default=TEXT_COL)
    p.add_argument("--label-col", default=LABEL_COL)
    p.add_argument("--num-labels", type=int, default=NUM_LABELS)
    p.add_argument("--samples", type=int, default=SAMPLES)
    p.add_argument("--eval-samples", type=int, default=EVAL_SAMPLES)
    p.add_argument("--epochs", type=float, default=EPOCHS)
    p.add_argument("--batch-size", "--batch", type=int, default=BATCH_SIZE, help="per device [%(default)s]")
    p.add_argument("--grad-accum", type=int, default=GRAD_ACCUM, help="micro-steps per step [%(default)s]")
    p.add_argument("--lr", type=float, default=LR)
    p.add_argument("--warmup-steps", type=int, default=WARMUP_STEPS)
    p.add_argument("--max-len", type=int, default=MAX_LEN)
    p.add_argument("--max-steps", type=int, default=MAX_STEPS)
    p.add_argument("--logging-steps", type=int, default=LOGGING_STEPS)
    p.add_argument("--eval-steps", type=int, default=EVAL_STEPS)
    p.add_argument("--max-grad-norm", type=float, default=MAX_GRAD_NORM)
    p.add_argument("--precision", choices=["fp32", "fp16", "bf16"], default=PRECISION)
    p.add_argument("--keep", type=int, choices=[0, 1, 2], default=KEEP, help="checkpoints kept [%(default)s]")
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--smoke", action="store_true", default=SMOKE)
    p.add_argument("--resume", action="store_true", default=RESUME, help="continue from the last checkpoint")
    a = p.parse_args()
    for name in ("batch_size", "grad_accum", "logging_steps", "eval_steps"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, not {getattr(a, name)}")
    if a.smoke:
        a.samples, a.epochs, a.eval_steps = 2000, 1, 20
        a.batch_size = min(a.batch_size, 16)  # ~125 steps: enough to see the loss leave chance
        a.eval_samples = min(a.eval_samples, 400)
    return a


def die(msg):
    """Bad input: one line on stderr, exit 2, nothing written."""
    print(f"error: {msg}", file=sys.stderr, flush=True)
    sys.exit(2)


# NCCL's flight recorder for a GPU run: each rank's last collectives, dumped into RUN/stacks/nccl/ when
# NCCL's own watchdog times out, for torch's analyser (references/hangs.md)
FLIGHT_RECORDER = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
FLIGHT_RECORDER_ALIASES = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "TORCH_FR_BUFFER_SIZE",
                           "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "TORCH_FR_DUMP_TEMP_FILE"}


def flight_recorder(out):
    """Where CUDA is the device, set the flight recorder's variables before the process group
    exists; a value the user set (or its TORCH_FR_* name) is kept. The variables it set."""
    if not torch.cuda.is_available():
        return {}
    folder = os.path.join(os.path.abspath(out), "stacks", "nccl")
    want = dict(FLIGHT_RECORDER, TORCH_NCCL_DEBUG_INFO_TEMP_FILE=os.path.join(folder, "nccl_trace_rank_"))
    new = {k: v for k, v in want.items() if k not in os.environ and FLIGHT_RECORDER_ALIASES.get(k, k) not in os.environ}
    os.makedirs(folder, exist_ok=True)
    os.environ.update(new)
    return new


# ----------------------------------------------------------------------------- main: the training loop
def main():
    a = parse_args()
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    flight_recorder(a.out)  # before TrainingArguments starts the process group: NCCL reads them then
    ckpt_dir = os.path.join(a.out, "checkpoints")
    if rank == 0:
        tidy_checkpoints(ckpt_dir)
    found = latest_checkpoint(ckpt_dir)
    if found and not a.resume:
        die(f"{found} holds an earlier run: pass --resume to continue it, or another --out")
    (tr_x, tr_y), (ev_x, ev_y) = load_data(a)
    if rank == 0:
        os.makedirs(a.out, exist_ok=True)
        if os.path.exists(os.path.join(a.out, "final_val_metrics.json")):
            os.remove(os.path.join(a.out, "final_val_metrics.json"))  # an earlier attempt's sentinel
        atomic_write_json(os.path.join(a.out, "hparams.json"), vars(a))
        if a.resume:
            print(f"resume: step {step_of(os.path.basename(found))} from {found}" if found else
                  f"resume: no checkpoint in {ckpt_dir}; starting fresh", flush=True)
    os.environ.setdefault("TENSORBOARD_LOGGING_DIR", os.path.join(a.out, "tb"))
    set_seed(a.seed)
    if a.model:
        tokenizer = AutoTokenizer.from_pretrained(a.model)
        model = AutoModelForSequenceClassification.from_pretrained(a.model, num_labels=a.num_labels)
    else:
        tokenizer = build_tokenizer(tr_x)
        config = BertConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2,
                            num_attention_heads=2, intermediate_size=128, max_position_embeddings=a.max_len + 2,
                            num_labels=a.num_labels, pad_token_id=tokenizer.pad_token_id)
        model = BertForSequenceClassification(config)
    train_set = Encoded(tokenizer, tr_x, tr_y, a.max_len)
    eval_set = Encoded(tokenizer, ev_x, ev_y, a.max_len)

    try:
        import tensorboard  # noqa: F401
        report_to = ["tensorboard"]
    except ImportError:
        report_to = "none"
    args = TrainingArguments(
        output_dir=ckpt_dir, num_train_epochs=a.epochs, max_steps=a.max_steps,
        per_device_train_batch_size=a.batch_size, gradient_accumulation_steps=a.grad_accum,
        per_device_eval_batch_size=a.batch_size * 4,
        learning_rate=a.lr, warmup_steps=a.warmup_steps, max_grad_norm=a.max_grad_norm,
        logging_steps=a.logging_steps, logging_nan_inf_filter=False,  # the filter hides NaN steps
        eval_strategy="steps", eval_steps=a.eval_steps,
        save_strategy="steps" if a.keep else "no", save_steps=a.eval_steps, save_total_limit=a.keep or None,
        load_best_model_at_end=a.keep == 2, metric_for_best_model="auroc", greater_is_better=True,
        fp16=a.precision == "fp16", bf16=a.precision == "bf16",
        report_to=report_to, disable_tqdm=True, seed=a.seed, dataloader_pin_memory=torch.cuda.is_available(),
        ddp_backend="gloo" if world > 1 and not torch.cuda.is_available() else None)
    batches = math.ceil(math.ceil(len(train_set) / world) / a.batch_size)
    total = a.max_steps if a.max_steps > 0 else math.ceil(a.epochs * max(1, math.ceil(batches / a.grad_accum)))

    with Telemetry(a.out, task="classification", num_labels=a.num_labels, total_steps=total,
                   batch_size=a.batch_size * a.grad_accum, world_size=world,
                   resume=["--resume"], resumed=a.resume, checkpoint_dir=ckpt_dir,  # how a relaunch continues
                   flags={"--lr": a.lr, "--batch-size": a.batch_size, "--grad-accum": a.grad_accum}) as tel:
        trainer = TemplateTrainer(
            model=model, args=args, train_dataset=train_set, eval_dataset=eval_set, processing_class=tokenizer,
            compute_metrics=compute_metrics, callbacks=[TrainerTelemetry(tel, every=a.logging_steps)])
        trainer.train(resume_from_checkpoint=found if a.resume else None)
        final = trainer.evaluate()  # the best checkpoint, reloaded by load_best_model_at_end
        if trainer.is_world_process_zero():
            best = trainer.state.best_model_checkpoint or (latest_checkpoint(ckpt_dir) if a.keep else None)
            tel.done(eval_auroc=final.get("eval_auroc"), eval_acc=final.get("eval_acc"),
                     eval_loss=final.get("eval_loss"), step=trainer.state.global_step, best_checkpoint=best,
                     best_step=step_of(os.path.basename(best)) if best else None,
                     best_auroc=trainer.state.best_metric, world_size=world, seconds=round(time.time() - tel.t0, 1))
            print(f"done: eval_auroc={final.get('eval_auroc'):.4f} best={best}", flush=True)


# ----------------------------------------------------------------------------- data (same in both templates)
POSITIVE = "good great excellent superb lovely delightful brilliant wonderful fantastic pleasant".split()
NEGATIVE = "bad awful terrible poor dreadful horrible boring nasty dismal painful".split()
NEUTRAL = ("the a movie film plot actor scene story it was is and with of to in this that very "
           "quite rather so really at times some parts ending music camera script cast").split()


def generated_task(n, seed):
    """Reviews of neutral words around one sentiment word, negated one time in ten ("not
    good" is negative); label 1 = positive. Easy, but not a bag of words."""
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
    """Texts and labels of a CSV, JSON (records) or JSONL file; labels 1.0 become 1."""
    import pandas as pd
    if not os.path.isfile(path):
        die(f"{path} does not exist (pass a CSV, JSON or JSONL file)")
    json_file = path.endswith((".jsonl", ".json"))
    df = pd.read_json(path, lines=path.endswith(".jsonl")) if json_file else pd.read_csv(path)
    missing = [c for c in (text_col, label_col) if c not in df.columns]
    if missing:
        die(f"{path} has no column {missing[0]!r}; columns are {list(df.columns)} (use --text-col / --label-col)")
    labels = [int(v) if isinstance(v, float) and v.is_integer() else v for v in df[label_col].tolist()]
    return df[text_col].astype(str).tolist(), labels


def check_labels(labels, num_labels, split, label_col):
    """Fail loud before training: integer labels in [0, num_labels), every class present."""
    bad = sorted({repr(v) for v in labels if isinstance(v, bool) or not isinstance(v, int)
                  or not 0 <= v < num_labels}, key=str)[:5]
    if bad:
        die(f"label column {label_col!r} in {split} holds {', '.join(bad)}; labels must be "
            f"integers in [0, {num_labels}) (set --num-labels or map the labels)")
    found = sorted(set(labels))
    if len(found) < num_labels:
        die(f"label column {label_col!r} in {split} holds only {found}; every class "
            f"0..{num_labels - 1} must be present (check the split or the sampling)")


def load_data(a):
    """(train texts, labels), (eval texts, labels), labels checked."""
    if a.data is None:
        x, y = generated_task(a.samples + a.eval_samples, a.seed)
        train, ev = (x[:a.samples], y[:a.samples]), (x[a.samples:], y[a.samples:])
    elif a.eval_data:
        x, y = read_table(a.data, a.text_col, a.label_col)
        ev_x, ev_y = read_table(a.eval_data, a.text_col, a.label_col)
        train, ev = (x[:a.samples], y[:a.samples]), (ev_x[:a.eval_samples], ev_y[:a.eval_samples])
    else:
        x, y = read_table(a.data, a.text_col, a.label_col)
        order = list(range(len(x)))
        random.Random(a.seed).shuffle(order)
        n_eval = max(1, int(len(order) * EVAL_FRACTION))
        held, kept = order[:n_eval], order[n_eval:][:a.samples]
        train, ev = ([x[i] for i in kept], [y[i] for i in kept]), ([x[i] for i in held], [y[i] for i in held])
    check_labels(train[1], a.num_labels, "train", a.label_col)
    check_labels(ev[1], a.num_labels, "eval", a.label_col)
    return train, ev


# ----------------------------------------------------------------------------- model
def build_tokenizer(texts):
    """A word-level tokenizer built in memory from the training texts (no download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
    vocab = {w: i for i, w in enumerate(specials)}
    for t in texts:
        for w in t.lower().split():
            vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[
        ("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]",
                                   cls_token="[CLS]", sep_token="[SEP]", model_max_length=512)


class Encoded:
    """A map-style dataset of padded input ids."""

    def __init__(self, tokenizer, texts, labels, max_len):
        self.enc = tokenizer(texts, truncation=True, max_length=max_len, padding="max_length")
        self.labels = labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        item = {k: v[i] for k, v in self.enc.items() if k != "token_type_ids"}
        item["labels"] = self.labels[i]
        return item


def compute_metrics(eval_pred):
    """AUROC on the probability of class 1 (one-vs-rest for more classes), and accuracy."""
    import numpy as np
    from sklearn.metrics import roc_auc_score
    logits, labels = eval_pred
    logits = logits[0] if isinstance(logits, tuple) else logits
    z = logits - logits.max(axis=1, keepdims=True)
    probs = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    auroc = roc_auc_score(labels, probs[:, 1]) if probs.shape[1] == 2 else roc_auc_score(labels, probs, multi_class="ovr")
    return {"auroc": float(auroc), "acc": float((probs.argmax(axis=1) == labels).mean())}


# ----------------------------------------------------------------------------- checkpoints
def atomic_write_json(path, obj):
    import json
    import tempfile
    fd, tmp = tempfile.mkstemp(prefix=".tmp.", dir=os.path.dirname(path) or ".")
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=1, default=str)
    os.replace(tmp, path)


def step_of(name):
    return int(name.rsplit("-", 1)[1]) if name.startswith("checkpoint-") and name.rsplit("-", 1)[1].isdigit() else -1


def tidy_checkpoints(ckpt_dir):
    """Finish what a kill during a save left: a complete checkpoint waiting under .ready-* is
    renamed into place, a half-written one (.staging) and old ones (.trash-*) are removed."""
    if not os.path.isdir(ckpt_dir):
        return
    for name in sorted(os.listdir(ckpt_dir)):
        path = os.path.join(ckpt_dir, name)
        if name.startswith(".ready-") and not os.path.exists(os.path.join(ckpt_dir, name[len(".ready-"):])):
            os.replace(path, os.path.join(ckpt_dir, name[len(".ready-"):]))
        elif name.startswith((".staging", ".trash-", ".ready-")):
            shutil.rmtree(path, ignore_errors=True)


def latest_checkpoint(ckpt_dir):
    """The newest checkpoint-N (what resume_from_checkpoint continues from), or None."""
    names = [n for n in os.listdir(ckpt_dir) if step_of(n) >= 0] if os.path.isdir(ckpt_dir) else []
    return os.path.join(ckpt_dir, max(names, key=step_of)) if names else None


class TemplateTrainer(Trainer):
    """The Trainer's own checkpoints (model, optimizer, scheduler, scaler, RNG states, trainer
    state with the step and the data position), made atomic: checkpoint-N is written under
    .staging, moved to .ready-checkpoint-N once complete, the old ones other than the best are
    moved away, then it is renamed into place. At no instant are there more than two
    checkpoint-N (the Trainer alone keeps best + last + the new one during each save), and a
    kill leaves no half-written checkpoint-N."""

    # A classification loss is a mean per micro-batch: divide it by the accumulation steps.
    # (The Trainer assumes a model taking **kwargs scales it itself, so with --grad-accum 2,
    # as an OOM relaunch sets, the loss and the gradients would come out doubled.)
    loss_is_scaled_for_ga = False
    staging = None

    def _get_output_dir(self, trial):
        return self.staging or super()._get_output_dir(trial)

    def _save_checkpoint(self, model, trial):
        real = super()._get_output_dir(trial)
        name = f"checkpoint-{self.state.global_step}"
        self.staging = os.path.join(real, ".staging")
        try:
            super()._save_checkpoint(model, trial)  # every rank writes its share into .staging
        finally:
            self.staging = None
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            best = self.state.best_global_step
            self.state.best_model_checkpoint = os.path.join(real, f"checkpoint-{best}") \
                if self.args.load_best_model_at_end and best else None
            staged, ready = os.path.join(real, ".staging", name), os.path.join(real, ".ready-" + name)
            self.state.save_to_json(os.path.join(staged, "trainer_state.json"))  # the real best path
            os.replace(staged, ready)
            keep = {os.path.basename(self.state.best_model_checkpoint or "")}
            for old in os.listdir(real):
                if step_of(old) >= 0 and old not in keep:
                    os.replace(os.path.join(real, old), os.path.join(real, ".trash-" + old))
            os.replace(ready, os.path.join(real, name))
            tidy_checkpoints(real)
        self.accelerator.wait_for_everyone()


# ----------------------------------------------------------------------------- telemetry (the fallback copy, last)
try:  # the installed package's, when it is importable
    from supervise.hf import TrainerTelemetry
    from supervise.telemetry import Telemetry
except ImportError:  # this file copied alone: verbatim copies of supervise/telemetry.py's and hf.py's blocks
    # --- telemetry: begin ---
    import faulthandler
    import json
    import math
    import os
    import signal
    import socket
    import sys
    import tempfile
    import time
    import traceback
    import uuid

    # The signal a watchdog sends for the stacks of a hung run (references/hangs.md): free in
    # Lightning (SIGUSR1 requeue, SIGTERM), torchrun (SIGTERM, SIGINT, SIGHUP, SIGQUIT, and SIGUSR1/2
    # when asked), Slurm's --signal habits and submitit (SIGUSR1/2), the HF Trainer (SIGTERM).
    # SUPERVISE_STACK_SIGNAL overrides it: a name (SIGRTMIN+6, SIGUSR2), a number, or "off".
    STACK_SIGNAL = "SIGRTMIN+6"
    _STACKS = {}   # this process's registration: pid, signal, file, run_dir, rank


    def stack_signal(text=None):
        """The signal number of SUPERVISE_STACK_SIGNAL (``text`` when given), else of SIGRTMIN+6;
        None when it is "off"/"0" or not a signal here (no real-time signals: not Linux)."""
        text = str((os.environ.get("SUPERVISE_STACK_SIGNAL") if text is None else text) or STACK_SIGNAL)
        text = text.strip().upper().replace(" ", "")
        if text in ("OFF", "0", "NONE", "NO", "FALSE"):
            return None
        name, _, plus = text.partition("+")
        try:
            num = int(name) if name.isdigit() else int(getattr(signal, name if name.startswith("SIG") else "SIG" + name))
            num += int(plus or 0)
        except (AttributeError, TypeError, ValueError):
            return None
        return num if 0 < num < getattr(signal, "NSIG", 65) and num not in (signal.SIGKILL, signal.SIGSTOP) else None


    def _handled(sig):
        """Whether this process already handles ``sig``: a Python handler, SIG_IGN, or a handler
        installed from C (Python reports None for those; /proc/self/status shows them all)."""
        try:
            if signal.getsignal(sig) not in (signal.SIG_DFL,):
                return True
        except (ValueError, OSError):
            return True
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith(("SigCgt:", "SigIgn:")) and int(line.split()[1], 16) >> (sig - 1) & 1:
                        return True
        except (OSError, ValueError, IndexError):
            pass
        return False


    def register_stacks(run_dir, rank=None, role="rank"):
        """faulthandler, all threads, on ``stack_signal()``, into RUN_DIR/stacks/.live/pid-<PID>.txt
        (a JSON header line, then every dump): on a hang the watchdog sends the signal and cuts one
        file per capture out of it. faulthandler is written in C: it needs no ptrace and dumps while
        the interpreter is deadlocked, pausing the process only while it writes. A handler already
        installed for that signal is never replaced (the file says so, and the watchdog falls back
        to py-spy); chain=False, since the signal's default action would end the process. A process
        forked from here (a DataLoader worker) registers its own file. The path, or None."""
        sig = stack_signal()
        if sig is None or not hasattr(faulthandler, "register"):
            return None
        pid = os.getpid()
        ours = bool(_STACKS)   # our own handler: this process's, or inherited across fork
        live = os.path.join(str(run_dir), "stacks", ".live")
        try:
            os.makedirs(live, exist_ok=True)
            if not ours:
                _prune(live)
            path = os.path.join(live, f"pid-{pid}.txt")
            f = open(path, "a", buffering=1)
        except OSError:
            return None
        head = {"pid": pid, "rank": rank, "role": role, "parent": os.getppid(), "signal": sig,
                "time": round(time.time(), 3), "registered": False}
        why = None
        if not ours and _handled(sig):
            why = (f"signal {sig} already has a handler in this process, left alone: set SUPERVISE_STACK_SIGNAL "
                   "to a free one (references/hangs.md)")
        else:
            try:
                f.write(json.dumps(dict(head, registered=True)) + "\n")
                f.flush()
                faulthandler.register(sig, file=f, all_threads=True, chain=False)
            except (OSError, RuntimeError, ValueError) as e:
                why = f"faulthandler.register failed: {e}"
        if why is not None:
            f.write(json.dumps(dict(head, registered=False, why=why)) + "\n")
            f.close()
            return None
        old = _STACKS.get("file")
        _STACKS.update(pid=pid, signal=sig, file=f, run_dir=str(run_dir), rank=rank)
        if old is not None and old is not f:
            old.close()   # faulthandler holds the new file now
        if not _STACKS.get("at_fork") and hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_stacks_in_child)
            _STACKS["at_fork"] = True
        return path


    def _stacks_in_child():
        """After a fork (a DataLoader worker): dump into a file of its own, not the parent's."""
        if _STACKS.get("pid") and _STACKS["pid"] != os.getpid():
            try:
                register_stacks(_STACKS["run_dir"], _STACKS.get("rank"), role="worker")
            except Exception:
                pass


    def _prune(live):
        """Drop the files of processes that are gone (the workers of earlier epochs, an old launch)."""
        for name in os.listdir(live):
            if name.startswith("pid-") and name.endswith(".txt") and name[4:-4].isdigit():
                try:
                    os.kill(int(name[4:-4]), 0)
                except ProcessLookupError:
                    try:
                        os.remove(os.path.join(live, name))
                    except OSError:
                        pass
                except OSError:
                    pass


    class Telemetry:
        """Writes RUN_DIR/metrics.jsonl (rank 0), RUN_DIR/ranks/rank-<N>.jsonl (every rank) and the
        completion sentinel RUN_DIR/final_val_metrics.json, one os.write per line (O_APPEND).

        task: "classification" | "lm" | "regression" | ... ; chance loss is ln(num_labels) for
        classification and ln(vocab_size) for lm. batch_size: samples per optimizer step on one rank
        (per-device batch x gradient accumulation); when given, sps (all ranks) is measured.
        rank / world_size default to torchrun's RANK / WORLD_SIZE variables.

        How this script continues (the start record's ``resume``, which the relaunch line uses):
        resume=["--init_from=resume"] (argv words; "{checkpoint}" stands for the checkpoint path, as
        in ["--resume_from_checkpoint", "{checkpoint}"]); resume_env={"VAR": "{checkpoint}"} for a
        recipe given through the environment; checkpoint_dir: where the checkpoints go (a folder or
        a list). resumed: this launch continues an earlier attempt [True when resume=True, or when
        the recipe's words are on this command line / its variables are set]; attempt: 1, or when
        resumed one more than the start records already in metrics.jsonl (never truncated).
        flags: {"--learning_rate": 3e-4, ...}, flags the script takes and their values now.
        Values may be anything float() accepts (tensors, numpy scalars).
        """

        def __init__(self, run_dir, *, task="classification", num_labels=None, vocab_size=None,
                     total_steps=None, batch_size=None, world_size=None, rank=None, attempt=None,
                     resume=False, resumed=None, resume_env=None, checkpoint_dir=None, flags=None):
            env = os.environ
            self.run_dir = str(run_dir)
            self.rank = int(rank if rank is not None else env.get("RANK", env.get("LOCAL_RANK", 0)))
            self.local_rank = int(env.get("LOCAL_RANK", self.rank))
            self.world_size = int(world_size or env.get("WORLD_SIZE", 1))
            self.stacks_file = register_stacks(self.run_dir, self.rank)  # where a hang's stacks go (None: off)
            self.batch_size = batch_size
            self.run_id = uuid.uuid4().hex
            self.ns = self._namespace()  # {"pid_ns", "boot_id"}: whether a watchdog may probe this pid
            self.t0 = time.time()
            self.last_step = None
            self._mark = None  # (step, time) the next sps is measured from
            self._fatal = False
            self.metrics_path = os.path.join(self.run_dir, "metrics.jsonl")
            self.sentinel_path = os.path.join(self.run_dir, "final_val_metrics.json")
            os.makedirs(os.path.join(self.run_dir, "ranks"), exist_ok=True)
            self._rank_fd = self._open(os.path.join(self.run_dir, "ranks", f"rank-{self.rank}.jsonl"))
            self._fd = None
            resume = resume.split() if isinstance(resume, str) else resume
            recipe = [str(w) for w in resume] if isinstance(resume, (list, tuple)) else None
            resume_env = {str(k): str(v) for k, v in resume_env.items()} if resume_env else None
            if resumed is None:
                resumed = resume is True or self._recipe_used(recipe, resume_env)
            if attempt is None:
                attempt = 1 + self._count_starts() if resumed and self.rank == 0 else 1
            self.attempt = int(attempt)
            if self.rank != 0:
                return
            chance = {"classification": num_labels, "lm": vocab_size}.get(task)
            self._fd = self._open(self.metrics_path)
            self._write({"event": "start", "t": 0, "pid": os.getpid(), "run_id": self.run_id,
                         "attempt": self.attempt, "task": task, "num_labels": num_labels,
                         "vocab_size": vocab_size,
                         "chance_loss": round(math.log(chance), 6) if chance and chance > 1 else None,
                         "total_steps": total_steps, "batch_size": batch_size,
                         "world_size": self.world_size, "rank": self.rank, "argv": list(sys.argv),
                         "cwd": os.getcwd(), "python": sys.executable, "launcher": self._launcher(),
                         "resume": recipe, "resume_env": resume_env, "checkpoint_dir": self._dirs(checkpoint_dir),
                         "flags": {str(k): self._num(v) for k, v in flags.items()} if flags else None,
                         "slurm_job_id": env.get("SLURM_JOB_ID"), "slurm": self._slurm(),
                         "host": socket.gethostname(), **self.ns, "time": self.t0})

        # -- the calls a training loop makes
        def step(self, step, loss, *, lr=None, grad_norm=None, sps=None, **extra):
            """One step record (rank 0) and one heartbeat (every rank); returns the step record.
            Only ``step`` and ``loss`` are required: lr, grad_norm, sps and any extra field left out
            (or None) are left out of the record, never written as null ("not measured" is not NaN).
            A non-finite loss, lr or grad norm writes FATAL and raises FloatingPointError: never train
            on after a NaN. sps, unless given: samples per second across all ranks (batch_size x
            world_size) since the last step record or mark(); absent without batch_size."""
            step, now = int(step), time.time()
            loss, lr, grad_norm = self._num(loss), self._num(lr), self._num(grad_norm)
            for name, value in (("loss", loss), ("lr", lr), ("grad_norm", grad_norm)):
                if isinstance(value, float) and not math.isfinite(value):
                    reason = f"non-finite {name} {value} at step {step}"
                    self.fatal(step, reason)
                    raise FloatingPointError(reason + ": lower the learning rate or check the inputs")
            rank_sps = None
            if self.batch_size and self._mark and step > self._mark[0] and now > self._mark[1]:
                rank_sps = round((step - self._mark[0]) * self.batch_size / (now - self._mark[1]), 3)
            if sps is None and rank_sps is not None:
                sps = round(rank_sps * self.world_size, 3)
            self._mark, self.last_step = (step, now), step
            t = round(now - self.t0, 3)
            beat = {"rank": self.rank, "local_rank": self.local_rank, "host": socket.gethostname(), **self.ns,
                    "pid": os.getpid(), "step": step, "t": t, "time": round(now, 3)}
            self._append(self._rank_fd, self._given(beat, sps=rank_sps))
            rec = self._given({"step": step, "t": t, "loss": loss}, lr=lr, grad_norm=grad_norm, sps=sps, **extra)
            self._write(rec)
            return rec

        def mark(self, step):
            """Training runs from ``step`` now: the next sps is measured from here. Call it where
            training starts or resumes, and after a checkpoint save; eval() calls it."""
            self._mark = (int(step), time.time())

        def eval(self, step, **metrics):
            """Any eval metrics: keys get an "eval_" prefix when they lack it (loss -> eval_loss); a
            metric given as None is left out. A non-finite eval loss writes FATAL and raises
            FloatingPointError, as a non-finite training loss does."""
            step = int(step)
            rec = self._given({"step": step, "t": round(time.time() - self.t0, 3)},
                              **{k if k.startswith("eval_") else "eval_" + k: v for k, v in metrics.items()})
            loss = rec.get("eval_loss")
            if isinstance(loss, float) and not math.isfinite(loss):
                reason = f"non-finite eval_loss {loss} at step {step}"
                self.fatal(step, reason)
                raise FloatingPointError(reason + ": lower the learning rate or check the inputs")
            self._write(rec)
            self.mark(step)  # eval time is not training throughput

        def expect(self, seconds, why):
            """Announce a long silence (an eval, a checkpoint save) so that it is not a stall."""
            self._write({"event": "expect", "t": round(time.time() - self.t0, 3),
                         "seconds": float(seconds), "why": str(why)})

        def fatal(self, step, reason):
            """Write a FATAL record (rank 0: metrics.jsonl; other ranks: their rank file)."""
            rec = {"step": int(step) if step is not None else self.last_step,
                   "t": round(time.time() - self.t0, 3), "FATAL": str(reason)}
            if self.rank == 0:
                self._write(rec)
            else:
                self._append(self._rank_fd, dict(rec, rank=self.rank, pid=os.getpid()))
            self._fatal = True

        def done(self, **final):
            """Write the completion sentinel atomically (rank 0), carrying this run's run_id."""
            if self.rank == 0:
                data = self._given({"run_id": self.run_id, "attempt": self.attempt, "step": self.last_step}, **final)
                fd, tmp = tempfile.mkstemp(prefix=".final.", dir=self.run_dir)
                with os.fdopen(fd, "w") as f:
                    json.dump(data, f, indent=1)
                os.replace(tmp, self.sentinel_path)
            self.close()

        def close(self):
            for fd in (self._fd, self._rank_fd):
                if fd is not None:
                    os.close(fd)
            self._fd = self._rank_fd = None

        def __enter__(self):
            return self

        def __exit__(self, exc_type, exc, tb):
            if exc_type is not None and not self._fatal and self._rank_fd is not None:
                last = traceback.format_exception_only(exc_type, exc)[-1].strip()
                self.fatal(self.last_step, last)
            self.close()
            return False  # re-raise

        # -- plumbing
        @staticmethod
        def _open(path):
            return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

        def _write(self, rec):
            if self._fd is not None:
                self._append(self._fd, rec)

        @staticmethod
        def _recipe_used(recipe, env_recipe):
            """True when this command line holds the recipe's words ("{checkpoint}": any path), or
            the environment sets its variables: this launch is a resume."""
            if env_recipe:
                return all(os.environ.get(k) for k in env_recipe)
            if not recipe:
                return False
            args = sys.argv[1:]
            for word in recipe:
                head = word.split("{checkpoint}")[0]
                if "{checkpoint}" in word:
                    if head and not any(a.startswith(head) for a in args):
                        return False
                elif word not in args:
                    return False
            return True

        @staticmethod
        def _dirs(checkpoint_dir):
            if not checkpoint_dir:
                return None
            if isinstance(checkpoint_dir, (list, tuple)):
                return [os.path.abspath(str(d)) for d in checkpoint_dir] or None
            return os.path.abspath(str(checkpoint_dir))

        @staticmethod
        def _launcher():
            """The words that launched this script under torchrun, to launch it again the same way:
            the parent's command line up to the script (torchrun -> python -m torch.distributed.run),
            else rebuilt from torchrun's variables; None when no launcher ran it."""
            env, argv = os.environ, list(sys.argv)
            if not env.get("TORCHELASTIC_RUN_ID"):
                return None
            try:
                with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
                    parent = [w.decode("utf-8", "replace") for w in f.read().split(b"\0")[:-1]]
            except OSError:
                parent = []
            head = parent[:-len(argv)] if argv and len(parent) > len(argv) and parent[-len(argv):] == argv else None
            if head:
                at = next((i for i, w in enumerate(head[:2]) if os.path.basename(w) == "torchrun"), None)
                return head if at is None else [sys.executable, "-m", "torch.distributed.run", *head[at + 1:]]
            local = int(env.get("LOCAL_WORLD_SIZE") or 1)
            nodes = int(env.get("GROUP_WORLD_SIZE") or max(1, int(env.get("WORLD_SIZE") or local) // max(local, 1)))
            head = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nodes}", f"--nproc_per_node={local}"]
            if nodes == 1:
                return head + ["--standalone"]
            return head + [f"--rdzv_id={env['TORCHELASTIC_RUN_ID']}", "--rdzv_backend=c10d",
                           f"--rdzv_endpoint={env.get('MASTER_ADDR', 'localhost')}:{env.get('MASTER_PORT', '29500')}"]

        @staticmethod
        def _namespace():
            """This process's PID namespace (the inode of /proc/self/ns/pid) and the kernel's boot
            (boot_id), read once: a watchdog with the same host name probes this pid only where both
            are its own too (a sidecar container or ``unshare --pid`` shares the name, not the pids).
            Each is left out where /proc does not have it (macOS)."""
            out = {}
            try:
                out["pid_ns"] = os.stat("/proc/self/ns/pid").st_ino
            except OSError:
                pass
            try:
                with open("/proc/sys/kernel/random/boot_id") as f:
                    boot = f.read(100).strip()
                if boot:
                    out["boot_id"] = boot
            except OSError:
                pass
            return out

        @staticmethod
        def _slurm():
            """The Slurm job's resources, from its variables (to resubmit it alike); None outside a job."""
            env = os.environ
            if not env.get("SLURM_JOB_ID"):
                return None
            names = {"job_name": "SLURM_JOB_NAME", "partition": "SLURM_JOB_PARTITION", "nodes": "SLURM_JOB_NUM_NODES",
                     "ntasks_per_node": "SLURM_NTASKS_PER_NODE", "cpus_per_task": "SLURM_CPUS_PER_TASK",
                     "gpus_per_node": "SLURM_GPUS_ON_NODE", "mem_per_node": "SLURM_MEM_PER_NODE",
                     "account": "SLURM_JOB_ACCOUNT", "qos": "SLURM_JOB_QOS", "submit_dir": "SLURM_SUBMIT_DIR"}
            return {k: env[v] for k, v in names.items() if env.get(v)}

        def _count_starts(self):
            n = 0
            try:
                with open(self.metrics_path, "rb") as f:
                    for line in f:
                        if b'"start"' in line:
                            try:
                                n += json.loads(line).get("event") == "start"
                            except (ValueError, AttributeError):
                                pass
            except FileNotFoundError:
                pass
            return n

        @classmethod
        def _given(cls, rec, **fields):
            """``rec`` with each field that has a value (None: not measured, so left out)."""
            rec.update((k, cls._num(v)) for k, v in fields.items() if v is not None)
            return rec

        @staticmethod
        def _num(v):
            """A plain float for anything float() accepts (tensors, numpy); other values unchanged."""
            if v is None or isinstance(v, (bool, int, float, str)):
                return v
            try:
                return float(v)
            except (TypeError, ValueError, RuntimeError):
                return v

        @staticmethod
        def _append(fd, rec):
            if fd is not None:
                os.write(fd, (json.dumps(rec, default=str) + "\n").encode())  # one write per line
    # --- telemetry: end ---

    # --- hf callback: begin ---
    class TrainerTelemetry(TrainerCallback):
        """The Trainer's training, written into the Telemetry ``tm``: a step record every ``every``
        optimizer steps (the raw loss averaged since the last record) and at each of the Trainer's
        logging steps (then with its pre-clip grad norm); sps is Telemetry's (samples per second
        across all ranks since the last step record, evals and checkpoint saves left out); eval
        records with every ``eval_*`` metric the Trainer logs; ``expect`` before evals and saves.
        A forward hook reads the raw loss of every micro-batch (the gradients, when the model
        returns no loss), so the first non-finite one writes FATAL and raises FloatingPointError
        whatever ``logging_nan_inf_filter`` says. Whoever made ``tm`` writes the sentinel."""

        def __init__(self, tm=None, *, every=10):
            self.tm, self.every = tm, max(int(every), 1)
            self._hook = None
            self._losses = []  # raw per-step losses (floats) since the last step record
            self._step_losses = []  # the current optimizer step's micro-batch losses (tensors)
            self._final = {}
            self._eval_seconds = 0.0
            self._save_seconds, self._save_started = 0.0, None

        def on_train_begin(self, args, state, control, model=None, **kw):
            if self.tm is not None:
                self.tm.mark(state.global_step)  # the first step record's sps is measured from here
            if model is not None and self._hook is None:
                self._hook = model.register_forward_hook(self._capture)

        def _capture(self, module, inputs, output):
            if not module.training:
                return
            loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
            if loss is not None and getattr(loss, "numel", lambda: 0)() == 1:
                self._step_losses.append(loss.detach())

        # -- every optimizer step
        def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
            if self._step_losses or model is None or self.tm is None:
                return
            import torch  # a trainer whose model returns no loss (DPO, GRPO...): check the gradients

            grads = [p.grad for p in model.parameters() if p.grad is not None]
            if grads and not torch.isfinite(torch.nn.utils.get_total_norm(grads)):
                self._fatal(state.global_step + 1, "non-finite gradients (the model's loss is not visible)")

        def on_step_end(self, args, state, control, **kw):
            if self.tm is None:
                return
            step_losses, self._step_losses = self._step_losses, []
            if step_losses:
                import torch

                raw = float(torch.stack([x.float() for x in step_losses]).mean())
                if not math.isfinite(raw):
                    self._fatal(state.global_step, f"non-finite loss {raw} at step {state.global_step} "
                                                   "(the raw per-step loss, read before logging_nan_inf_filter)")
                self._losses.append(raw)
            if control.should_evaluate and self._eval_seconds:  # announce the silence
                self.tm.expect(max(60.0, 2 * self._eval_seconds), "eval")
            if control.should_save:  # a checkpoint of a large model can take minutes: announce it too
                self._save_started = time.time()
                self.tm.expect(max(120.0, 3 * self._save_seconds), "save")
            if state.global_step % self.every == 0 and not control.should_log:
                self.tm.step(state.global_step, self._mean_loss(), lr=self._lr(kw.get("lr_scheduler")))

        # -- the Trainer's own logs: its pre-clip grad norm, and every eval metric
        def on_log(self, args, state, control, logs=None, **kw):
            logs = logs or {}
            if self.tm is None:
                return
            if "loss" in logs:
                loss = self._mean_loss()
                self.tm.step(state.global_step, logs["loss"] if loss is None else loss,
                             lr=logs.get("learning_rate"), grad_norm=logs.get("grad_norm"),
                             epoch=logs.get("epoch"))
            evals = {k: v for k, v in logs.items()  # the metrics, not the eval's timings
                     if k.startswith("eval_") and not k.endswith(("_runtime", "_per_second"))}
            if evals:
                self.tm.eval(state.global_step, **evals)
                self._final.update(evals)
                self._eval_seconds = float(logs.get("eval_runtime") or 0.0)

        def on_save(self, args, state, control, **kw):
            if self._save_started is not None:
                self._save_seconds = max(self._save_seconds, time.time() - self._save_started)
                self._save_started = None
            if self.tm is not None:
                self.tm.mark(state.global_step)  # save time is not training throughput

        def on_train_end(self, args, state, control, **kw):
            if self._hook is not None:
                self._hook.remove()
                self._hook = None

        # -- plumbing
        def _mean_loss(self):
            losses, self._losses = self._losses, []
            return sum(losses) / len(losses) if losses else None

        def _fatal(self, step, reason):
            self.tm.fatal(step, reason)
            self.tm.close()
            raise FloatingPointError(reason + ": lower the learning rate or check the inputs")

        @staticmethod
        def _lr(scheduler):
            try:
                return float(scheduler.get_last_lr()[0])
            except (AttributeError, IndexError, TypeError):
                return None
    # --- hf callback: end ---


if __name__ == "__main__":
    main()
