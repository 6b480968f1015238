"""A user's Lightning script (tiny next-token model), supervised with TelemetryCallback.

    python -u lightning_lm.py --out runs/a [--steps 60] [--nan-at 30] [--sleep 0.05]
        [--manual] [--accumulate 2] [--no-val]

Lines ending in "# supervise" are the whole integration; "# fault" lines inject the failures
the tests need. --manual: manual optimization (training_step steps the optimizer itself, clips
with clip_gradients and returns nothing, logging train_loss); --accumulate N: gradient
accumulation; --no-val: no validation at all. The default sanity check stays on: it runs before on_train_start. A
ModelCheckpoint saves RUN/checkpoints/last.ckpt every 20 steps; a relaunch with
SUPERVISE_CKPT_PATH=<that file> in its environment continues from it (the callback's recipe).
"""
import argparse
import time

import lightning as L
import torch

from supervise.lightning import TelemetryCallback  # supervise

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--steps", type=int, default=60)
p.add_argument("--devices", type=int, default=1, help="CPU processes (DDP, gloo) when more than 1")
p.add_argument("--nan-at", type=int, default=None)  # fault
p.add_argument("--sleep", type=float, default=0.0)  # fault
p.add_argument("--manual", action="store_true")
p.add_argument("--accumulate", type=int, default=1)
p.add_argument("--no-val", action="store_true")
a = p.parse_args()

VOCAB, CTX = 32, 8


def data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, VOCAB, (n, CTX), generator=g)
    return torch.utils.data.TensorDataset(x, (x[:, -1] + 1) % VOCAB)


class NextToken(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 32), torch.nn.Flatten(),
                                       torch.nn.Linear(32 * CTX, VOCAB))
        self.automatic_optimization = not a.manual

    def training_step(self, batch, i):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        if self.automatic_optimization:
            return loss
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(loss)
        self.clip_gradients(opt, gradient_clip_val=1.0, gradient_clip_algorithm="norm")
        opt.step()

    def validation_step(self, batch, i):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("val_loss", loss)
        self.log("val_acc", (self.net(x).argmax(-1) == y).float().mean())

    def on_train_batch_end(self, outputs, batch, i):  # fault
        time.sleep(a.sleep)  # fault
        if self.global_step == a.nan_at:  # fault
            torch.nn.init.constant_(self.net[0].weight, float("nan"))  # fault

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-3)


torch.manual_seed(0)
saves = L.pytorch.callbacks.ModelCheckpoint(dirpath=a.out + "/checkpoints", every_n_train_steps=20, save_last=True)
trainer = L.Trainer(max_steps=a.steps, val_check_interval=20 * a.accumulate, logger=False,
                    gradient_clip_val=None if a.manual else 1.0, accumulate_grad_batches=a.accumulate,
                    limit_val_batches=0 if a.no_val else None, enable_progress_bar=False, accelerator="cpu", devices=a.devices,
                    callbacks=[saves, TelemetryCallback(a.out, task="lm", vocab_size=VOCAB)])  # supervise
trainer.fit(NextToken(), torch.utils.data.DataLoader(data(2000, 0), batch_size=16, shuffle=True),
            torch.utils.data.DataLoader(data(64, 1), batch_size=32))
