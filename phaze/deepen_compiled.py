"""A compiled step of a model cut to 5 of its repeated blocks, deepened to all of them.

Why: the winner of a sweep is compiled from the whole model (GPT-3 175B: 18,602 ops), and
most of the pass pipeline prices op by op: the training passes, sharding, forming kernels,
tiling, latency and energy give a block's ops the same attributes whichever block it is.  So
the step cut to ``CUT`` blocks (:func:`phaze_ir.frontend.deepen.deepen` of the cut trace to
``CUT`` blocks) is compiled to the ``latency`` stage, and its template block's ops, with every
attribute those passes gave them, are copied once per extra block, as ``deepen`` copies the
trace's nodes: the other blocks kept and renumbered, operands found at the same position of the
block they are relative to, ``phaze.layer`` and ``phaze.module`` (and the parameters', gradients'
and updated parameters' names) said of the copy's block.  The passes that read the whole
step (scheduling, recompute, the placement, power) then run on the deepened module as they run
on the module compiled from the whole trace.

What the copy cannot see of a single op, it takes from two compilations: the module's
counts (``phaze.parameters``, ``phaze.model_flops``, ...) are the 5-block module's plus one
block's share (the 6-block module's less the 5-block one's) per block added; the per-layer
records (``phaze.layers``, ``phaze.layer_latency``, ...) are copied as the layers are; the
context-parallel ring (``phaze.cp_ring``, float sums over the attentions) is priced again by
``phaze-estimate-latency`` on the deepened module.
:func:`compile_deepened` relies on it only when the 5-block module deepened to 6 blocks prints
the bytes the 6-block step compiles to (the trace's own check is :func:`phaze_ir.frontend.deepen.trace_step`'s):
otherwise the caller compiles the whole trace, as before.  SSA names need no renumbering: xDSL
keeps a name hint without its ``_N`` suffix and numbers hints as it prints, in order, as
torch.fx numbers the whole trace's nodes; only ``_tensor_constantN`` (make_fx's lifted
constants, numbered as they are met) is renumbered.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from xdsl.dialects import func
from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, FunctionType, IntegerAttr, ModuleOp, StringAttr
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue

from phaze_ir import dialect as ph
from phaze_ir import keys
from phaze_ir.attributes import RecordAttr
from phaze_ir.frontend.deepen import CUT, _alike, _block_of, _renamed, _src

#: make_fx's names of the constants it lifts out of the step (``deepen._CONSTANT``).
_CONSTANT = re.compile(r"^_tensor_constant\d+$")


class CannotDeepen(Exception):
    """The compiled cut step is not laid out as :func:`deepen_compiled` needs (the message says where)."""


@dataclass
class _Segment:
    """Consecutive items of one region: outside the blocks (``block`` None) or one block's;
    ``values``: the SSA values they define, in order (a copy finds its operands by position)."""

    block: int | None
    items: list[Any]
    values: list[SSAValue]


def _segments(items: list[Any], label: Any, values: Any) -> list[_Segment]:
    out: list[_Segment] = []
    for item in items:
        b = label(item)
        if out and out[-1].block == b:
            out[-1].items.append(item)
            out[-1].values.extend(values(item))
        else:
            out.append(_Segment(b, [item], list(values(item))))
    return out


def _check_layout(segments: list[_Segment], where: str) -> None:
    """Blocks appear as whole runs 0..4 (or 4..0), each once per run."""
    blocks = [s.block for s in segments if s.block is not None]
    ascending = list(range(CUT))
    for i in range(0, len(blocks), CUT):
        if blocks[i : i + CUT] not in (ascending, ascending[::-1]):
            raise CannotDeepen(f"{where}: blocks in the order {blocks}, expected runs of 0..{CUT - 1}")


def _order(segments: list[_Segment], runs: list[dict[int, _Segment]], first_run: int, blocks: int) -> list:
    """(item, block k or None) in the deepened step's order: each run of blocks in place of its
    last segment, ascending or descending as the cut step has it."""
    order: list[tuple[Any, int | None]] = []
    met = 0
    for s in segments:
        if s.block is None:
            order.extend((x, None) for x in s.items)
            continue
        met += 1
        if met % CUT == 0:
            run = runs[first_run + met // CUT - 1]
            ks = range(blocks) if s.block == CUT - 1 else range(blocks - 1, -1, -1)
            for k in ks:
                order.extend((x, k) for x in run[_src(k, blocks)].items)
    return order


def _runs(segments: list[_Segment]) -> list[dict[int, _Segment]]:
    blocked = [s for s in segments if s.block is not None]
    return [{s.block: s for s in blocked[i : i + CUT]} for i in range(0, len(blocked), CUT)]  # type: ignore[misc]


def _names(attrs: DictionaryAttr) -> list[str]:
    return [v.data for v in attrs.data.values() if isinstance(v, StringAttr)]


def deepen_compiled(five: ModuleOp, six: ModuleOp, blocks: int) -> ModuleOp:
    """``five`` (a step cut to ``CUT`` blocks, compiled to the ``latency`` stage) as the same
    step of ``blocks`` blocks; ``six``: the same step of ``CUT + 1`` blocks compiled alike (its
    module counts give one block's share).  A new module: ``five`` is left as it was.  Raises
    :class:`CannotDeepen` when ``five`` is not laid out as the module docstring says."""
    if blocks < CUT:
        raise CannotDeepen(f"cannot deepen {CUT} blocks to {blocks}")
    fns = [op for op in five.ops if isinstance(op, func.FuncOp)]
    if len(fns) != 1 or keys.LAYERS not in five.attributes:
        raise CannotDeepen("expected one step function with its layers")
    fn = fns[0]
    layers = five.attributes[keys.LAYERS]
    assert isinstance(layers, ArrayAttr)
    block_layers = [x for x in layers.data if isinstance(x, RecordAttr) and x.get("kind") == "block"]
    if len(block_layers) != CUT:
        raise CannotDeepen(f"{len(block_layers)} block layers, expected {CUT}")
    b0 = int(block_layers[0].get("index"))
    first = str(block_layers[0].get("module"))
    if not first.endswith(".0"):
        raise CannotDeepen(f"the first block is {first!r}")
    prefix = first[:-1]
    for j, x in enumerate(block_layers):
        if x.get("index") != b0 + j or x.get("module") != f"{prefix}{j}":
            raise CannotDeepen(f"block layer {j} is {x.get('module')!r} at {x.get('index')}")
    shift = blocks - CUT
    module = _Deepener(five, six, fn, blocks, prefix, b0, shift).module()
    if keys.CP_RING in module.attributes:  # the ring's sums, priced again over every attention
        _priced_again(module)
    return module


def _priced_again(module: ModuleOp) -> None:
    """``phaze-estimate-latency`` run again on a deepened module (it prices a module again to the
    same figures: each op from its tile, then the rings): the one writer of ``phaze.cp_ring``,
    whose times are float sums over the step's attentions, which the 5- and 6-block counts
    cannot extrapolate to ``n`` blocks bit for bit (a sum of ``n`` equal terms is not the
    5-block sum plus ``n − 5`` differences).  Its other results are the copied ones: the 6-block
    check compares them all."""
    from passes.estimate_latency import EstimateLatencyPass
    from phaze_ir.ir import make_context

    EstimateLatencyPass().apply(make_context(), module)


#: torch.fx's split of a node name into its base and counter (``deepen._NAME``).
_NAME = re.compile(r"^([a-zA-Z_][0-9a-zA-Z_]*?)(?:_(\d+))?$")


class _FusedNames:
    """``phaze.fused`` names a traced node (its first word), which torch.fx numbers by its base
    name in the order the nodes come (``_scaled_dot_product_flash_attention_3``): a copy's is
    numbered again in the deepened order.  Only when every node of such a base is seen, that is
    when the cut step's names of each base are numbered 0, 1, 2, ... in the order they come."""

    def __init__(self, ops: Any):
        seen: dict[str, list[int]] = {}
        for op in ops:
            name = op.attributes.get(keys.FUSED)
            if isinstance(name, StringAttr):
                base, n = self.split(name.data.split(" ", 1)[0])
                numbers = seen.setdefault(base, [])
                if n not in numbers:
                    numbers.append(n)
        for base, numbers in seen.items():
            if numbers != list(range(len(numbers))):
                raise CannotDeepen(f"phaze.fused {base}: numbered {numbers[:6]}, not every node seen")
        self.new: dict[tuple[str, int | None], str] = {}
        self.count: dict[str, int] = {}

    @staticmethod
    def split(name: str) -> tuple[str, int]:
        match = _NAME.match(name)
        if match is None:
            raise CannotDeepen(f"phaze.fused {name!r}: not a torch.fx node name")
        return match.group(1), int(match.group(2) or 0)

    def renamed(self, attr: StringAttr, k: int | None) -> StringAttr:
        name, _, rest = attr.data.partition(" ")
        key = (name, k)
        if key not in self.new:
            base, _ = self.split(name)
            n = self.count.get(base, 0)
            self.count[base] = n + 1
            self.new[key] = f"{base}_{n}" if n else base
        return StringAttr(self.new[key] + (" " + rest if rest else ""))


class _Deepener:
    def __init__(self, five: ModuleOp, six: ModuleOp, fn: func.FuncOp, blocks: int, prefix: str, b0: int, shift: int):
        self.five, self.six, self.fn = five, six, fn
        self.blocks, self.prefix, self.b0, self.shift = blocks, prefix, b0, shift
        body = fn.body.block
        ops = list(body.ops)
        self.ret = ops[-1]
        if not isinstance(self.ret, func.ReturnOp):
            raise CannotDeepen("the step does not end in its return")
        arg_attrs = fn.arg_attrs.data if fn.arg_attrs is not None else [DictionaryAttr({})] * len(body.args)
        self.arg_attrs: dict[SSAValue, DictionaryAttr] = dict(zip(body.args, arg_attrs))

        def arg_block(a: SSAValue) -> int | None:
            found = {_block_of(n, prefix) for n in _names(self.arg_attrs[a])} - {None}
            return found.pop() if len(found) == 1 else None

        def op_block(op: Operation) -> int | None:
            layer = op.attributes.get(keys.LAYER)
            if not isinstance(layer, IntegerAttr):
                return None
            j = layer.value.data - b0
            return j if 0 <= j < CUT else None

        self.args = _segments(list(body.args), arg_block, lambda a: [a])
        self.body = _segments(ops[:-1], op_block, lambda op: op.results)
        _check_layout(self.args, "arguments")
        _check_layout(self.body, "step")
        self.runs = _runs(self.args) + _runs(self.body)
        self.place: dict[SSAValue, tuple[int, int, int]] = {}
        for r, run in enumerate(self.runs):
            for j, seg in run.items():
                for i, v in enumerate(seg.values):
                    self.place[v] = (r, j, i)
        self.new: dict[tuple[SSAValue, int | None], SSAValue] = {}
        #: where each op sits, and its copies: a kernel is named by its first op (below)
        self.op_place: dict[Operation, tuple[int, int, int]] = {}
        for r, run in enumerate(self.runs):
            for j, seg in run.items():
                for i, x in enumerate(seg.items):
                    if isinstance(x, Operation):
                        self.op_place[x] = (r, j, i)
        self.new_op: dict[tuple[Operation, int | None], Operation] = {}
        # ``phaze-form-kernels`` names a kernel by its first op's position among the compute
        # ops (``passes/algorithms/kernels.py``): a copy's kernel by its first op's copy's
        self.compute = [op for op in ops if isinstance(op, ph.ComputeOp)]
        for op in self.compute:
            kernel = op.attributes.get(keys.KERNEL)
            if isinstance(kernel, RecordAttr):
                g = int(kernel.get("id"))
                first = self.compute[g] if 0 <= g < len(self.compute) else None
                if (
                    first is None
                    or not isinstance(k0 := first.attributes.get(keys.KERNEL), RecordAttr)
                    or k0.get("id") != g
                ):
                    raise CannotDeepen(f"kernel {g} is not named by its first op's position")

    def resolve(self, v: SSAValue, k: int | None) -> SSAValue:
        """The copy of ``v`` that block ``k``'s copy (None: an outside item) reads."""
        if v not in self.place:
            return self.copied(self.new, v, None)
        r, i, kk = self.relative(self.place[v], k)
        return self.copied(self.new, self.runs[r][_src(kk, self.blocks)].values[i], kk)

    @staticmethod
    def copied(new: dict, item: Any, k: int | None) -> Any:
        """The copy of ``item`` for block ``k``, which must come before what reads it."""
        got = new.get((item, k))
        if got is None:
            raise CannotDeepen(f"{getattr(item, 'name_hint', None) or item} is read before its copy")
        return got

    def resolve_op(self, op: Operation, k: int | None) -> Operation:
        """The copy of ``op`` that block ``k``'s copy (None: an outside item) refers to."""
        if op not in self.op_place:
            return self.copied(self.new_op, op, None)
        r, i, kk = self.relative(self.op_place[op], k)
        return self.copied(self.new_op, self.runs[r][_src(kk, self.blocks)].items[i], kk)

    def relative(self, where: tuple[int, int, int], k: int | None) -> tuple[int, int, int]:
        """(run, position, block of the copy) of the item at ``where`` that block ``k``'s copy
        refers to: the same block relative to its own."""
        blocks = self.blocks
        r, j_ref, i = where
        if k is None:
            if j_ref <= 1:
                kk = j_ref
            elif j_ref >= CUT - 2:
                kk = blocks - CUT + j_ref
            else:
                raise CannotDeepen("the template block is read outside the blocks")
        else:
            kk = k + j_ref - _src(k, blocks)
            if not 0 <= kk < blocks or not _alike(_src(kk, blocks), j_ref):
                raise CannotDeepen(f"a block reads block {j_ref}, which a copy does not have")
        return r, i, kk

    def layer(self, old: int, k: int | None) -> int:
        if k is not None:
            return self.b0 + k
        return old + self.shift if old >= self.b0 + CUT else old

    def rename_attrs(self, attrs: DictionaryAttr, k: int | None) -> DictionaryAttr:
        if k is None or _src(k, self.blocks) == k:
            return attrs
        j = _src(k, self.blocks)
        return DictionaryAttr(
            {
                n: StringAttr(_renamed(v.data, self.prefix, j, k)) if isinstance(v, StringAttr) else v
                for n, v in attrs.data.items()
            }
        )

    def module(self) -> ModuleOp:
        blocks = self.blocks
        arg_runs = len(_runs(self.args))
        # the arguments
        arg_order = _order(self.args, self.runs, 0, blocks)
        new_block = Block(arg_types=[a.type for a, _ in arg_order])
        new_arg_attrs = []
        for (a, k), b in zip(arg_order, new_block.args):
            self.new[a, k] = b
            renamed = self.rename_attrs(self.arg_attrs[a], k)
            new_arg_attrs.append(renamed)
            if a.name_hint is not None:
                src = _src(k, blocks) if k is not None else None
                b.name_hint = a.name_hint if src is None else _renamed(a.name_hint, self.prefix, src, k)
        # the body
        constants = 0
        layer_key, module_key = keys.LAYER, keys.MODULE
        compute_index: dict[Operation, int] = {}
        made: dict[Any, Attribute] = {}  # each block's layer and module paths, built once
        fused = _FusedNames(op for s in self.body for op in s.items)
        for op, k in _order(self.body, self.runs, arg_runs, blocks):
            attrs = dict(op.attributes)
            if isinstance(name := attrs.get(keys.FUSED), StringAttr):
                attrs[keys.FUSED] = fused.renamed(name, k)
            layer = attrs.get(layer_key)
            if isinstance(layer, IntegerAttr):
                new_layer = self.layer(layer.value.data, k)
                if new_layer != layer.value.data:
                    if (got := made.get(new_layer)) is None:
                        got = made[new_layer] = IntegerAttr(new_layer, layer.type)
                    attrs[layer_key] = got
            module = attrs.get(module_key)
            if k is not None and _src(k, blocks) != k and isinstance(module, StringAttr):
                if (got := made.get((module, k))) is None:
                    got = made[module, k] = StringAttr(_renamed(module.data, self.prefix, _src(k, blocks), k))
                attrs[module_key] = got
            kernel = attrs.get(keys.KERNEL)
            if isinstance(kernel, RecordAttr):
                first = self.compute[int(kernel.get("id"))]
                new_id = len(compute_index) if first is op else compute_index[self.resolve_op(first, k)]
                attrs[keys.KERNEL] = kernel.with_field("id", new_id)
            if op.regions or op.successors:
                raise CannotDeepen(f"{op.name} has regions")
            copy = type(op).create(
                operands=[self.resolve(v, k) for v in op.operands],
                result_types=[r.type for r in op.results],
                properties=dict(op.properties),
                attributes=attrs,
            )
            for old, res in zip(op.results, copy.results):
                self.new[old, k] = res
                hint = old.name_hint
                if hint is not None and _CONSTANT.match(hint):
                    hint = f"_tensor_constant{constants}"
                    constants += 1
                res.name_hint = hint
            new_block.add_op(copy)
            self.new_op[op, k] = copy
            if isinstance(copy, ph.ComputeOp):
                compute_index[copy] = len(compute_index)
        # the results: the loss, then each parameter's gradient and update, by name
        res_attrs = (
            self.fn.res_attrs.data if self.fn.res_attrs is not None else [DictionaryAttr({})] * len(self.ret.operands)
        )
        outs = list(zip(self.ret.operands, res_attrs))

        def out_block(o: tuple[SSAValue, DictionaryAttr]) -> int | None:
            found = {_block_of(n, self.prefix) for n in _names(o[1])} - {None}
            return found.pop() if len(found) == 1 else None

        out_segments = _segments(outs, out_block, lambda o: [])
        _check_layout(out_segments, "results")
        out_order = _order(out_segments, _runs(out_segments), 0, blocks)
        operands = [self.resolve(v, k) for (v, _), k in out_order]
        new_res_attrs = [self.rename_attrs(a, k) for (_, a), k in out_order]
        new_block.add_op(func.ReturnOp(*operands))
        fn = self.fn
        new_fn = func.FuncOp(
            fn.sym_name.data,
            FunctionType.from_lists([b.type for b in new_block.args], [v.type for v in operands]),
            Region(new_block),
            fn.sym_visibility,
            arg_attrs=ArrayAttr(new_arg_attrs),
            res_attrs=ArrayAttr(new_res_attrs),
        )
        for name, value in fn.attributes.items():
            new_fn.attributes.setdefault(name, value)
        tops = [new_fn if op is fn else op.clone() for op in self.five.ops]
        return ModuleOp(tops, attributes=self.module_attributes())

    def module_attributes(self) -> dict[str, Attribute]:
        five, six = self.five.attributes, self.six.attributes
        layers = five[keys.LAYERS]
        assert isinstance(layers, ArrayAttr)
        count = len(layers.data)
        out: dict[str, Attribute] = {}
        for name, value in five.items():
            if (
                isinstance(value, ArrayAttr)
                and len(value.data) == count
                and all(isinstance(x, RecordAttr) and "index" in x.FIELDS for x in value.data)
            ):
                out[name] = ArrayAttr(self.layer_records(list(value.data)))
            elif six.get(name) == value:
                out[name] = value
            elif isinstance(value, IntegerAttr) and isinstance(other := six.get(name), IntegerAttr):
                per_block = other.value.data - value.value.data
                out[name] = IntegerAttr(value.value.data + self.shift * per_block, value.type)
            elif name == keys.CP_RING:
                out[name] = value  # in its place; priced again over the deepened step (:func:`_priced_again`)
            else:
                raise CannotDeepen(f"module attribute {name} differs between 5 and 6 blocks")
        return out

    def layer_records(self, records: list[RecordAttr]) -> list[RecordAttr]:
        b0, blocks = self.b0, self.blocks
        order: list[tuple[RecordAttr, int | None]] = [(r, None) for r in records[:b0]]
        order += [(records[b0 + _src(k, blocks)], k) for k in range(blocks)]
        order += [(r, None) for r in records[b0 + CUT :]]
        out = []
        for new_index, (r, k) in enumerate(order):
            values = r.as_dict()
            old_index = int(values["index"])
            values["index"] = new_index
            if k is not None and "module" in values:
                values["module"] = _renamed(str(values["module"]), self.prefix, _src(k, blocks), k)
            if "same_as" in values:
                s = int(values["same_as"])
                if s == old_index:
                    values["same_as"] = new_index
                elif s >= b0 + 2:  # a kept block's first alike layer: blocks 0 and 1 are kept
                    raise CannotDeepen(f"layer {old_index} is alike layer {s}, which a copy does not keep")
            out.append(type(r).make(**values))
        return out


def compile_from_cut(
    cut: Any,
    tp: int,
    opts: Any,
    accelerator: Any,
    sequence_parallel: bool,
    verify: bool = True,
    stage: str = "plan",
) -> ModuleOp | None:
    """The whole model's step compiled to ``stage`` (one from ``latency`` on; default its plan)
    from ``cut`` (a step traced cut to ``CUT`` blocks, :func:`phaze_ir.frontend.deepen.trace_cut`):
    the step of ``CUT`` and of ``CUT + 1`` blocks compiled to the ``latency`` stage, the first
    deepened to all the blocks and through the rest of the pipeline to ``stage`` (verified,
    unless not ``verify``).  None, having compiled nothing of the whole, when the first
    deepened to ``CUT + 1`` blocks is not the second's bytes (or cannot be deepened): then the
    caller compiles the whole trace."""
    from phaze.pipeline import compile_from, compile_module
    from phaze_ir.frontend.deepen import deepen
    from phaze_ir.ir import print_module

    def compiled(blocks: int) -> ModuleOp:
        return compile_module(deepen(cut, blocks), "latency", tp, opts, accelerator, sequence_parallel, verify=False)

    five, six = compiled(CUT), compiled(CUT + 1)
    try:
        # compared as printed (phaze's printer: xDSL's bytes, about three times as fast)
        if print_module(deepen_compiled(five, six, CUT + 1)) != print_module(six):
            return None
        whole = deepen_compiled(five, six, cut.blocks[1])
    except CannotDeepen:
        return None
    return compile_from(whole, "latency", stage, tp, opts, sequence_parallel, verify)
