"""A nanoGPT-style training script (github.com/karpathy/nanoGPT's train.py, cut down): globals
as the configuration, overridden by configurator.py's --key=value words, a module-level loop,
ckpt.pt saved at each eval, resumed with --init_from=resume. A tiny character model on a
generated text, on the CPU.

    python -u nanogpt_train.py --out_dir=runs/a [--max_iters=80] [--learning_rate=3e-3]

Lines ending in "# supervise" are SKILL.md's five lines for a plain loop, nothing else: as in
nanoGPT, clip_grad_norm_'s return value is discarded, so no grad norm is passed (the rules that
need one stay quiet; nothing is called NaN). Faults come from the environment (faults.py).
"""
import os
import time

import torch
import torch.nn.functional as F

import faults  # fault
from supervise.telemetry import Telemetry  # supervise

# -----------------------------------------------------------------------------
out_dir = 'out'
eval_interval = 20
log_interval = 10
eval_iters = 4
always_save_checkpoint = True
init_from = 'scratch'  # 'scratch' or 'resume'
batch_size = 16
block_size = 16
gradient_accumulation_steps = 1
n_embd = 32
learning_rate = 3e-3
max_iters = 80
grad_clip = 1.0
seed = 1337
config_keys = [k for k, v in globals().items() if not k.startswith('_') and isinstance(v, (int, float, bool, str))]
exec(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'configurator.py')).read())
config = {k: globals()[k] for k in config_keys}
# -----------------------------------------------------------------------------

os.makedirs(out_dir, exist_ok=True)
torch.manual_seed(seed)
text = "".join("the quick brown fox jumps over the lazy dog; " for _ in range(200))
chars = sorted(set(text))
vocab_size = len(chars)
stoi = {c: i for i, c in enumerate(chars)}
data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
n = int(0.9 * len(data))
train_data, val_data = data[:n], data[n:]


def get_batch(split):
    d = train_data if split == 'train' else val_data
    ix = torch.randint(len(d) - block_size, (batch_size,))
    return torch.stack([d[i:i + block_size] for i in ix]), torch.stack([d[i + 1:i + 1 + block_size] for i in ix])


class Bigram(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab_size, n_embd)
        self.head = torch.nn.Linear(n_embd, vocab_size)

    def forward(self, idx, targets=None):
        logits = self.head(self.emb(idx))
        loss = None if targets is None else F.cross_entropy(logits.view(-1, vocab_size), targets.view(-1))
        return logits, loss


iter_num, best_val_loss = 0, 1e9
model = Bigram()
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
if init_from == 'resume':
    print(f"Resuming training from {out_dir}")
    checkpoint = torch.load(os.path.join(out_dir, 'ckpt.pt'), map_location='cpu')
    model.load_state_dict(checkpoint['model'])
    optimizer.load_state_dict(checkpoint['optimizer'])
    iter_num = checkpoint['iter_num']
    best_val_loss = checkpoint['best_val_loss']
    checkpoint = None


@torch.no_grad()
def estimate_loss():
    out = {}
    model.eval()
    for split in ['train', 'val']:
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
            X, Y = get_batch(split)
            _, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean()
    model.train()
    return out


tm = Telemetry(out_dir, task="lm", vocab_size=vocab_size, total_steps=max_iters,  # supervise
               batch_size=batch_size * gradient_accumulation_steps, resume=["--init_from=resume"], checkpoint_dir=out_dir)  # supervise
X, Y = get_batch('train')
t0 = time.time()
while True:
    if iter_num % eval_interval == 0:
        losses = estimate_loss()
        print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        tm.eval(iter_num, loss=losses['val'])  # supervise
        if losses['val'] < best_val_loss or always_save_checkpoint:
            best_val_loss = losses['val']
            if iter_num > 0:
                checkpoint = {'model': model.state_dict(), 'optimizer': optimizer.state_dict(),
                              'iter_num': iter_num, 'best_val_loss': best_val_loss, 'config': config}
                print(f"saving checkpoint to {out_dir}")
                torch.save(checkpoint, os.path.join(out_dir, 'ckpt.pt.tmp'))
                os.replace(os.path.join(out_dir, 'ckpt.pt.tmp'), os.path.join(out_dir, 'ckpt.pt'))
    for micro_step in range(gradient_accumulation_steps):
        _, loss = model(X, Y)
        loss = loss / gradient_accumulation_steps
        X, Y = get_batch('train')
        loss.backward()
    if grad_clip != 0.0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    faults.step_done(iter_num, model.parameters())  # fault
    if iter_num % log_interval == 0:
        lossf = loss.item() * gradient_accumulation_steps
        print(f"iter {iter_num}: loss {lossf:.4f}, time {(time.time() - t0) * 1000:.2f}ms")
        tm.step(iter_num, lossf, lr=learning_rate)  # supervise
    iter_num += 1
    if iter_num > max_iters:
        break
tm.done(eval_loss=best_val_loss)  # supervise
