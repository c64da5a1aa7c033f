"""A GEMM-bound training step: a wide MLP (two residual blocks of 8192 -> 32768 -> 8192) on
large batches, where every matrix multiply is big enough to fill a chip's tensor units and
the vector work (norms, GELU, residuals) is a few per cent of the time.  The workload of
``benchmarks/power_check.py``, which compares a chip's predicted power on it with the chip's
published power (1.1 B parameters: the Adam state fits one TPUv4's 32 GiB)."""

import torch
from torch import nn

NAME = "wide-mlp"
INPUTS = 8192
HIDDEN = 8192
DEPTH = 2
CLASSES = 1024


class Block(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.up = nn.Linear(hidden, 4 * hidden)
        self.down = nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class WideMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(INPUTS, HIDDEN)
        self.blocks = nn.ModuleList(Block(HIDDEN) for _ in range(DEPTH))
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x, labels):
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return nn.functional.cross_entropy(self.head(h), labels)


def get_model() -> nn.Module:
    return WideMLP()


def get_inputs(micro_batch_size: int):
    return (torch.zeros(micro_batch_size, INPUTS), torch.zeros(micro_batch_size, dtype=torch.long))
