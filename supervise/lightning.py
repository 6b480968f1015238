"""Contract v0.2 telemetry for a Lightning ``Trainer`` (``lightning``, else ``pytorch_lightning``).

    from supervise.lightning import TelemetryCallback
    trainer = L.Trainer(..., callbacks=[TelemetryCallback("runs/a")])

Safe from the sanity check on (Lightning runs it before ``on_train_start``: nothing is written
until training starts, and sanity-check metrics are never eval records). Rank 0 writes
metrics.jsonl, every rank its heartbeat file. Step records every ``every`` optimizer steps carry
the raw loss (``training_step``'s, before the division by ``accumulate_grad_batches``) and the
pre-clip gradient norm (read in ``on_before_optimizer_step``); under manual optimization a
``training_step`` that returns nothing is read through the loss it logs (``train_loss``,
``loss``) and its norm is the one at ``opt.step()``, after the script's own clipping; what
is not measured is left out of the record. The first non-finite one writes
FATAL and raises ``FloatingPointError``. Validation metrics become eval records (``val_loss``
and ``val/loss`` -> ``eval_loss``); the sentinel is written when ``fit`` completes. Long
silences are announced (``expect``) as the HF callback announces them: each validation after
the first (max(60 s, 2 x the last one)) and each checkpoint save (max(120 s, 3 x the longest
save)), so that a save on its own schedule (``every_n_train_steps``) is never a stall.

Resume without a flag in the script: launched with ``SUPERVISE_CKPT_PATH=<a .ckpt file>`` in its
environment, the callback makes ``fit`` continue from that checkpoint, as ``fit(ckpt_path=...)``
does (model, optimizer, loops and callbacks restored; a ``ckpt_path`` the script passes itself
wins). The start record says so (``resume_env``), with the ``ModelCheckpoint`` folders as
``checkpoint_dir``; a trainer without a ``ModelCheckpoint`` has nothing to resume from, and no
recipe. Give ``ModelCheckpoint`` a fixed ``dirpath`` (e.g. RUN_DIR/checkpoints): the default
folder is a new ``version_N`` per launch.
"""
from __future__ import annotations

import math
import os
import time
import warnings

try:
    import lightning.pytorch as pl
except ImportError:  # the older package name
    import pytorch_lightning as pl

from supervise.telemetry import Telemetry, check_overrides


RESUME_ENV = "SUPERVISE_CKPT_PATH"  # the checkpoint fit() continues from
TRAIN_LOSS = ("train_loss", "loss", "train/loss", "training_loss", "train_loss_step")  # logged by hand
VAL_PREFIXES = ("validation_", "validation/", "valid_", "valid/", "val_", "val/", "eval_", "eval/")


def eval_name(key: str) -> str | None:
    """The eval metric name of a logged key, or None when it is not a validation metric."""
    for prefix in VAL_PREFIXES:
        if key.startswith(prefix):
            return key[len(prefix):].replace("/", "_")
    return None


class TelemetryCallback(pl.Callback):
    """Keyword arguments override what is read from the trainer (task, num_labels, vocab_size,
    total_steps, batch_size, world_size, rank, attempt, resume, resumed, resume_env,
    checkpoint_dir, flags). task defaults to "other"."""

    def __init__(self, run_dir, *, every: int = 10, **overrides):
        self.run_dir, self.every, self.overrides = str(run_dir), max(int(every), 1), check_overrides(overrides)
        self.tm: Telemetry | None = None
        self._losses: list = []
        self._grad_norm = None
        self._logged = -1
        self._warned = False
        self._final: dict = {}
        self._eval_seconds, self._eval_started = 0.0, None
        self._save_seconds, self._save_started = 0.0, None

    # -- resume from $SUPERVISE_CKPT_PATH: loaded where fit() loads its own ckpt_path (it is
    # restored right after the setup hooks, or after on_fit_start for strategies that restore
    # after their setup); a ckpt_path the script passes is loaded after this one, and wins
    def setup(self, trainer, pl_module, stage):
        if stage == "fit" and not trainer.strategy.restore_checkpoint_after_setup:
            self._load_resume(trainer)

    def on_fit_start(self, trainer, pl_module):
        if trainer.strategy.restore_checkpoint_after_setup:
            self._load_resume(trainer)

    @staticmethod
    def _load_resume(trainer):
        path = os.environ.get(RESUME_ENV)
        if not path:
            return
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{RESUME_ENV}={path}: no such checkpoint file; pass a .ckpt that exists, "
                                    f"or unset {RESUME_ENV} to start fresh")
        trainer._checkpoint_connector.resume_start(path)

    def on_train_start(self, trainer, pl_module):
        if self.tm is not None:
            return
        loader = trainer.train_dataloader
        per_batch = getattr(loader, "batch_size", None)
        total = trainer.estimated_stepping_batches
        dirs = [str(cb.dirpath) for cb in trainer.checkpoint_callbacks if getattr(cb, "dirpath", None)]
        fields = dict(task="other", total_steps=int(total) if math.isfinite(total) else None,
                      batch_size=per_batch * trainer.accumulate_grad_batches if per_batch else None,
                      world_size=trainer.world_size, rank=trainer.global_rank,
                      resumed=trainer.global_step > 0)
        if dirs:  # the recipe: the same command with the checkpoint in the environment
            fields.update(resume=[], resume_env={RESUME_ENV: "{checkpoint}"}, checkpoint_dir=dirs)
        fields.update(self.overrides)
        self.tm = Telemetry(self.run_dir, **fields)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if self.tm is None or (trainer.global_step + 1) % self.every:
            return
        import torch

        grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        self._grad_norm = float(torch.nn.utils.get_total_norm(grads)) if grads else None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.tm is None:
            return
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None:
            raw = float(loss) * trainer.accumulate_grad_batches
        else:  # manual optimization with nothing returned: the training loss it logged, if any
            raw = next((float(trainer.callback_metrics[k]) for k in TRAIN_LOSS if k in trainer.callback_metrics), None)
        if raw is not None:
            if not math.isfinite(raw):
                self.tm.step(trainer.global_step, raw)  # writes FATAL and raises
            self._losses.append(raw)
        step = trainer.global_step
        if step % self.every == 0 and step != self._logged and step > 0:
            self._logged = step
            losses, self._losses = self._losses, []
            if not losses:  # no loss to report: no step record (a null loss would read as NaN)
                if not self._warned:
                    self._warned = True
                    warnings.warn("TelemetryCallback: training_step returned no loss and logged none of "
                                  f"{list(TRAIN_LOSS)}: return the loss or self.log('train_loss', loss)")
                return
            lr = trainer.optimizers[0].param_groups[0]["lr"] if trainer.optimizers else None
            grad_norm, self._grad_norm = self._grad_norm, None
            self.tm.step(step, sum(losses) / len(losses), lr=lr, grad_norm=grad_norm, epoch=trainer.current_epoch)

    # -- the silences announced: evals (after the first one showed its length) and saves
    def on_validation_start(self, trainer, pl_module):
        if self.tm is None or trainer.sanity_checking:
            return
        if self._eval_seconds:
            self.tm.expect(max(60.0, 2 * self._eval_seconds), "eval")
        self._eval_started = time.time()

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        if self.tm is not None:
            self.tm.expect(max(120.0, 3 * self._save_seconds), "save")
            self._save_started = time.time()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self._save_started is not None:   # the save ended when training goes on
            self._save_seconds = max(self._save_seconds, time.time() - self._save_started)
            self._save_started = None

    def on_validation_end(self, trainer, pl_module):
        if self.tm is None or trainer.sanity_checking:
            return
        if self._eval_started is not None:
            self._eval_seconds, self._eval_started = time.time() - self._eval_started, None
        metrics = {}
        for key, value in trainer.callback_metrics.items():
            name = eval_name(key)
            if name:
                metrics[name] = value
        if metrics:
            self.tm.eval(trainer.global_step, **metrics)
            self._final.update({"eval_" + k: float(v) for k, v in metrics.items()})

    def on_train_end(self, trainer, pl_module):
        if self.tm is not None:
            self.tm.done(step=trainer.global_step, **self._final)
            self.tm = None

    def on_exception(self, trainer, pl_module, exception):
        if self.tm is not None:  # the Telemetry context manager's behaviour: FATAL, then re-raise
            self.tm.__exit__(type(exception), exception, exception.__traceback__)
            self.tm = None
