"""One priced training step: what the placement DP reads of a step traced at one micro-batch,
sharded for one TP width, priced on one chip (pure Python, no xDSL).

A :class:`PricedStep` is the one input of the Rust DP: its layers' time, memory and
communication terms (:class:`~passes.algorithms.placement.LayerNumbers`, each for one
micro-batch) and every parallel degree the DP does not choose (micro-batch, TP width,
context-parallel degree, sequence parallelism) with what the runtime does that the DP prices
(gradients freed after each step, the gradients' element bytes, the repeated blocks that
interleaving splits).  :func:`~passes.algorithms.placement.problem` turns it and the placement
options into the DP's problem, for both of its producers:

- ``phaze-place-devices`` (``passes/place_devices.py``) reads it from the cost passes'
  annotations of the module (``phaze.layers``, ``phaze.layer_schedule``,
  ``phaze.layer_recompute``, ``phaze.layer_memory``);
- the search and the ``--hw`` sweep (``phaze/search/setting.py``) make it from a setting's
  static numbers, built by :func:`static_numbers` from the same records, and the makespans of
  its scheduling groups on a candidate chip (:func:`timed`).

Both make a layer's numbers with the same two functions below, so that a field the DP reads
cannot be filled in one path and forgotten in the other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from passes.algorithms.expert_gemms import ExpertTimes
from passes.algorithms.placement import LayerNumbers, expert_part


@dataclass(frozen=True)
class PricedStep:
    """A training step priced on one chip, as the placement DP reads it: ``layers`` in
    topological order (prologue, blocks, head), each for one micro-batch of ``micro_batch``
    samples, at TP width ``tp`` and context-parallel degree ``cp`` (the gradients shared by the
    d·c devices of the DP×CP group).  ``sequence_parallel``: sharded with Megatron's sequence
    parallelism, so a boundary's values are sharded over the TP group already and each rank
    sends its own share; ``blocks``: (first layer, count) of the repeated blocks interleaving
    splits over its chunks (None: none); ``grads_freed``: the runtime frees the gradients after each
    step (``placement.GRADS_FREED_RUNTIMES``); ``grad_element_bytes``: the bytes of one gradient
    element as ``grad_bytes`` count them (4 under autocast), which the options' reduce dtype
    rescales.  Layers repeated in a model may be the same object (the search's settings share
    them): they become one dict of the DP's problem."""

    layers: Sequence[LayerNumbers]
    micro_batch: int
    tp: int
    cp: int = 1
    sequence_parallel: bool = False
    blocks: tuple[int, int] | None = None
    grads_freed: bool = False
    grad_element_bytes: int = 2


def static_numbers(
    info: Mapping[str, object], memory: Mapping[str, object], saved_bytes: Sequence[int]
) -> LayerNumbers:
    """A layer's numbers that no chip changes, its times 0: from its ``phaze.layers`` record
    ``info`` (boundary bytes, experts, dispatch bytes), its ``phaze.layer_memory`` record
    ``memory`` (``memory.LayerMemory.record``) and the activation bytes it stashes per
    micro-batch under no, selective and full recompute (``phaze.layer_recompute``)."""

    def n(record: Mapping[str, object], name: str) -> int:
        value = record[name]
        assert isinstance(value, int)  # the records' counts (IntegerAttr, LayerMemory's ints)
        return value

    none, selective, full = saved_bytes
    return LayerNumbers(
        fwd_s=0.0,
        bwd_s=0.0,
        recompute_s=(0.0, 0.0, 0.0),
        saved_bytes=(none, selective, full),
        param_bytes=n(memory, "param_bytes"),
        grad_bytes=n(memory, "grad_bytes"),
        optimizer_bytes=n(memory, "optimizer_bytes"),
        workspace_bytes=n(memory, "workspace_bytes"),
        recompute_workspace_bytes=n(memory, "recompute_workspace_bytes"),
        boundary_bytes=n(info, "boundary_bytes"),
        experts=n(info, "experts"),
        expert_param_bytes=n(memory, "expert_param_bytes"),
        expert_grad_bytes=n(memory, "expert_param_bytes"),  # gradients as the weights (mixed precision)
        expert_optimizer_bytes=n(memory, "expert_optimizer_bytes"),
        fp8_weight_bytes=n(memory, "fp8_weight_bytes"),
        dispatch_bytes=n(info, "dispatch_bytes"),
    )


def timed(
    numbers: LayerNumbers,
    *,
    fwd_s: float,
    bwd_s: float,
    selective_s: float,
    full_s: float,
    opt_s: float,
    cast_s: float = 0.0,
    expert_gemm_s: tuple[ExpertTimes, ...] = (),
) -> LayerNumbers:
    """``numbers`` with a chip's times: the scheduled forward and backward of one micro-batch,
    the extra forward time of selective and full recompute, the optimizer step once per batch
    and, of it, the experts' part (:func:`~passes.algorithms.placement.expert_part`), and the
    forward's FP8 weight casts ``cast_s`` (scheduled alone), taken out of the forward and of
    full recompute's re-run forward (the DP adds them where Transformer Engine makes them),
    the experts' part as the experts' share of the weights; ``expert_gemm_s``: its expert GEMMs
    at each EP degree (``expert_gemms.expert_gemm_times``, their e = 1 in the times above), which
    the DP puts in place of theirs at 1 at the plan's e (empty: the traced shape at every e)."""
    return replace(
        numbers,
        fwd_s=max(0.0, fwd_s - cast_s),
        bwd_s=bwd_s,
        recompute_s=(0.0, selective_s, max(0.0, full_s - cast_s)),
        opt_s=opt_s,
        expert_opt_s=expert_part(opt_s, numbers.optimizer_bytes, numbers.expert_optimizer_bytes),
        cast_s=cast_s,
        expert_cast_s=expert_part(cast_s, numbers.param_bytes, numbers.expert_param_bytes),
        expert_gemm_s=expert_gemm_s,
    )
