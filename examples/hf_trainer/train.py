"""A Hugging Face Trainer script as users write them, plus one line: recipetune's callback.

A tiny GPT-2 built from a config (nothing downloaded) learns bytes of a few standard-library
modules. The callback writes the metrics stream to $RECIPETUNE_METRICS, which the campaign
(examples/hf-campaign.yaml) sets. Run it on its own with:
    RECIPETUNE_METRICS=/tmp/m.jsonl python examples/hf_trainer/train.py --max_steps 20
"""

from __future__ import annotations

import argparse
import json
import logging
import pathlib

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from recipetune.integrations.hf import RecipetuneCallback


class ByteBlocks(torch.utils.data.Dataset):
    def __init__(self, seq_len: int):
        text = b"".join(pathlib.Path(m.__file__).read_bytes() for m in (argparse, json.decoder, logging))
        data = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
        self.blocks = data[: len(data) // seq_len * seq_len].view(-1, seq_len)

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.blocks[i], "labels": self.blocks[i]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--per_device_train_batch_size", type=int, default=8)
    p.add_argument("--gradient_accumulation_steps", type=int, default=4)
    p.add_argument("--max_steps", type=int, default=30)
    p.add_argument("--learning_rate", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seq_len", type=int, default=64)
    p.add_argument("--output_dir", default="out-hf")
    a = p.parse_args()

    # No dropout: its masks come from the RNG stream, which the micro-batch shape would shift.
    config = GPT2Config(vocab_size=256, n_positions=a.seq_len, n_embd=32, n_layer=1, n_head=2,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    args = TrainingArguments(
        output_dir=a.output_dir, per_device_train_batch_size=a.per_device_train_batch_size,
        gradient_accumulation_steps=a.gradient_accumulation_steps, max_steps=a.max_steps,
        learning_rate=a.learning_rate, seed=a.seed, logging_steps=1,  # every step: recipetune measures each
        include_num_input_tokens_seen=True, save_strategy="no", report_to="none", use_cpu=True,
        disable_tqdm=True, dataloader_num_workers=0,
    )
    trainer = Trainer(model=GPT2LMHeadModel(config), args=args, train_dataset=ByteBlocks(a.seq_len),
                      callbacks=[RecipetuneCallback()])  # the one line recipetune needs
    trainer.train()


if __name__ == "__main__":
    main()
