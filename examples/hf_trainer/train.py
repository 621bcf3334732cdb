"""A Hugging Face Trainer script as users write them, plus one line: recipetune's callback.

Its flags are `TrainingArguments`' own, parsed by `HfArgumentParser` as in HF's
examples/pytorch/language-modeling/run_clm.py, plus two of its own (`--seq_len`, `--dropout`). A
tiny GPT-2 built from a config (nothing downloaded) learns bytes of a few standard-library modules;
`--do_eval` measures the loss on another module's bytes. The callback writes the metrics stream
to $RECIPETUNE_METRICS, which the campaign (examples/hf-campaign.yaml) sets. On its own:
    RECIPETUNE_METRICS=/tmp/m.jsonl python examples/hf_trainer/train.py --output_dir /tmp/hf \
        --do_train --max_steps 20 --logging_steps 1 --include_num_input_tokens_seen all --use_cpu --report_to none
"""

from __future__ import annotations

import argparse
import json
import logging
import pathlib
import string
from dataclasses import dataclass, field
from types import ModuleType

import torch
from transformers import GPT2Config, GPT2LMHeadModel, HfArgumentParser, Trainer, TrainingArguments, set_seed

from recipetune.integrations.hf import RecipetuneCallback


@dataclass
class ModelArguments:
    seq_len: int = field(default=64, metadata={"help": "tokens (bytes) per sample"})
    dropout: float = field(default=0.0, metadata={"help": "GPT-2's three dropout rates"})


class ByteBlocks(torch.utils.data.Dataset):
    def __init__(self, modules: tuple[ModuleType, ...], seq_len: int):
        text = b"".join(pathlib.Path(m.__file__).read_bytes() for m in modules)  # type: ignore[arg-type]
        data = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
        self.blocks = data[: len(data) // seq_len * seq_len].view(-1, seq_len)

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.blocks[i], "labels": self.blocks[i]}


def main() -> None:
    model_args, args = HfArgumentParser((ModelArguments, TrainingArguments)).parse_args_into_dataclasses()
    set_seed(args.seed)
    d = model_args.dropout  # off for tuning runs: dropout masks are drawn from an RNG stream the split shifts
    config = GPT2Config(vocab_size=256, n_positions=model_args.seq_len, n_embd=32, n_layer=1, n_head=2,
                        resid_pdrop=d, embd_pdrop=d, attn_pdrop=d)
    trainer = Trainer(model=GPT2LMHeadModel(config), args=args,
                      train_dataset=ByteBlocks((argparse, json.decoder, logging), model_args.seq_len),
                      eval_dataset=ByteBlocks((string,), model_args.seq_len),
                      callbacks=[RecipetuneCallback()])  # the one line recipetune needs
    if args.do_train:
        trainer.train()
    if args.do_eval:
        trainer.evaluate()


if __name__ == "__main__":
    main()
