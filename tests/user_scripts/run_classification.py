"""Text classification with the Trainer, cut down from transformers'
examples/pytorch/text-classification/run_classification.py: HfArgumentParser over
(ModelArguments, DataTrainingArguments, TrainingArguments), a .json config file or flags,
resume_from_checkpoint passed to trainer.train(), accuracy as the eval metric. Offline: a tiny
BERT built from a config, a word-level tokenizer built in memory, generated sentences.

    python -u run_classification.py --output_dir runs/a --do_train --do_eval --max_steps 80 \\
        --eval_strategy steps --eval_steps 20 --save_steps 20 --logging_steps 10 --report_to none

Lines ending in "# supervise" are the whole integration. Faults come from the environment
(faults.py).
"""
import logging
import os
import random
import sys
from dataclasses import dataclass, field

import numpy as np
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (BertConfig, BertForSequenceClassification, HfArgumentParser, PreTrainedTokenizerFast,
                          Trainer, TrainerCallback, TrainingArguments, default_data_collator, set_seed)

import faults  # fault
from supervise.hf import TelemetryCallback  # supervise

logger = logging.getLogger(__name__)
GOOD = "great good fine lovely superb nice".split()
BAD = "awful bad poor dreadful nasty grim".split()
FILLER = "the a film plot was is very quite and but".split()


@dataclass
class ModelArguments:
    hidden_size: int = field(default=32, metadata={"help": "Width of the tiny BERT built from a config."})
    num_hidden_layers: int = field(default=1, metadata={"help": "Layers of the tiny BERT."})


@dataclass
class DataTrainingArguments:
    max_seq_length: int = field(default=16, metadata={"help": "Tokens per sentence, padded or truncated."})
    max_train_samples: int = field(default=1200, metadata={"help": "Generated training sentences."})
    max_eval_samples: int = field(default=128, metadata={"help": "Generated evaluation sentences."})


def sentences(n, seed):
    """A sentiment word decides the label; the filler words carry nothing."""
    rng = random.Random(seed)
    text, label = [], []
    for _ in range(n):
        y = rng.randrange(2)
        words = [rng.choice(FILLER) for _ in range(6)]
        words.insert(rng.randrange(7), rng.choice(GOOD if y else BAD))
        text.append(" ".join(words))
        label.append(y)
    return Dataset.from_dict({"sentence": text, "label": label})


class Faults(TrainerCallback):  # fault
    def on_step_end(self, args, state, control, model=None, **kw):  # fault
        faults.step_done(state.global_step, model.parameters())  # fault


def main():
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, TrainingArguments))
    if len(sys.argv) == 2 and sys.argv[1].endswith(".json"):
        model_args, data_args, training_args = parser.parse_json_file(json_file=os.path.abspath(sys.argv[1]))
    else:
        model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s", level=logging.INFO)
    logger.info(f"Training/evaluation parameters {training_args}")
    set_seed(training_args.seed)

    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]"] + GOOD + BAD + FILLER)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]")

    def preprocess_function(examples):
        return tokenizer(examples["sentence"], padding="max_length", max_length=data_args.max_seq_length,
                         truncation=True)

    train_dataset = sentences(data_args.max_train_samples, 0).map(preprocess_function, batched=True)
    eval_dataset = sentences(data_args.max_eval_samples, 1).map(preprocess_function, batched=True)
    config = BertConfig(vocab_size=len(vocab), hidden_size=model_args.hidden_size,
                        num_hidden_layers=model_args.num_hidden_layers, num_attention_heads=2,
                        intermediate_size=2 * model_args.hidden_size, max_position_embeddings=64, num_labels=2)
    model = BertForSequenceClassification(config)

    def compute_metrics(p):
        preds = np.argmax(p.predictions, axis=1)
        return {"accuracy": float((preds == p.label_ids).mean())}

    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset if training_args.do_train else None,
        eval_dataset=eval_dataset if training_args.do_eval else None,
        compute_metrics=compute_metrics,
        processing_class=tokenizer,
        data_collator=default_data_collator,
        callbacks=[Faults(), TelemetryCallback(training_args.output_dir)],  # supervise
    )
    if training_args.do_train:
        checkpoint = None
        if training_args.resume_from_checkpoint is not None:
            checkpoint = training_args.resume_from_checkpoint
        train_result = trainer.train(resume_from_checkpoint=checkpoint)
        trainer.save_model()
        trainer.log_metrics("train", train_result.metrics)
        trainer.save_state()
    if training_args.do_eval:
        metrics = trainer.evaluate(eval_dataset=eval_dataset)
        trainer.log_metrics("eval", metrics)


if __name__ == "__main__":
    main()
