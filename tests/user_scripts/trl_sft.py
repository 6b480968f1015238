"""Supervised fine-tuning, cut down from TRL's trl/scripts/sft.py: TrlParser over
(ScriptArguments, SFTConfig), main(script_args, training_args), and
trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint). Offline: a tiny
Llama built from a config, a word-level tokenizer built in memory, generated counting text.

    python -u trl_sft.py --output_dir runs/a --max_steps 80 --learning_rate 3e-3 --logging_steps 10 \\
        --eval_strategy steps --eval_steps 20 --save_steps 20 --report_to none

Lines ending in "# supervise" are the whole integration. Faults come from the environment
(faults.py).
"""
import random
from dataclasses import dataclass, field

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, TrainerCallback
from trl import SFTConfig, SFTTrainer, TrlParser

import faults  # fault
from supervise.hf import TelemetryCallback  # supervise

WORDS = "zero one two three four five six seven eight nine".split()


@dataclass
class ScriptArguments:
    train_samples: int = field(default=400, metadata={"help": "Generated training rows."})
    eval_samples: int = field(default=32, metadata={"help": "Generated evaluation rows."})


def counting(n, seed):
    """Count upwards from a random digit: the next word is always predictable."""
    rng = random.Random(seed)
    return Dataset.from_dict({"text": [" ".join(WORDS[(s + i) % 10] for i in range(12))
                                       for s in (rng.randrange(10) for _ in range(n))]})


class Faults(TrainerCallback):  # fault
    def on_step_end(self, args, state, control, model=None, **kw):  # fault
        faults.step_done(state.global_step, model.parameters())  # fault


def main(script_args, training_args):
    vocab = {w: i for i, w in enumerate(["<pad>", "<eos>", "<unk>"] + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    torch.manual_seed(training_args.seed)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=64, pad_token_id=0, eos_token_id=1))
    trainer = SFTTrainer(
        model=model,
        args=training_args,
        train_dataset=counting(script_args.train_samples, 0),
        eval_dataset=counting(script_args.eval_samples, 1) if training_args.eval_strategy != "no" else None,
        processing_class=tokenizer,
        callbacks=[Faults(), TelemetryCallback(training_args.output_dir)],  # supervise
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.accelerator.print("Training completed.")
    trainer.save_model(training_args.output_dir)


if __name__ == "__main__":
    parser = TrlParser((ScriptArguments, SFTConfig))
    script_args, training_args = parser.parse_args_and_config()
    main(script_args, training_args)
