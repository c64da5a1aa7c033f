"""``phaze-insert-optimizer``: add the optimizer step to a training graph."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, FunctionType, ModuleOp, StringAttr
from xdsl.passes import ModulePass

from passes.graph_view import arg_role, step_function
from phaze_ir import dialect as ph
from phaze_ir import keys
from phaze_ir.errors import PhazeError
from phaze_ir.op_kinds import OPTIMIZER_FP32_MASTER_BYTES, OPTIMIZER_KINDS


@dataclass(frozen=True)
class InsertOptimizerPass(ModulePass):
    """Insert one ``phaze.optimizer_update`` per parameter gradient the step returns, and
    return the updated parameters (``phaze.updated`` result attributes).

    Options: ``optimizer`` = ``adam`` (default: mixed precision, fp32 master weight and two fp32
    moments, 12 state bytes per parameter), ``adam-bf16`` (the weight's copy and the moments in bf16,
    6 bytes: Apex's DistributedFusedAdam with ``dtype=torch.bfloat16``) or ``sgd`` (fp32 master
    weight, 4 bytes).
    Requires the gradients of ``phazec --emit training`` (``phaze.grad`` results).
    """

    name = "phaze-insert-optimizer"
    optimizer: str = "adam"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.optimizer not in OPTIMIZER_KINDS:
            raise PhazeError(f"{self.name}: optimizer={self.optimizer}: expected one of {', '.join(OPTIMIZER_KINDS)}")
        fn = step_function(op)
        if any(isinstance(o, ph.OptimizerUpdateOp) for o in fn.body.block.ops):
            raise PhazeError(f"{self.name}: the step already has optimizer updates")
        ret = fn.body.block.last_op
        assert isinstance(ret, func.ReturnOp)
        res_attrs = list(fn.res_attrs.data) if fn.res_attrs is not None else [DictionaryAttr({})] * len(ret.operands)
        params = {arg_role(fn, i)[1]: a for i, a in enumerate(fn.body.block.args) if arg_role(fn, i)[0] == "param"}
        grads = [
            (v, name.data)
            for v, attrs in zip(ret.operands, res_attrs)
            if isinstance(name := attrs.data.get(keys.GRAD), StringAttr)
        ]
        if not grads:
            raise PhazeError(
                f"{self.name}: the step returns no gradients ('{keys.GRAD}' results); "
                "import it with phazec --emit training"
            )
        state_bytes = OPTIMIZER_KINDS[self.optimizer][1]
        master = OPTIMIZER_FP32_MASTER_BYTES[self.optimizer]
        new_values, new_attrs = [], []
        for grad, pname in grads:
            if pname not in params:
                raise PhazeError(f"{self.name}: gradient of '{pname}' has no matching parameter argument")
            # an fp32 parameter (mixed precision by autocast) is its own fp32 master weight
            fp32 = ph.element_bytes(ph.tensor_type(params[pname]).element_type) == 4
            upd = ph.OptimizerUpdateOp(self.optimizer, params[pname], grad, state_bytes - (master if fp32 else 0))
            upd.attributes[keys.PHASE] = StringAttr("opt")
            upd.attributes[keys.MODULE] = StringAttr(pname.rpartition(".")[0])
            upd.result.name_hint = "updated"
            fn.body.block.insert_op_before(upd, ret)
            new_values.append(upd.result)
            new_attrs.append(DictionaryAttr({keys.UPDATED: StringAttr(pname)}))
        new_ret = func.ReturnOp(*ret.operands, *new_values)
        fn.body.block.insert_op_before(new_ret, ret)
        fn.body.block.erase_op(ret)
        fn.function_type = FunctionType.from_lists(fn.function_type.inputs.data, [v.type for v in new_ret.operands])
        fn.res_attrs = ArrayAttr(res_attrs + new_attrs)
