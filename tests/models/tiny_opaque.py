"""A two-layer MLP with a modified-Bessel activation: phaze has no semantics for aten.special_i0
nor for its derivative's aten.special_i1, so they are imported as phaze.opaque (the honest-plan
tests use it). torch has no FLOP formula for them either."""

import torch
from torch import nn

NAME = "opaque"


class I0(nn.Module):
    def forward(self, x):
        return torch.special.i0(x)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 256)
        self.act1 = I0()
        self.fc2 = nn.Linear(256, 64)
        self.act2 = I0()
        self.head = nn.Linear(64, 10)

    def forward(self, x, labels):
        h = self.act2(self.fc2(self.act1(self.fc1(x))))
        return nn.functional.cross_entropy(self.head(h), labels)


def get_model():
    return MLP()


def get_inputs(b):
    return (torch.zeros(b, 64), torch.zeros(b, dtype=torch.long))
