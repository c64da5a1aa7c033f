"""Upstream MLIR reads phaze's generic form.

``iree-opt --allow-unregistered-dialect`` (IREE's build of upstream MLIR, from the
``iree-base-compiler`` package of the dev extras) parses the generic form of every ``--emit``
stage of a small model and of a plan, and keeps every op (the count per op name of its generic
output equals phaze's); what it prints parses back in phaze to the same IR (upstream MLIR sorts
attribute dictionaries, so the text differs but the module is structurally equivalent).  Also a
module holding every record attribute with extreme values (inf, NaN, -0.0, huge ints, strings
with quotes and non-ASCII characters) survives the same trip.
"""

from __future__ import annotations

import collections
import functools
import math
import re
import shutil
import subprocess
import typing
from pathlib import Path

import pytest
from conftest import MODELS
from xdsl.dialects.builtin import ArrayAttr, FloatData, IntAttr, ModuleOp, StringAttr
from xdsl.dialects.utils import EnumAttribute

from phaze_ir.attributes import RecordAttr
from phaze_ir.dialect import Phaze
from phaze_ir.ir import parse_module, print_module

STAGES = ["ir", "training", "sharded", "tiled", "latency", "scheduled", "recompute", "plan"]


def _find_iree_opt() -> str | None:
    """The iree-base-compiler package's own iree-opt, else one on PATH (a pyenv shim on PATH may
    point at another Python's, so the package comes first)."""
    try:
        from iree.compiler.tools.binaries import find_tool

        return find_tool("iree-opt")
    except Exception:  # no package, or a package without iree-opt
        return shutil.which("iree-opt")


IREE_OPT = _find_iree_opt()
pytestmark = pytest.mark.skipif(
    IREE_OPT is None,
    reason="iree-opt not found (neither on PATH nor in the iree-base-compiler package: pip install -e '.[dev]')",
)

# One op per line in the generic form: optional results, then the quoted op name and its operands.
GENERIC_OP = re.compile(r'^\s*(?:%[^=]+=\s*)?"([\w.$]+)"\(', re.MULTILINE)


def iree_opt(generic_text: str, tmp_path: Path) -> str:
    """``iree-opt --allow-unregistered-dialect --mlir-print-op-generic`` on the text."""
    src = tmp_path / "in.mlir"
    src.write_text(generic_text)
    r = subprocess.run(
        [IREE_OPT, "--allow-unregistered-dialect", "--mlir-print-op-generic", str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def op_counts(module) -> collections.Counter:
    return collections.Counter(op.name for op in module.walk())


@functools.cache
def stage_text(emit: str) -> str:
    """``phazec tests/models/tiny_gpt2.py --emit STAGE --hw tpuv4 --micro-batch 1 --tp 2`` (TP 2:
    the sharded stages hold collectives), in-process."""
    from phaze.tools.phazec import _parser, compile_model

    args = _parser().parse_args(
        [str(MODELS / "tiny_gpt2.py"), "--emit", emit, "--hw", "tpuv4", "--micro-batch", "1", "--tp", "2", "-q"]
    )
    text, failure = compile_model(args, lambda msg: None)
    assert failure is None, failure
    return text


def _check_upstream_round_trip(module, tmp_path: Path) -> str:
    generic = print_module(module, generic=True)
    out = iree_opt(generic, tmp_path)
    ours = op_counts(module)
    assert collections.Counter(GENERIC_OP.findall(generic)) == ours  # the regex counts what phaze holds
    assert collections.Counter(GENERIC_OP.findall(out)) == ours  # iree-opt kept every op
    back = parse_module(out, "iree-opt-output.mlir")  # and phaze reads what upstream MLIR prints
    assert op_counts(back) == ours
    assert back.is_structurally_equivalent(module)
    return out


@pytest.mark.parametrize("emit", STAGES)
def test_upstream_mlir_reads_each_stage(emit, tmp_path):
    module = parse_module(stage_text(emit))
    out = _check_upstream_round_trip(module, tmp_path)
    if emit == "plan":
        assert '"phaze.matmul"' in out and "#phaze.plan<" in out and "#phaze.sched<" in out


def _extreme(cls: type[RecordAttr], variant: int) -> RecordAttr:
    """An instance of ``cls`` whose fields hold extreme values of their declared types (within
    the range a bounded field's verifier allows)."""
    floats = [math.inf, -math.inf, math.nan, -0.0, 5e-324, 1.7976931348623157e308, 8e-08, 1e22]
    ints = [2**200, -(2**63), 0, 2**64 + 1]
    strings = ['say "hi" \\ back', "é漢\U0001f600", "a>b}{", "\x00\n\t", "x" * 3000]
    values = {}
    for i, f in enumerate(cls.FIELDS):
        hint = typing.get_type_hints(cls)[f]
        k = i + variant
        if isinstance(hint, type) and issubclass(hint, EnumAttribute):
            words = [str(e.value) for e in hint.enum_type]
            values[f] = words[k % len(words)]
        else:
            pool = {IntAttr: ints, FloatData: floats, StringAttr: strings}[hint]
            if f in cls.RANGES:  # a bounded field: the extremes its verifier lets through
                least, most = cls.RANGES[f]
                if hint is IntAttr:
                    pool = [int(least), int(most) if most < math.inf else 2**200]
                else:
                    top = most if most < math.inf else 1.7976931348623157e308
                    pool = [float(least), 5e-324, float(top)] + ([1e22] if 1e22 <= most else [])
            values[f] = pool[k % len(pool)]
    return cls.make(**values)


def test_upstream_mlir_keeps_extreme_record_values(tmp_path):
    records = [a for a in Phaze.attributes if isinstance(a, type) and issubclass(a, RecordAttr)]
    attrs = [_extreme(cls, v) for cls in records for v in range(8)]
    module = ModuleOp([])
    module.attributes["phaze.records"] = ArrayAttr(attrs)
    out = _check_upstream_round_trip(module, tmp_path)
    back = parse_module(out)
    assert list(back.attributes["phaze.records"].data) == attrs  # bit for bit (FloatData compares bits)
