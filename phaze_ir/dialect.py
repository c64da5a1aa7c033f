"""The ``phaze`` dialect: a small, semantic op set for one training step of a model.

Values are builtin ``tensor<...>`` types (shape and element type).  Every compute op implements
the :class:`ComputeOp` interface (iteration space, FLOPs, bytes read and written); the cost
passes price ops through that interface, never through per-op code.

Op semantics are *properties* (``kind``, ``dims``, ...).  What passes learn about an op goes in
discardable ``phaze.*`` attributes, each declared once in ``phaze_ir/keys.py`` with its writer.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

from xdsl.dialects.builtin import (
    I64,
    DenseArrayBase,
    DictionaryAttr,
    IntegerAttr,
    IntegerType,
    StringAttr,
    SymbolNameConstraint,
    TensorType,
    i64,
)
from xdsl.ir import Attribute, Dialect, Operation, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    irdl_op_definition,
    operand_def,
    opt_operand_def,
    prop_def,
    result_def,
    traits_def,
    var_operand_def,
    var_result_def,
)
from xdsl.traits import SymbolOpInterface
from xdsl.utils.exceptions import VerifyException

from phaze_ir.attributes import (
    ENUM_ATTRS,
    BaselineAttr,
    EnergyAttr,
    KernelAttr,
    LatencyAttr,
    LayerEnergyAttr,
    LayerFlopsAttr,
    LayerInfoAttr,
    LayerLatencyAttr,
    LayerMemoryAttr,
    LayerRecomputeAttr,
    LayerScheduleAttr,
    PlanAttr,
    PowerAttr,
    ReplicatedLinearsAttr,
    SchedAttr,
    StageInfoAttr,
    TileAttr,
    UnpricedOpAttr,
)
from phaze_ir.op_kinds import OPTIMIZER_EXTRA_BYTES, OPTIMIZER_KINDS, VIEW_KINDS

# The discardable attribute keys are declared in phaze_ir/keys.py.
PHASES = ("fwd", "bwd", "opt")


# --------------------------------------------------------------------------------------------
# Tensor helpers
# --------------------------------------------------------------------------------------------


def attr_text(attr: Attribute) -> str:
    """An attribute or type as MLIR text, memoized: the passes name ops by their properties
    and types (op signatures), and printing the same ``tensor<...>`` for every op of every
    layer was a third of a pipeline's time; attributes are immutable and hash by value.  An
    attribute object met before is found by its identity first (each pass that prices the ops
    asks again of the same objects, and hashing a tensor type hashes its shape element by
    element: a sixteenth of GPT-3 175B's settings), then by value."""
    hit = _TEXT_OF_OBJECT.get(id(attr))
    if hit is not None and hit[0] is attr:  # (kept beside its text: no other object takes its id)
        return hit[1]
    text = _attr_text(attr)
    if len(_TEXT_OF_OBJECT) >= _TEXTS_KEPT:
        _TEXT_OF_OBJECT.clear()
    _TEXT_OF_OBJECT[id(attr)] = (attr, text)
    return text


#: :func:`attr_text`'s texts by the attribute object's identity (the object kept alive beside
#: it), forgotten all at once past ``_TEXTS_KEPT`` objects (a search compiles many modules).
_TEXT_OF_OBJECT: dict[int, tuple[Attribute, str]] = {}
_TEXTS_KEPT = 1 << 18


@functools.lru_cache(maxsize=1 << 16)
def _attr_text(attr: Attribute) -> str:
    """:func:`attr_text` by value."""
    return str(attr)


def element_bytes(element_type: Attribute) -> int:
    """Storage bytes of one element (``i1`` is a byte, as in torch)."""
    width = getattr(element_type, "bitwidth", None)
    if width is None:
        raise ValueError(f"unsupported element type {element_type}")
    return max(1, (width + 7) // 8)


def numel(t: Attribute) -> int:
    """Number of elements of a ranked tensor type (1 for a 0-d tensor)."""
    assert isinstance(t, TensorType), t
    return math.prod(t.get_shape())


def tensor_bytes(t: Attribute) -> int:
    """Bytes of a ranked tensor type."""
    assert isinstance(t, TensorType), t
    return numel(t) * element_bytes(t.element_type)


def tensor_type(v: SSAValue) -> TensorType:
    """The tensor type of a value (every operand and result of a ``phaze`` compute op is one)."""
    t = v.type
    assert isinstance(t, TensorType), t
    return t


def _bytes_of(values: Sequence[SSAValue]) -> int:
    return sum(tensor_bytes(v.type) for v in values)


def _check_kind(op: Operation, kind: str, allowed: Sequence[str]) -> None:
    if kind not in allowed:
        raise VerifyException(f"'{op.name}' op has unknown kind \"{kind}\"; expected one of {', '.join(allowed)}")


class ComputeOp(IRDLOperation):
    """Interface of every op that computes or moves data.

    ``iteration_space()`` is the loop nest the op runs (for a matmul ``(*batch, M, N, K)``, for
    an elementwise op the result shape); ``flops()`` the floating-point operations it performs;
    ``bytes_read()``/``bytes_written()`` the bytes of its operands/results (unfused, as the op
    stands alone).  Later cost passes tile and price ops through these methods.
    """

    def iteration_space(self) -> tuple[int, ...]:
        return tuple(tensor_type(self.results[0]).get_shape()) if self.results else ()

    def flops(self) -> int:
        return 0

    def bytes_read(self) -> int:
        return _bytes_of(self.operands)

    def bytes_written(self) -> int:
        return _bytes_of(self.results)


# --------------------------------------------------------------------------------------------
# Ops
# --------------------------------------------------------------------------------------------


@irdl_op_definition
class MatmulOp(ComputeOp):
    """Batched matrix multiply: ``[*B, M, K] x [*B', K, N] (+ bias) -> [*B'', M, N]``.

    Batch dims broadcast as in ``torch.matmul``; the optional ``bias`` broadcasts to the result
    (``aten.addmm``).  Operands are already in canonical layout: transposes are explicit
    ``phaze.layout`` ops, so that ``2*M*N*K*prod(B)`` can be read off the operand shapes.

    Syntax::

        %y = phaze.matmul %x, %w, %b : (tensor<8x64xf16>, tensor<64x32xf16>, tensor<32xf16>) -> tensor<8x32xf16>
    """

    name = "phaze.matmul"
    lhs = operand_def(TensorType)
    rhs = operand_def(TensorType)
    bias = opt_operand_def(TensorType)
    result = result_def(TensorType)
    assembly_format = "$lhs `,` $rhs (`,` $bias^)? attr-dict `:` functional-type(operands, results)"

    def __init__(self, lhs: SSAValue, rhs: SSAValue, result_type: Attribute, bias: SSAValue | None = None):
        super().__init__(operands=[lhs, rhs, [bias] if bias is not None else []], result_types=[result_type])

    def mnk(self) -> tuple[tuple[int, ...], int, int, int]:
        """``(batch_shape, M, N, K)`` of the product."""
        out = self.result.type.get_shape()
        k = tensor_type(self.lhs).get_shape()[-1]
        return tuple(out[:-2]), out[-2], out[-1], k

    def iteration_space(self) -> tuple[int, ...]:
        batch, m, n, k = self.mnk()
        return (*batch, m, n, k)

    def flops(self) -> int:
        batch, m, n, k = self.mnk()
        bias = m * n if self.bias is not None else 0
        return math.prod(batch) * (2 * m * n * k + bias)

    def verify_(self) -> None:
        a, b, r = (tensor_type(v).get_shape() for v in (self.lhs, self.rhs, self.result))
        if len(a) < 2 or len(b) < 2:
            raise VerifyException(f"'phaze.matmul' op operands must have rank >= 2, got {len(a)} and {len(b)}")
        if a[-1] != b[-2]:
            raise VerifyException(
                f"'phaze.matmul' op contracting dimensions differ: lhs has K = {a[-1]}, rhs has K = {b[-2]}"
            )
        try:
            import numpy as np

            batch = tuple(np.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2])))
        except ValueError:
            raise VerifyException(
                f"'phaze.matmul' op batch dimensions {tuple(a[:-2])} and {tuple(b[:-2])} do not broadcast"
            ) from None
        expected = (*batch, a[-2], b[-1])
        if tuple(r) != expected:
            raise VerifyException(f"'phaze.matmul' op result shape {tuple(r)} does not match expected {expected}")


ELEMENTWISE_KINDS: dict[str, int] = {
    # kind -> FLOPs per output element (transcendentals counted as a few ops, as vector units do)
    "add": 1,
    "sub": 1,
    "mul": 1,
    "div": 1,
    "neg": 1,
    "abs": 1,
    "max": 1,
    "min": 1,
    "pow": 2,
    "sqrt": 2,
    "rsqrt": 2,
    "exp": 4,
    "log": 4,
    "tanh": 4,
    "sigmoid": 4,
    "erf": 4,
    "sin": 4,
    "cos": 4,
    "gelu": 8,
    "silu": 5,
    "relu": 1,
    "gelu_grad": 12,
    "tanh_grad": 3,
    "sigmoid_grad": 3,
    "silu_grad": 8,
    "relu_grad": 1,
    "compare": 1,
    "where": 1,
    "logical": 1,
    "clamp": 2,
    "convert": 0,
    "copy": 0,
    "fill": 0,
    "arange": 0,
    "random": 2,
    "dropout": 2,
    "nll_loss_grad": 1,
    "masked_fill": 1,
}


@irdl_op_definition
class ElementwiseOp(ComputeOp):
    """Pointwise op over broadcast operands (zero operands for creation ops like ``fill``).

    ``kind`` is one of :data:`ELEMENTWISE_KINDS`; the original aten op is kept in
    ``aten`` (e.g. ``"aten.mul.Tensor"``) so nothing about the source is lost.

    Syntax::

        %y = phaze.elementwise "mul" %a, %b {aten = "aten.mul.Tensor"} : (tensor<4xf16>, tensor<4xf16>) -> tensor<4xf16>
    """

    name = "phaze.elementwise"
    kind = prop_def(StringAttr)
    aten = prop_def(StringAttr)
    inputs = var_operand_def(TensorType)
    result = result_def(TensorType)
    assembly_format = "$kind ($inputs^)? `aten` $aten attr-dict `:` functional-type($inputs, $result)"

    def flops(self) -> int:
        return ELEMENTWISE_KINDS.get(self.kind.data, 1) * numel(self.result.type)

    def verify_(self) -> None:
        _check_kind(self, self.kind.data, tuple(ELEMENTWISE_KINDS))


REDUCTION_KINDS = (
    "sum",
    "mean",
    "max",
    "min",
    "prod",
    "argmax",
    "var",
    "norm",
    "nll_loss",
    "any",
    "all",
    "topk",
    "sort",
    "histc",
)


@irdl_op_definition
class ReductionOp(ComputeOp):
    """Reduction over ``dims`` of ``input`` (empty ``dims`` = all dims).

    Syntax::

        %s = phaze.reduction "sum" %x dims [0, 1] aten "aten.sum.dim_IntList" : (tensor<4x8xf32>) -> tensor<f32>
    """

    name = "phaze.reduction"
    kind = prop_def(StringAttr)
    dims = prop_def(DenseArrayBase[I64])
    aten = prop_def(StringAttr)
    inputs = var_operand_def(TensorType)
    results_ = var_result_def(TensorType)
    assembly_format = "$kind $inputs `dims` $dims `aten` $aten attr-dict `:` functional-type($inputs, $results_)"

    def iteration_space(self) -> tuple[int, ...]:
        return tuple(tensor_type(self.inputs[0]).get_shape())

    def flops(self) -> int:
        return sum(numel(v.type) for v in self.inputs)

    def verify_(self) -> None:
        _check_kind(self, self.kind.data, REDUCTION_KINDS)
        rank = tensor_type(self.inputs[0]).get_num_dims() if self.inputs else 0
        for d in self.dims.get_values():
            if not -rank <= d < max(rank, 1):
                raise VerifyException(f"'phaze.reduction' op dim {d} is out of range for rank {rank}")


SOFTMAX_KINDS = ("softmax", "log_softmax", "softmax_grad", "log_softmax_grad")


@irdl_op_definition
class SoftmaxOp(ComputeOp):
    """(Log-)softmax along ``dim``, and its gradient (``*_grad`` kinds take grad and output).

    Syntax::

        %p = phaze.softmax "softmax" %s dim 3 : (tensor<1x16x64x64xf32>) -> tensor<1x16x64x64xf32>
    """

    name = "phaze.softmax"
    kind = prop_def(StringAttr)
    dim = prop_def(IntegerAttr[I64])
    inputs = var_operand_def(TensorType)
    result = result_def(TensorType)
    assembly_format = "$kind $inputs `dim` $dim attr-dict `:` functional-type($inputs, $result)"

    def flops(self) -> int:
        # max, subtract, exp, sum, divide: about 5 per element (the grad: mul, sum, sub, mul).
        return 5 * numel(self.result.type)

    def verify_(self) -> None:
        _check_kind(self, self.kind.data, SOFTMAX_KINDS)
        rank = self.result.type.get_num_dims()
        if not -rank <= self.dim.value.data < max(rank, 1):
            raise VerifyException(f"'phaze.softmax' op dim {self.dim.value.data} is out of range for rank {rank}")


NORM_KINDS = (
    "layer_norm",
    "layer_norm_grad",
    "rms_norm",
    "rms_norm_grad",
    "batch_norm",
    "batch_norm_grad",
    "group_norm",
    "group_norm_grad",
)


@irdl_op_definition
class NormOp(ComputeOp):
    """Normalization over the trailing ``normalized_rank`` dims, and its gradient.

    ``layer_norm`` yields ``(y, mean, rstd)``; ``layer_norm_grad`` yields the gradients of the
    input, weight and bias that autograd asked for.

    Syntax::

        %y, %mean, %rstd = phaze.norm "layer_norm" %x, %w, %b normalized_rank 1 : (...) -> (...)
    """

    name = "phaze.norm"
    kind = prop_def(StringAttr)
    normalized_rank = prop_def(IntegerAttr[I64])
    inputs = var_operand_def(TensorType)
    results_ = var_result_def(TensorType)
    assembly_format = (
        "$kind $inputs `normalized_rank` $normalized_rank attr-dict `:` functional-type($inputs, $results_)"
    )

    def iteration_space(self) -> tuple[int, ...]:
        return tuple(tensor_type(self.inputs[0]).get_shape())

    def flops(self) -> int:
        # forward: mean, variance, normalize, scale, shift (~8/elem); backward about twice that.
        per = 16 if self.kind.data.endswith("_grad") else 8
        return per * numel(self.inputs[0].type)

    def verify_(self) -> None:
        _check_kind(self, self.kind.data, NORM_KINDS)


EMBEDDING_KINDS = ("lookup", "grad")


@irdl_op_definition
class EmbeddingOp(ComputeOp):
    """Table lookup (``lookup``: table, indices) and its scatter-add gradient (``grad``).

    Syntax::

        %e = phaze.embedding "lookup" %wte, %ids : (tensor<50257x768xf16>, tensor<1x1024xi64>) -> tensor<1x1024x768xf16>
    """

    name = "phaze.embedding"
    kind = prop_def(StringAttr)
    inputs = var_operand_def(TensorType)
    result = result_def(TensorType)
    assembly_format = "$kind $inputs attr-dict `:` functional-type($inputs, $result)"

    def bytes_read(self) -> int:
        if self.kind.data == "lookup":
            # Only the gathered rows of the table are read, not the whole table.
            return tensor_bytes(self.result.type) + _bytes_of(self.inputs[1:])
        return _bytes_of(self.inputs)

    def flops(self) -> int:
        return numel(self.inputs[0].type) if self.kind.data == "grad" else 0

    def verify_(self) -> None:
        _check_kind(self, self.kind.data, EMBEDDING_KINDS)


COPY_KINDS = (
    "clone",
    "cat",
    "stack",
    "pad",
    "copy",
    "index",
    "gather",
    "scatter",
    "repeat",
    "flip",
    "roll",
    "tril",
    "triu",
    "zero_pad",
)


@irdl_op_definition
class LayoutOp(ComputeOp):
    """Data movement without arithmetic: views (no bytes moved) and copies.

    ``kind`` in :data:`VIEW_KINDS` aliases its first operand's storage; ``kind`` in
    :data:`COPY_KINDS` materializes its results.

    Syntax::

        %t = phaze.layout "transpose" %x aten "aten.t.default" : (tensor<64x32xf16>) -> tensor<32x64xf16>
    """

    name = "phaze.layout"
    kind = prop_def(StringAttr)
    aten = prop_def(StringAttr)
    inputs = var_operand_def(TensorType)
    results_ = var_result_def(TensorType)
    assembly_format = "$kind $inputs `aten` $aten attr-dict `:` functional-type($inputs, $results_)"

    @property
    def is_view(self) -> bool:
        """True when the results alias the first operand's storage."""
        return self.kind.data in VIEW_KINDS

    def bytes_read(self) -> int:
        return 0 if self.is_view else super().bytes_read()

    def bytes_written(self) -> int:
        return 0 if self.is_view else super().bytes_written()

    def verify_(self) -> None:
        _check_kind(self, self.kind.data, VIEW_KINDS + COPY_KINDS)


COLLECTIVE_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")


@irdl_op_definition
class CollectiveOp(ComputeOp):
    """Communication among ``group_size`` devices (tensor-parallel or pipeline).

    Syntax::

        %y = phaze.collective "all_reduce" %x group_size 8 : (tensor<1024x1600xf16>) -> tensor<1024x1600xf16>
    """

    name = "phaze.collective"
    kind = prop_def(StringAttr)
    group_size = prop_def(IntegerAttr[I64])
    input = operand_def(TensorType)
    result = result_def(TensorType)
    assembly_format = "$kind $input `group_size` $group_size attr-dict `:` functional-type($input, $result)"

    def flops(self) -> int:
        return numel(self.input.type) if self.kind.data in ("all_reduce", "reduce_scatter") else 0

    def verify_(self) -> None:
        _check_kind(self, self.kind.data, COLLECTIVE_KINDS)
        if self.group_size.value.data < 1:
            raise VerifyException(f"'phaze.collective' op group_size must be >= 1, got {self.group_size.value.data}")


@irdl_op_definition
class OptimizerUpdateOp(ComputeOp):
    """Optimizer step of one parameter: reads the parameter, its gradient and ``state_bytes``
    of optimizer state per element, and yields the updated parameter.

    Syntax::

        %w2 = phaze.optimizer_update "adam" %w, %gw state_bytes 12 : (tensor<64xf16>, tensor<64xf16>) -> tensor<64xf16>
    """

    name = "phaze.optimizer_update"
    kind = prop_def(StringAttr)
    state_bytes = prop_def(IntegerAttr[I64])
    param = operand_def(TensorType)
    grad = operand_def(TensorType)
    result = result_def(TensorType)
    assembly_format = (
        "$kind $param `,` $grad `state_bytes` $state_bytes attr-dict `:` functional-type(operands, $result)"
    )

    def __init__(self, kind: str, param: SSAValue, grad: SSAValue, state_bytes: int):
        super().__init__(
            operands=[param, grad],
            result_types=[param.type],
            properties={"kind": StringAttr(kind), "state_bytes": IntegerAttr(state_bytes, i64)},
        )

    def state_bytes_total(self) -> int:
        """Bytes of optimizer state this parameter carries (master weights and moments)."""
        return self.state_bytes.value.data * numel(self.param.type)

    def flops(self) -> int:
        return OPTIMIZER_KINDS[self.kind.data][0] * numel(self.param.type)

    def bytes_read(self) -> int:
        extra = OPTIMIZER_EXTRA_BYTES.get(self.kind.data, (0, 0))[0] * numel(self.param.type)
        return super().bytes_read() + self.state_bytes_total() + extra

    def bytes_written(self) -> int:
        extra = OPTIMIZER_EXTRA_BYTES.get(self.kind.data, (0, 0))[1] * numel(self.param.type)
        return super().bytes_written() + self.state_bytes_total() + extra

    def verify_(self) -> None:
        _check_kind(self, self.kind.data, tuple(OPTIMIZER_KINDS))
        if self.param.type != self.grad.type:
            raise VerifyException(
                f"'phaze.optimizer_update' op gradient type {self.grad.type} differs from "
                f"parameter type {self.param.type}"
            )


@irdl_op_definition
class OpaqueOp(ComputeOp):
    """An aten op phaze has no semantics for; ``aten`` keeps its name.  Costed as a
    memory-bound vector op (one FLOP per output element).

    Syntax::

        %y = phaze.opaque "aten.foo.default" %x : (tensor<4xf32>) -> tensor<4xf32>
    """

    name = "phaze.opaque"
    aten = prop_def(StringAttr)
    inputs = var_operand_def(TensorType)
    results_ = var_result_def(TensorType)
    assembly_format = "$aten ($inputs^)? attr-dict `:` functional-type($inputs, $results_)"

    def flops(self) -> int:
        return sum(numel(r.type) for r in self.results)


@irdl_op_definition
class AcceleratorOp(IRDLOperation):
    """The hardware a module is compiled for, as a symbol, so every ``.mlir`` file is
    self-contained.  ``spec`` holds the hardware description (see ``phaze_ir.hardware``).

    Syntax::

        phaze.accelerator @acc {"clock_hz" = 1.05e9, ...}
    """

    name = "phaze.accelerator"
    sym_name = prop_def(SymbolNameConstraint())
    spec = prop_def(DictionaryAttr)
    traits = traits_def(SymbolOpInterface())
    assembly_format = "$sym_name $spec attr-dict"


PHAZE_OPS: list[type[Operation]] = [
    MatmulOp,
    ElementwiseOp,
    ReductionOp,
    SoftmaxOp,
    NormOp,
    EmbeddingOp,
    LayoutOp,
    CollectiveOp,
    OptimizerUpdateOp,
    OpaqueOp,
    AcceleratorOp,
]

Phaze = Dialect(
    "phaze",
    PHAZE_OPS,
    [
        LayerInfoAttr,
        TileAttr,
        KernelAttr,
        LatencyAttr,
        LayerLatencyAttr,
        LayerFlopsAttr,
        EnergyAttr,
        LayerEnergyAttr,
        SchedAttr,
        LayerScheduleAttr,
        LayerRecomputeAttr,
        LayerMemoryAttr,
        PlanAttr,
        StageInfoAttr,
        PowerAttr,
        BaselineAttr,
        UnpricedOpAttr,
        ReplicatedLinearsAttr,
        *ENUM_ATTRS,
    ],
)
"""The ``phaze`` dialect (ops and attributes)."""


@functools.lru_cache(maxsize=1 << 16)
def int_attr(value: int) -> IntegerAttr:
    """An ``i64`` integer attribute (the type used for ``phaze.*`` integer annotations); one
    object per value (attributes are immutable; the passes write tens of thousands)."""
    return IntegerAttr(value, i64)


__all__ = [
    "Phaze",
    "ComputeOp",
    "MatmulOp",
    "ElementwiseOp",
    "ReductionOp",
    "SoftmaxOp",
    "NormOp",
    "EmbeddingOp",
    "LayoutOp",
    "CollectiveOp",
    "OptimizerUpdateOp",
    "OpaqueOp",
    "AcceleratorOp",
    "LayerInfoAttr",
    "element_bytes",
    "numel",
    "tensor_bytes",
    "tensor_type",
    "int_attr",
    "IntegerType",
]
