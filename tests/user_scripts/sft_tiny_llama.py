"""A user's TRL SFT script on a tiny Llama built from a config, supervised with TelemetryCallback.

    python -u sft_tiny_llama.py --out runs/a [--steps 60] [--nan-at 30] [--sleep 0.05]

Offline: the tokenizer is built in memory and the data generated. Lines ending in "# supervise"
are the whole integration; "# fault" lines inject the failures the tests need.
"""
import argparse
import random
import time

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, TrainerCallback
from trl import SFTConfig, SFTTrainer

from supervise.hf import TelemetryCallback  # supervise

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--steps", type=int, default=60)
p.add_argument("--nan-at", type=int, default=None)  # fault
p.add_argument("--sleep", type=float, default=0.0)  # fault
a = p.parse_args()

WORDS = "zero one two three four five six seven eight nine".split()
vocab = {w: i for i, w in enumerate(["<pad>", "<eos>", "<unk>"] + WORDS)}
tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")

rng = random.Random(0)


def counting(n):
    """Count upwards from a random digit: the next word is always predictable."""
    rows = []
    for _ in range(n):
        s = rng.randrange(10)
        rows.append(" ".join(WORDS[(s + i) % 10] for i in range(12)))
    return Dataset.from_dict({"text": rows})


torch.manual_seed(0)
model = LlamaForCausalLM(LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64,
                                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                     max_position_embeddings=64, pad_token_id=0, eos_token_id=1))


class Faults(TrainerCallback):  # fault
    def on_step_end(self, args, state, control, model=None, **kw):  # fault
        time.sleep(a.sleep)  # fault
        if state.global_step == a.nan_at:  # fault
            torch.nn.init.constant_(model.model.embed_tokens.weight, float("nan"))  # fault


config = SFTConfig(output_dir=a.out + "/checkpoints", max_steps=a.steps, per_device_train_batch_size=8,
                   learning_rate=3e-3, logging_steps=10, eval_strategy="steps", eval_steps=20, save_strategy="no",
                   max_length=16, report_to="none", disable_tqdm=True, bf16=False)
trainer = SFTTrainer(model=model, args=config, train_dataset=counting(400), eval_dataset=counting(32),
                     processing_class=tokenizer, callbacks=[Faults()])
trainer.add_callback(TelemetryCallback(a.out))  # supervise
trainer.train()
