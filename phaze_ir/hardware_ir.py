"""The hardware description in the IR: ``phaze.accelerator @acc {...}``.

The op's ``spec`` is :meth:`phaze_ir.hardware.Accelerator.to_dict` as a dictionary attribute
(nested dicts, lists as arrays, booleans as ``true``/``false`` (``i1``), ints as ``i64``, floats
as ``f64``), so every ``.mlir`` file
carries the chip it was compiled for and reads it back exactly.
"""

from __future__ import annotations

import functools
from typing import Any

from xdsl.dialects.builtin import (
    ArrayAttr,
    DictionaryAttr,
    Float64Type,
    FloatAttr,
    IntegerAttr,
    ModuleOp,
    StringAttr,
    SymbolRefAttr,
    i1,
    i64,
)
from xdsl.ir import Attribute

from phaze_ir import keys
from phaze_ir.dialect import AcceleratorOp
from phaze_ir.errors import PhazeError
from phaze_ir.hardware import Accelerator, HardwareError


def to_attr(value: Any) -> Attribute:
    """A plain JSON-like value as an attribute."""
    if isinstance(value, bool):  # before int: a bool is an int to Python
        return IntegerAttr(int(value), i1)
    if isinstance(value, int):
        return IntegerAttr(value, i64)
    if isinstance(value, float):
        return FloatAttr(value, Float64Type())
    if isinstance(value, str):
        return StringAttr(value)
    if isinstance(value, dict):
        return DictionaryAttr({k: to_attr(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return ArrayAttr([to_attr(v) for v in value])
    raise TypeError(f"cannot store {value!r} in an attribute")


def from_attr(attr: Attribute) -> Any:
    """The inverse of :func:`to_attr`."""
    if isinstance(attr, IntegerAttr):
        return bool(attr.value.data) if attr.type == i1 else attr.value.data
    if isinstance(attr, FloatAttr):
        return attr.value.data
    if isinstance(attr, StringAttr):
        return attr.data
    if isinstance(attr, DictionaryAttr):
        return {k: from_attr(v) for k, v in attr.data.items()}
    if isinstance(attr, ArrayAttr):
        return [from_attr(v) for v in attr.data]
    raise TypeError(f"unexpected attribute {attr} in a hardware description")


def accelerator_op(acc: Accelerator, sym_name: str = "acc") -> AcceleratorOp:
    """The ``phaze.accelerator`` op describing ``acc``."""
    return AcceleratorOp.build(properties={"sym_name": StringAttr(sym_name), "spec": to_attr(acc.to_dict())})


def accelerator_of(op: AcceleratorOp) -> Accelerator:
    """The hardware an accelerator op describes (validated as a hardware file would be)."""
    return _described(op.spec, op.sym_name.data)


@functools.lru_cache(maxsize=32)
def _described(spec: Attribute, sym_name: str) -> Accelerator:
    """The accelerator of a ``spec``, read and validated once per distinct description: every
    pass from tiling to placement asks for the module's chip, and attributes are immutable
    values (equal and hashed by content), so an equal spec is the same chip; the ``Accelerator``
    is frozen, so sharing it is safe. Nothing else keys this cache, so nothing invalidates it."""
    try:
        return Accelerator.from_dict(from_attr(spec), source=f"@{sym_name}")
    except HardwareError as e:
        raise PhazeError(str(e)) from e


def set_accelerator(module: ModuleOp, acc: Accelerator, sym_name: str = "acc") -> AcceleratorOp:
    """Put ``acc`` at the top of ``module`` (replacing an accelerator of the same name) and
    point ``phaze.target`` at it."""
    for op in list(module.ops):
        if isinstance(op, AcceleratorOp) and op.sym_name.data == sym_name:
            module.body.block.erase_op(op)
    new = accelerator_op(acc, sym_name)
    first = module.body.block.first_op
    if first is None:
        module.body.block.add_op(new)
    else:
        module.body.block.insert_op_before(new, first)
    module.attributes[keys.TARGET] = SymbolRefAttr(sym_name)
    return new


def module_accelerator(module: ModuleOp, pass_name: str) -> Accelerator:
    """The accelerator a module targets, or a clear error naming the pass that needs it."""
    target = module.attributes.get(keys.TARGET)
    accs = [op for op in module.ops if isinstance(op, AcceleratorOp)]
    if isinstance(target, SymbolRefAttr):
        accs = [op for op in accs if op.sym_name.data == target.root_reference.data]
    if not accs:
        raise PhazeError(
            f"'{module.name}' op requires a 'phaze.accelerator' op for {pass_name}; "
            "compile with phazec --hw NAME|FILE (or add one)"
        )
    return accelerator_of(accs[0])
