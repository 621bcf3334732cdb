"""A litgpt DataModule of made-up tokens (nothing downloaded): half of the tokens follow their
predecessor by one, so the loss can fall. For trying the campaign on a CPU, not for training."""

from dataclasses import dataclass

import torch
from litgpt.data import DataModule
from torch.utils.data import DataLoader, Dataset


class Tokens(Dataset):
    def __init__(self, n: int, seq: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        base = torch.randint(0, 64, (n, seq + 1), generator=g)
        self.data = torch.where(torch.rand(n, seq + 1, generator=g) < 0.5, (base.roll(1, 1) + 1) % 64, base)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.data[i]


@dataclass
class Tiny(DataModule):
    seq: int = 32
    batch_size: int = 1

    def connect(self, tokenizer=None, batch_size=1, max_seq_length=None) -> None:
        self.batch_size = batch_size

    def train_dataloader(self) -> DataLoader:
        return DataLoader(Tokens(4096, self.seq, 0), batch_size=self.batch_size, shuffle=False)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(Tokens(64, self.seq, 1), batch_size=self.batch_size, shuffle=False)
