"""A GEMM-bound training step: ``examples/mlp.py``'s MLP made wide (two residual blocks of
8192 -> 32768 -> 8192) on large batches, where every matrix multiply is big enough to fill a
chip's tensor units and the vector work (norms, GELU, residuals) is a few per cent of the time.
The workload of ``benchmarks/power_check.py``, which compares a chip's predicted power on it
with the chip's published power (1.1 B parameters: the Adam state fits one TPUv4's 32 GiB)."""

import importlib.util
from pathlib import Path

import torch
from torch import nn

NAME = "wide-mlp"
INPUTS = 8192
HIDDEN = 8192
DEPTH = 2
CLASSES = 1024

# The example's model, loaded by path (model files are not a package).
_spec = importlib.util.spec_from_file_location("phaze_example_mlp", Path(__file__).parents[2] / "examples" / "mlp.py")
assert _spec is not None and _spec.loader is not None
_example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_example)


def get_model() -> nn.Module:
    return _example.MLP(inputs=INPUTS, hidden=HIDDEN, depth=DEPTH, classes=CLASSES)


def get_inputs(micro_batch_size: int):
    return (torch.zeros(micro_batch_size, INPUTS), torch.zeros(micro_batch_size, dtype=torch.long))
