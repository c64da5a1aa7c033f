"""A small multi-layer perceptron: four identical residual blocks and a classifier head.

Plain PyTorch, no transformers: the smallest model that has every part phaze looks for (a
prologue, repeated blocks in an ``nn.ModuleList``, a head with a loss).
"""

import torch
from torch import nn

NAME = "mlp"
HIDDEN = 256
CLASSES = 10


class Block(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.up = nn.Linear(hidden, 4 * hidden)
        self.down = nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class MLP(nn.Module):
    def __init__(self, inputs: int = 784, hidden: int = HIDDEN, depth: int = 4, classes: int = CLASSES):
        super().__init__()
        self.embed = nn.Linear(inputs, hidden)
        self.blocks = nn.ModuleList(Block(hidden) for _ in range(depth))
        self.head = nn.Linear(hidden, classes)

    def forward(self, x, labels):
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return nn.functional.cross_entropy(self.head(h), labels)


def get_model() -> nn.Module:
    return MLP()


def get_inputs(micro_batch_size: int):
    return (torch.zeros(micro_batch_size, 784), torch.zeros(micro_batch_size, dtype=torch.long))
