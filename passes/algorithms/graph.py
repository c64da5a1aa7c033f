"""A light, xDSL-free view of a training step's dataflow graph.

Passes build it from the IR (``passes.graph_view.build_graph``) and hand it to the pure
algorithms in this package, which can then be tested on hand-made graphs.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Value:
    """One SSA value.  ``producer`` is the index of the op that yields it (-1 for a function
    argument); ``role`` is ``"param"``, ``"buffer"`` or ``"input"`` for arguments, ``""`` else;
    ``view_of`` is the value whose storage a view aliases (None when it owns its storage)."""

    nbytes: int
    producer: int = -1
    role: str = ""
    name: str = ""
    view_of: int | None = None
    is_float: bool = True
    #: bytes of one element (0: not known), e.g. 1 for an FP8 tensor
    element_bytes: int = 0


@dataclass
class OpNode:
    """One op: its phase (``fwd``/``bwd``/``opt``), source module path, operand and result value
    ids, FLOPs, and a ``signature`` that is equal for ops that do the same thing on the same
    types (op name, properties, result types, phase; not the provenance).  ``experts`` > 0
    marks an expert GEMM: a matmul whose right operand is a batch of per-expert parameter
    weights (an MoE layer's ``aten._grouped_mm``), ``experts`` being that parameter's leading
    dimension."""

    phase: str
    module: str
    operands: list[int]
    results: list[int]
    flops: int = 0
    signature: str = ""
    experts: int = 0


@dataclass
class Graph:
    """Values and ops of one step, ops in program (topological) order."""

    values: list[Value] = field(default_factory=list)
    ops: list[OpNode] = field(default_factory=list)

    def add_value(
        self,
        nbytes: int,
        producer: int = -1,
        role: str = "",
        name: str = "",
        view_of: int | None = None,
        is_float: bool = True,
    ) -> int:
        self.values.append(Value(nbytes, producer, role, name, view_of, is_float))
        return len(self.values) - 1

    def add_op(
        self,
        phase: str,
        module: str,
        operands: list[int],
        result_bytes: list[int],
        flops: int = 0,
        signature: str = "",
        view: bool = False,
        result_float: list[bool] | None = None,
        experts: int = 0,
        result_element_bytes: list[int] | None = None,
    ) -> int:
        """Append an op; its results are new values (views alias their first operand)."""
        index = len(self.ops)
        floats = result_float if result_float is not None else [True] * len(result_bytes)
        widths = result_element_bytes if result_element_bytes is not None else [0] * len(result_bytes)
        results = [
            self.add_value(b, index, view_of=operands[0] if view and operands else None, is_float=f)
            for b, f in zip(result_bytes, floats)
        ]
        for r, w in zip(results, widths):
            self.values[r].element_bytes = w
        self.ops.append(OpNode(phase, module, list(operands), results, flops, signature, experts))
        return index

    def storage(self, value: int) -> int:
        """The value that owns the storage ``value`` aliases (itself unless it is a view)."""
        seen = 0
        while self.values[value].view_of is not None:
            value = self.values[value].view_of  # type: ignore[assignment]
            seen += 1
            if seen > len(self.values):
                raise ValueError("cycle in view chain")
        return value

    def readers(self) -> dict[int, list[int]]:
        """For each storage, the ops that read it (through any view of it), in program order."""
        out: dict[int, list[int]] = {}
        for i, op in enumerate(self.ops):
            for v in op.operands:
                out.setdefault(self.storage(v), []).append(i)
        return out

    def data_dependent(self) -> list[bool]:
        """For each value: does it depend on any function argument?  Values that do not (a
        causal mask built from ``arange``) can be rebuilt anywhere and need no transfer."""
        dep = [v.producer < 0 for v in self.values]
        for op in self.ops:
            d = any(dep[o] for o in op.operands)
            for r in op.results:
                dep[r] = d
        return dep

    def fp8_weight_copies(self) -> set[int]:
        """The FP8 copies of weights: storages of one-byte floats made from parameters alone
        (no input reaches them), e.g. Transformer Engine's FP8 weight workspace, cast and
        transposed from the bf16 weight."""
        param = [v.role == "param" for v in self.values]
        data = [v.role == "input" for v in self.values]
        for op in self.ops:
            p, d = any(param[o] for o in op.operands), any(data[o] for o in op.operands)
            for r in op.results:
                param[r], data[r] = p, d
        return {
            v
            for v, val in enumerate(self.values)
            if param[v]
            and not data[v]
            and val.producer >= 0
            and val.is_float
            and val.element_bytes == 1
            and self.storage(v) == v
        }

    def differentiable(self) -> list[bool]:
        """For each value: is it a float tensor that depends on a parameter (so that backward
        computes a gradient for it)?"""
        dep = [v.role == "param" for v in self.values]
        for op in self.ops:
            d = any(dep[o] for o in op.operands)
            for r in op.results:
                dep[r] = d
        return [d and v.is_float for d, v in zip(dep, self.values)]

    def cast_source(self, v: int) -> int:
        """The storage of ``v``, or, for an FP8 copy (a one-byte float made by an op: a cast,
        the transposed copy of a cast), the storage of the wider tensor it was cast from,
        through the copies' first operands: an FP8 expert GEMM's weights are the parameter,
        its routed tokens the bf16 rows the dispatch moves."""
        s = self.storage(v)
        while (val := self.values[s]).is_float and val.element_bytes == 1 and val.producer >= 0:
            s = self.storage(self.ops[val.producer].operands[0])
        return s

    def expert_params(self, ops: list[int]) -> set[int]:
        """The parameter storages that the expert GEMMs among ``ops`` read as their per-expert
        weights (right operands, or what their FP8 copies were cast from)."""
        return {self.cast_source(self.ops[i].operands[1]) for i in ops if self.ops[i].experts}
