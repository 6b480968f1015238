"""A user's nanoGPT-style training loop on a tiny next-token model, supervised with Telemetry.

    python -u plain_loop.py --out runs/a [--steps 60] [--nan-at 30] [--sleep 0.05]
        [--without grad_norm,lr,sps,eval] [--nan-in loss|grad_norm|lr|eval_loss]

Lines ending in "# supervise" are the whole integration; "# fault" lines inject the failures
the tests need (NaN weights, or with --nan-in a NaN in that one field at step --nan-at; --sleep
keeps a run alive for the signal tests). --without leaves those arguments out of the calls, as
a loop that does not measure them writes them (SKILL.md: lr, grad_norm and batch_size are
optional; no eval at all is fine).
"""
import argparse
import time

import torch

from supervise.telemetry import Telemetry  # supervise

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--steps", type=int, default=60)
p.add_argument("--nan-at", type=int, default=None)  # fault
p.add_argument("--sleep", type=float, default=0.0)  # fault
p.add_argument("--nan-in", default="weights")  # fault
p.add_argument("--without", default="")  # what this loop does not measure: grad_norm,lr,sps,eval
a = p.parse_args()
without = set(filter(None, a.without.split(",")))

VOCAB, CTX, BATCH = 32, 8, 16
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 32), torch.nn.Flatten(), torch.nn.Linear(32 * CTX, VOCAB))
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)


def batch():
    """The next token is the last one plus one: learnable, loss falls well below ln(VOCAB)."""
    x = torch.randint(0, VOCAB, (BATCH, CTX))
    return x, (x[:, -1] + 1) % VOCAB


val_loss, batch_size = None, None if "sps" in without else BATCH
with Telemetry(a.out, task="lm", vocab_size=VOCAB, total_steps=a.steps, batch_size=batch_size) as tm:  # supervise
    for step in range(1, a.steps + 1):
        x, y = batch()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        if step == a.nan_at and a.nan_in == "grad_norm":  # fault
            next(model.parameters()).grad.fill_(float("nan"))  # fault
        if step == a.nan_at and a.nan_in == "lr":  # fault
            opt.param_groups[0]["lr"] = float("nan")  # fault
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step == a.nan_at and a.nan_in == "weights":  # fault
            torch.nn.init.constant_(model[0].weight, float("nan"))  # fault
        if step % 10 == 0:
            given = {"lr": opt.param_groups[0]["lr"], "grad_norm": grad_norm}
            tm.step(step, loss, **{k: v for k, v in given.items() if k not in without})  # supervise
        if step % 20 == 0 and "eval" not in without:
            with torch.no_grad():
                x, y = batch()
                val_loss = torch.nn.functional.cross_entropy(model(x), y)
                if step == a.nan_at and a.nan_in == "eval_loss":  # fault
                    val_loss = val_loss * float("nan")  # fault
            tm.eval(step, loss=val_loss, perplexity=val_loss.exp())  # supervise
        time.sleep(a.sleep)
    tm.done(eval_loss=val_loss)  # supervise
