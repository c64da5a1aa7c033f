"""The recompute and memory analysis of a traced step that does not depend on the accelerator
(which ops each recompute policy re-runs, what each layer stashes), shared by the passes that
price it (``phaze-insert-recompute``, ``phaze-estimate-energy``) and the search's settings: one
analysis, so the energy of a re-run forward and its time are of the same ops."""

from __future__ import annotations

from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp, StringAttr
from xdsl.ir import Operation, SSAValue

from passes.algorithms.graph import Graph
from passes.algorithms.memory import STATE_BYTES_PER_ELEMENT, layer_memory
from passes.algorithms.partition import Partition, min_cut_partition
from passes.algorithms.recompute import ATTENTION, Selective, analyze_recompute
from passes.graph_view import arg_role, build_graph, read_layers, step_function
from phaze_ir import dialect as ph
from phaze_ir import keys
from phaze_ir.attributes import (
    KernelAttr,
    LayerInfoAttr,
)


def compiled_partition(module: ModuleOp, fn: func.FuncOp, graph: Graph, ops: list[Operation]) -> Partition | None:
    """What AOTAutograd's min-cut partitioner saves of a step whose kernels are Inductor's
    (``phaze.kernels = "inductor"``, written by ``phaze-form-kernels``); None for any other
    runtime (eager autograd's saved tensors)."""
    runtime = module.attributes.get(keys.KERNELS)
    if not isinstance(runtime, StringAttr) or runtime.data != "inductor":
        return None
    ids: dict[SSAValue, int] = {a: i for i, a in enumerate(fn.body.block.args)}
    for o, node in zip(ops, graph.ops):
        ids.update(zip(o.results, node.results))
    ret = fn.body.block.last_op
    losses: list[int] = []
    grads: list[int] = []
    if isinstance(ret, func.ReturnOp) and fn.res_attrs is not None:
        for v, attrs in zip(ret.operands, fn.res_attrs.data):
            if v in ids and keys.LOSS in attrs.data:
                losses.append(ids[v])
            elif v in ids and keys.GRAD in attrs.data:
                grads.append(ids[v])
    return min_cut_partition(graph, losses or None, grads or None)


def static_costs(module: ModuleOp, optimizer: str, pass_name: str, selective: Selective = ATTENTION):
    """What of the recompute and memory analysis does not depend on the accelerator:
    ``(graph, ops, layer_of, recompute, memory)`` with the :class:`LayerRecompute` and
    :class:`LayerMemory` of every layer.  ``optimizer`` and ``selective`` as the pass options
    (``""``: read the ``phaze.optimizer_update`` ops).  The architecture search prices these
    once per setting."""
    fn = step_function(module)
    graph, ops = build_graph(fn)
    layer_of = read_layers(ops)
    kinds = None  # only torchtitan's policies need them: they checkpoint the blocks alone
    if selective != ATTENTION:
        kinds = [str(r.get("kind")) for r in keys.require_records(module, keys.LAYERS, LayerInfoAttr)]
    partition = compiled_partition(module, fn, graph, ops)
    kernel_of = [k.id.data if isinstance(k := o.attributes.get(keys.KERNEL), KernelAttr) else None for o in ops]
    runtime = module.attributes.get(keys.KERNELS)
    megatron = isinstance(runtime, StringAttr) and runtime.data == "megatron"
    recompute = analyze_recompute(graph, layer_of, partition, selective, kinds, kernel_of if megatron else None)
    # Optimizer state per parameter (value ids of the parameter arguments).
    state: dict[int, int] = {}
    if optimizer:
        per = STATE_BYTES_PER_ELEMENT[optimizer]
        for i, arg in enumerate(fn.body.block.args):
            if arg_role(fn, i)[0] == "param":
                state[i] = per * ph.numel(arg.type)
    else:
        for i, o in enumerate(ops):
            if isinstance(o, ph.OptimizerUpdateOp):
                state[graph.storage(graph.ops[i].operands[0])] = o.state_bytes_total()
        if not state:
            for i, arg in enumerate(fn.body.block.args):
                if arg_role(fn, i)[0] == "param":
                    state[i] = STATE_BYTES_PER_ELEMENT["adam"] * ph.numel(arg.type)
    formed = any(k is not None for k in kernel_of)
    memory = layer_memory(graph, layer_of, recompute, state, kernel_of if formed else None)
    return graph, ops, layer_of, recompute, memory
