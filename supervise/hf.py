"""Contract v0.2 telemetry for the Hugging Face Trainer and every TRL trainer (SFT, DPO, GRPO...).

    from supervise.hf import TelemetryCallback
    trainer = Trainer(..., callbacks=[TelemetryCallback(args.output_dir)])

Task, vocabulary or label count, total steps, batch and world size come from the trainer. When
the script parses its TrainingArguments from the command line (HfArgumentParser, TrlParser), the
start record says how it continues: ``resume`` = ``["--resume_from_checkpoint", "{checkpoint}"]``
in the spelling of the script's own command line (dashes or underscores, ``--flag=value`` or two
words), its learning-rate and batch flags with their values (``flags``), and ``checkpoint_dir`` =
``args.output_dir``. The script passes ``training_args.resume_from_checkpoint`` to
``trainer.train()``, as the transformers examples and TRL's scripts do.
The Trainer's default ``logging_nan_inf_filter=True`` hides a NaN loss from ``on_log`` (it logs
the window's running mean, or 0.0); this callback does not rely on it: a forward hook reads the
raw loss of every micro-batch (for trainers whose model returns no loss, DPO or GRPO, the
gradients are checked before each optimizer step), and the first non-finite one writes FATAL
and raises ``FloatingPointError`` from the step where it happened.
"""
from __future__ import annotations

import argparse
import math
import sys
import time

from transformers import TrainerCallback, TrainingArguments

from supervise.telemetry import Telemetry, check_overrides



def model_task(model) -> dict:
    """task / num_labels / vocab_size from a model's class and config (PEFT wrappers too)."""
    name = type(model).__name__
    base = getattr(model, "get_base_model", None)
    if base is not None:  # PEFT
        name = type(base()).__name__
    config = getattr(model, "config", None)
    if "SequenceClassification" in name or "TokenClassification" in name:
        if getattr(config, "problem_type", None) == "regression" or getattr(config, "num_labels", 0) == 1:
            return {"task": "regression"}
        return {"task": "classification", "num_labels": getattr(config, "num_labels", None)}
    if any(k in name for k in ("CausalLM", "LMHead", "MaskedLM", "Seq2SeqLM", "ConditionalGeneration")):
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        return {"task": "lm", "vocab_size": getattr(text, "vocab_size", None)}
    return {"task": "other"}


# The flags the relaunch line may change, by their TrainingArguments field.
KNOBS = ("learning_rate", "per_device_train_batch_size", "gradient_accumulation_steps")
SKIP_MODULES = ("transformers", "trl", "accelerate", "torch", "supervise", "peft", "datasets")


def find_parser():
    """The HfArgumentParser (TrlParser too: TRL has its own copy of the class) on the call stack
    that parses TrainingArguments: the script's own, held by one of its frames (a local of
    ``main()`` or a module global); None when the script built its TrainingArguments in code."""
    frame = sys._getframe(1)
    while frame is not None:
        if not str(frame.f_globals.get("__name__", "")).startswith(SKIP_MODULES):
            for scope in (frame.f_locals, frame.f_globals):
                for value in list(scope.values()):
                    if isinstance(value, argparse.ArgumentParser) and any(
                            isinstance(t, type) and issubclass(t, TrainingArguments)
                            for t in getattr(value, "dataclass_types", ())):
                        return value
        frame = frame.f_back
    return None


def _spell(parser, field: str, argv: list) -> str:
    """``--field`` as the command line writes flags: with dashes when most of its multi-word
    flags use them (HfArgumentParser takes both), else with underscores."""
    flags = [w[2:].partition("=")[0] for w in argv[1:] if w.startswith("--")]
    dashes = sum("-" in f and "_" not in f for f in flags)
    unders = sum("_" in f for f in flags)
    dashed = "--" + field.replace("_", "-")
    return dashed if dashes > unders and dashed in parser._option_string_actions else "--" + field


def cli_recipe(parser, args, argv: list) -> dict:
    """Telemetry's resume / flags / checkpoint_dir for a script whose TrainingArguments come from
    its command line ``argv``; {} when they do not (no parser, or a lone .json/.yaml config file,
    which HfArgumentParser scripts parse instead of flags: a flag after it would not be read)."""
    if parser is None or "--resume_from_checkpoint" not in parser._option_string_actions:
        return {}
    if len(argv) == 2 and argv[1].endswith((".json", ".yaml", ".yml")):
        return {}
    words = [w for w in argv[1:] if w.startswith("--")]
    joined = sum("=" in w for w in words) > len(words) / 2
    flag = _spell(parser, "resume_from_checkpoint", argv)
    flags = {_spell(parser, k, argv): getattr(args, k) for k in KNOBS if hasattr(args, k)}
    return {"resume": [f"{flag}={{checkpoint}}"] if joined else [flag, "{checkpoint}"], "flags": flags,
            "checkpoint_dir": args.output_dir}


# The class between the markers needs only math, time and transformers.TrainerCallback:
# templates/train_hf.py holds a verbatim copy (tests/test_telemetry_copies.py keeps it so).
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


class TelemetryCallback(TrainerTelemetry):
    """Writes RUN_DIR/metrics.jsonl (rank 0), RUN_DIR/ranks/rank-<N>.jsonl (every rank) and,
    when training completes, the sentinel RUN_DIR/final_val_metrics.json: TrainerTelemetry's
    records, into a Telemetry it makes at train begin from what the trainer says.

    Keyword arguments override what is read from the trainer (task, num_labels, vocab_size,
    total_steps, batch_size, world_size, rank, attempt, resume, resumed, resume_env,
    checkpoint_dir, flags).
    """

    def __init__(self, run_dir, *, every: int = 10, **overrides):
        super().__init__(every=every)
        self.run_dir, self.overrides = str(run_dir), check_overrides(overrides)

    # -- start
    def on_train_begin(self, args, state, control, model=None, **kw):
        fields = dict(model_task(model) if model is not None else {"task": "other"},
                      total_steps=state.max_steps,
                      batch_size=args.per_device_train_batch_size * args.gradient_accumulation_steps,
                      resumed=state.global_step > 0, checkpoint_dir=args.output_dir)
        fields.update(cli_recipe(find_parser(), args, sys.argv))
        if args.world_size > 1:  # else torchrun's variables: processes the Trainer did not join still get a rank
            fields.update(world_size=args.world_size, rank=args.process_index)
        fields.update(self.overrides)
        self.tm = Telemetry(self.run_dir, **fields)
        super().on_train_begin(args, state, control, model=model, **kw)

    def on_train_end(self, args, state, control, **kw):
        super().on_train_end(args, state, control, **kw)
        if self.tm is not None:
            self.tm.done(step=state.global_step, **self._final)
            self.tm = None
