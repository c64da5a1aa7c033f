"""A two-convolution CNN: its convolutions become implicit GEMMs (phaze.matmul over im2col views,
tests/test_moe_conv.py)."""

import torch
from torch import nn

NAME = "cnn"


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, padding=1)
        self.conv2 = nn.Conv2d(64, 64, 3, padding=1)
        self.head = nn.Linear(64, 10)

    def forward(self, x, labels):
        h = torch.relu(self.conv2(torch.relu(self.conv1(x))))
        return nn.functional.cross_entropy(self.head(h.mean((2, 3))), labels)


def get_model():
    return CNN()


def get_inputs(b):
    return (torch.zeros(b, 3, 32, 32), torch.zeros(b, dtype=torch.long))
