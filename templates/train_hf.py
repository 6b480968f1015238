"""Fine-tune a sequence classifier with the Hugging Face Trainer (transformers v5), writing the
telemetry contract that scripts/watchdog.py reads. One file: copy it into your repository.

Launch in the background, on ONE physical line (newlines collapse into spaces in background shells):

    mkdir -p runs/hf && PYTHONUNBUFFERED=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error TOKENIZERS_PARALLELISM=false python -u train_hf.py --out runs/hf > runs/hf/train.log 2>&1

Smoke preflight first (2,000 samples, 1 epoch, eval every 20 steps):

    python -u train_hf.py --out runs/smoke --smoke

With no flags it trains a tiny BERT built from a config on a generated sentiment task (offline,
a CPU, under two minutes); --model PATH_OR_NAME and --data FILE (CSV/JSONL with text and label
columns) switch to real ones. TensorBoard for the human, and an SSH tunnel from a laptop:

    tensorboard --logdir runs/hf/tb --port 6006
    ssh -N -L 6006:localhost:6006 you@gpu-host     # then open http://localhost:6006

RUN_DIR (--out) receives metrics.jsonl (one JSON fact per line, flushed), checkpoints/ (best two
by AUROC), tb/, and final_val_metrics.json last: the completion sentinel.
"""
import argparse
import json
import math
import os
import random
import sys
import tempfile
import time

# ----------------------------------------------------------------------------- config
OUT = "runs/hf"          # the run directory
MODEL = None             # None: a tiny BERT from a config; else a local path or hub name
DATA = None              # None: the generated task; else a CSV/JSONL with TEXT_COL and LABEL_COL
EVAL_DATA = None         # None: hold out EVAL_FRACTION of DATA
TEXT_COL = "text"
LABEL_COL = "label"
NUM_LABELS = 2
SAMPLES = 6000           # training rows (generated task) or a cap on DATA's rows
EVAL_SAMPLES = 600
EVAL_FRACTION = 0.1
EPOCHS = 2
BATCH = 32               # per device
LR = 2e-3                # tiny models from scratch like it high; use ~2e-5 for a pretrained model
WARMUP_STEPS = 20
MAX_LEN = 32
MAX_STEPS = -1           # -1: EPOCHS decide
LOGGING_STEPS = 10       # a step record every this many optimizer steps
EVAL_STEPS = 50          # an eval record (and a checkpoint) every this many steps
MAX_GRAD_NORM = 1.0
PRECISION = "fp32"       # fp32 | fp16 | bf16 (GPU)
SEED = 0
SMOKE = False            # --smoke: 2,000 samples, 1 epoch, eval every 20 steps, batch <= 16
# -----------------------------------------------------------------------------


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=OUT, help="run directory [%(default)s]")
    p.add_argument("--model", default=MODEL, help="local path or hub name [tiny BERT from a config]")
    p.add_argument("--data", default=DATA, help="CSV/JSONL with text and label columns [generated]")
    p.add_argument("--eval-data", default=EVAL_DATA, help="separate eval CSV/JSONL [hold out from --data]")
    p.add_argument("--text-col", default=TEXT_COL)
    p.add_argument("--label-col", default=LABEL_COL)
    p.add_argument("--num-labels", type=int, default=NUM_LABELS)
    p.add_argument("--samples", type=int, default=SAMPLES)
    p.add_argument("--eval-samples", type=int, default=EVAL_SAMPLES)
    p.add_argument("--epochs", type=float, default=EPOCHS)
    p.add_argument("--batch", type=int, default=BATCH)
    p.add_argument("--lr", type=float, default=LR)
    p.add_argument("--warmup-steps", type=int, default=WARMUP_STEPS)
    p.add_argument("--max-len", type=int, default=MAX_LEN)
    p.add_argument("--max-steps", type=int, default=MAX_STEPS)
    p.add_argument("--logging-steps", type=int, default=LOGGING_STEPS)
    p.add_argument("--eval-steps", type=int, default=EVAL_STEPS)
    p.add_argument("--max-grad-norm", type=float, default=MAX_GRAD_NORM)
    p.add_argument("--precision", choices=["fp32", "fp16", "bf16"], default=PRECISION)
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
    import pandas as pd
    if path.endswith((".jsonl", ".json")):
        df = pd.read_json(path, lines=path.endswith(".jsonl"))
    else:
        df = pd.read_csv(path)
    missing = [c for c in (text_col, label_col) if c not in df.columns]
    if missing:
        sys.exit(f"error: {path} has no column {missing[0]!r}; columns are {list(df.columns)} "
                 f"(use --text-col / --label-col)")
    return df[text_col].astype(str).tolist(), df[label_col].tolist()


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
    labels = [int(v) if isinstance(v, float) and v.is_integer() else v for v in labels]
    if a.eval_data:
        ev = read_table(a.eval_data, a.text_col, a.label_col)
        ev = (ev[0][:a.eval_samples], [int(v) if isinstance(v, float) and v.is_integer() else v for v in ev[1]][:a.eval_samples])
        return (texts[:a.samples], labels[:a.samples]), ev
    order = list(range(len(texts)))
    random.Random(a.seed).shuffle(order)
    n_eval = max(1, int(len(order) * EVAL_FRACTION))
    ev, tr = order[:n_eval], order[n_eval:][:a.samples]
    return ([texts[i] for i in tr], [labels[i] for i in tr]), ([texts[i] for i in ev], [labels[i] for i in ev])


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


# ----------------------------------------------------------------------------- telemetry
def atomic_write_json(path, obj):
    fd, tmp = tempfile.mkstemp(prefix=".tmp.", dir=os.path.dirname(path) or ".")
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def make_telemetry_callback(TrainerCallback):
    class Telemetry(TrainerCallback):
        """Writes the contract to RUN_DIR/metrics.jsonl (rank 0 only), one flushed line per
        record, and raises on the first non-finite loss or grad norm after writing FATAL."""

        def __init__(self, run_dir, num_labels):
            self.path = os.path.join(run_dir, "metrics.jsonl")
            self.num_labels = num_labels
            self.t0 = time.time()
            self.fd = None
            self.last = (0, time.time())
            self.eval_seconds = 0.0

        def write(self, state, rec):
            if state.is_world_process_zero:
                if self.fd is None:
                    self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                os.write(self.fd, (json.dumps(rec) + "\n").encode())  # one write per line

        def on_train_begin(self, args, state, control, **kw):
            self.t0 = time.time()
            self.last = (state.global_step, self.t0)
            self.write(state, {"event": "start", "t": 0, "pid": os.getpid(), "total_steps": state.max_steps,
                               "num_labels": self.num_labels, "world_size": args.world_size,
                               "batch_size": args.per_device_train_batch_size})

        def on_log(self, args, state, control, logs=None, **kw):
            logs = logs or {}
            t = round(time.time() - self.t0, 3)
            if "eval_runtime" in logs:
                self.eval_seconds += logs["eval_runtime"]
            if "loss" in logs:
                loss, gn = logs.get("loss"), logs.get("grad_norm")
                bad = [(k, v) for k, v in (("loss", loss), ("grad_norm", gn))
                       if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v))]
                if bad:
                    reason = f"non-finite {bad[0][0]} {bad[0][1]} at step {state.global_step}"
                    self.write(state, {"step": state.global_step, "t": t, "FATAL": reason})
                    raise FloatingPointError(reason + "; lower --lr or check the inputs")
                step0, t_prev = self.last
                seconds = max(time.time() - t_prev - self.eval_seconds, 1e-9)
                samples = (state.global_step - step0) * args.per_device_train_batch_size * \
                    args.gradient_accumulation_steps * args.world_size
                self.last, self.eval_seconds = (state.global_step, time.time()), 0.0
                self.write(state, {"step": state.global_step, "t": t, "loss": loss,
                                   "lr": logs.get("learning_rate"), "grad_norm": gn,
                                   "sps": round(samples / seconds, 2), "epoch": logs.get("epoch")})
            if "eval_auroc" in logs:
                self.write(state, {"step": state.global_step, "t": t, "eval_auroc": logs["eval_auroc"],
                                   "eval_acc": logs.get("eval_acc"), "eval_loss": logs.get("eval_loss")})

    return Telemetry


def compute_metrics(eval_pred):
    """AUROC on the probability of class 1 (one-vs-rest for more classes), and accuracy."""
    import numpy as np
    from sklearn.metrics import roc_auc_score
    logits, labels = eval_pred
    logits = logits[0] if isinstance(logits, tuple) else logits
    z = logits - logits.max(axis=1, keepdims=True)
    probs = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    if probs.shape[1] == 2:
        auroc = roc_auc_score(labels, probs[:, 1])
    else:
        auroc = roc_auc_score(labels, probs, multi_class="ovr")
    return {"auroc": float(auroc), "acc": float((probs.argmax(axis=1) == labels).mean())}


# ----------------------------------------------------------------------------- main
def main():
    a = parse_args()
    os.makedirs(a.out, exist_ok=True)
    os.environ.setdefault("TENSORBOARD_LOGGING_DIR", os.path.join(a.out, "tb"))
    import torch
    from transformers import (AutoModelForSequenceClassification, AutoTokenizer, BertConfig,
                              BertForSequenceClassification, Trainer, TrainerCallback, TrainingArguments,
                              set_seed)
    set_seed(a.seed)
    (tr_x, tr_y), (ev_x, ev_y) = load_data(a)
    check_labels(tr_y, a.num_labels, "train", a.label_col)
    check_labels(ev_y, a.num_labels, "eval", a.label_col)

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
        output_dir=os.path.join(a.out, "checkpoints"),
        num_train_epochs=a.epochs, max_steps=a.max_steps,
        per_device_train_batch_size=a.batch, per_device_eval_batch_size=a.batch * 4,
        learning_rate=a.lr, warmup_steps=a.warmup_steps, max_grad_norm=a.max_grad_norm,
        logging_steps=a.logging_steps, logging_nan_inf_filter=False,  # the filter hides NaN steps
        eval_strategy="steps", eval_steps=a.eval_steps,
        save_strategy="steps", save_steps=a.eval_steps, save_total_limit=2,
        load_best_model_at_end=True, metric_for_best_model="auroc", greater_is_better=True,
        fp16=a.precision == "fp16", bf16=a.precision == "bf16",
        report_to=report_to, disable_tqdm=True, seed=a.seed, dataloader_pin_memory=torch.cuda.is_available(),
        ddp_backend="gloo" if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.cuda.is_available() else None)
    telemetry = make_telemetry_callback(TrainerCallback)(a.out, a.num_labels)
    trainer = Trainer(model=model, args=args, train_dataset=train_set, eval_dataset=eval_set,
                      processing_class=tokenizer, compute_metrics=compute_metrics, callbacks=[telemetry])
    trainer.train()
    final = trainer.evaluate()  # the best checkpoint, reloaded by load_best_model_at_end
    if trainer.is_world_process_zero():
        best = trainer.state.best_model_checkpoint
        atomic_write_json(os.path.join(a.out, "final_val_metrics.json"), {
            "eval_auroc": final.get("eval_auroc"), "eval_acc": final.get("eval_acc"),
            "eval_loss": final.get("eval_loss"), "step": trainer.state.global_step,
            "best_checkpoint": best, "best_auroc": trainer.state.best_metric,
            "seconds": round(time.time() - telemetry.t0, 1)})
        print(f"done: eval_auroc={final.get('eval_auroc'):.4f} best={best}", flush=True)


if __name__ == "__main__":
    main()
