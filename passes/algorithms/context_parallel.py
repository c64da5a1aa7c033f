"""Context parallelism: one device's share of a step whose sequences are split over c devices,
and the ring its attention exchanges keys and values around (pure Python, no xDSL).

How the runtimes run it (docs/design.md §6.8a):

- The sequence of every sample is cut into 2·c chunks and device i holds chunks i and
  2c−1−i, so that under a causal mask every device has the same work (Megatron-LM's
  ``get_batch_on_this_cp_rank`` in ``megatron/training/utils.py``; torchtitan 0.3.0's
  ``context_parallel_load_balancer = "headtail"``). Every op but attention sees S/c tokens per
  sample: phaze traces the step at S/c (:func:`local_seq_len`).
- Attention is ring attention (Transformer Engine's ``AttnFuncWithCPAndKVP2P``,
  ``transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py``, TE 2.20, d0067d0):
  c steps, each the attention of the device's queries against one device's keys and values,
  which travel one hop around the ring while the step before computes. Each step's work is
  the same, S²/(2c²) score elements, but not each step's mask (``cp_p2p_fwd_prepare_qkv`` and
  ``cp_p2p_fwd_fused_attn``): step 0, the ``diagonal``, is the causal attention of the
  device's own S/c queries and keys (the traced local attention); every other step is
  unmasked (``attn_mask_type_ = "no_mask"``), the S/c queries against the first half of the
  keys (``lower-triangle``) or the second half of the queries against all S/c keys
  (``upper-triangle``): half the square, at the unmasked kernel's rate, which is faster
  (:func:`off_diagonal_gemm`; ``_templated_ring_attention`` in torch 2.15's
  ``torch/distributed/tensor/experimental/_context_parallel/_attention.py`` splits them
  alike). torch's own context parallelism, which torchtitan runs, all-gathers the keys and
  values instead by default (``_RotateMethod.ALL_GATHER``): priced here as the ring, which
  moves the same bytes.
- The order of the steps and the hops beside them (:func:`forward_ring`,
  :func:`backward_ring`, :func:`ring_s`): forward, step i starts the send of the keys and
  values step i+1 needs and computes beside it (the diagonal first, the last step alone);
  backward (``AttnFuncWithCPAndKVP2P.backward``) the steps run in reverse, the diagonal last,
  and beside every step its keys and values go on with the partial ``dk``, ``dv`` summed so far
  (the first step's send carries the keys and values alone, the last one's ``dk``, ``dv``
  alone, which the step waits for before it adds its own).
- Between and after the steps TE merges their results in PyTorch ops, memory-bound passes over
  one device's tensors that run on the compute stream (:class:`RingPasses`,
  :func:`forward_passes`, :func:`backward_passes`): forward, the keys and values concatenated
  into the first send buffer, each off-diagonal step's half of the keys and values
  (``lower-triangle``) or of the queries (``upper-triangle``) made contiguous
  (``cp_p2p_fwd_fused_attn``), and after the last step the c partial outputs merged into one
  (``flash_attn_fwd_out_correction_init``, ``flash_attn_fwd_out_correction``); backward, the keys
  and values copied into the first send buffer, each off-diagonal step's halves made contiguous
  (``cp_p2p_bwd_fused_attn``: the keys and values, or the queries, output and its gradient),
  its ``dq`` copied or added into the device's (``dq.copy_``, ``dq.add_``) and, once the hop of
  the partial ``dk``, ``dv`` has arrived, its own added to them (``dk.add_``, ``dv.add_``). The
  devices of a ring split the triangles differently (device r runs r lower and c − 1 − r upper
  steps); each step waits for its slowest device, so a step is priced with the kind that moves
  more bytes. Not priced: the softmax statistics' merges (``[b, h, S/c]`` in fp32, 2/d of the
  output's bytes), the fills of a half gradient with zeros.
- A hop carries the keys and values as the kernel reads them: one device's TP share, its K/V
  heads (a grouped-query attention's, before a trace's ``repeat_kv`` expands them to the query
  heads: TE's kernels take the groups as they are); a backward hop with ``dk`` and ``dv``,
  twice the bytes.
- The ring's neighbours are t devices apart (ranks numbered TP innermost, then CP: Megatron-LM's
  ``tp-cp-ep-dp-pp``, torchtitan's mesh ``[pp, dp_replicate, dp_shard, cp, tp]``), on the
  network level of c·t devices. An overlapped transfer holds the SMs its NCCL channels run on:
  the level's ``collective_compute_share`` f slows the step beside it, as for the DP's
  collectives: a transfer of r seconds beside a step of x ends at max(r, x + f·min(r, x)).

The gradients of the weights are shared by the d·c devices of the DP×CP group (every device
of a CP group holds the whole layer): the placement DP's ``cp`` (``rust/phaze-dp``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from passes.algorithms.latency import MatmulDesc, VectorDesc
from passes.algorithms.network import LevelLike, level_for, p2p_bandwidth_Bps
from passes.algorithms.option_values import AUTO, Auto
from passes.algorithms.placement import MAX_COUNT, PlacementError
from phaze_ir.files import si_count

#: ``--context-parallel auto`` tries c = 1 and the powers of two whose local sequence, S/c, is at
#: least this many tokens. A bound of the search space, as the TP widths 1-8 are, not a fact of
#: a chip: below it a step's attention is too short to hide its transfer (docs/design.md §6.8a).
AUTO_MIN_LOCAL_TOKENS = 4096


class ContextParallelError(PlacementError):
    """A context-parallel degree that cannot split the run's sequences, said in one line."""


def parse_context_parallel(text: str) -> int | Auto:
    """``--context-parallel``'s value: ``"auto"`` -> :data:`AUTO` (the sweep tries
    :func:`auto_degrees`), ``"N"`` -> N >= 1."""
    if text == AUTO.value:
        return AUTO
    shown = text if len(text) <= 40 else text[:40] + "..."
    if text.isascii() and text.isdigit() and (len(text) > 10 or int(text) > MAX_COUNT):
        # a degree, but past any cluster's devices (not "expected N >= 1": it is)
        raise ContextParallelError(
            f"context parallel {shown!r}: expected auto or a degree from 1 to {si_count(MAX_COUNT)}"
        )
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise ContextParallelError(f"context parallel {shown!r}: expected auto or a degree N >= 1")
    return int(text)


def context_parallel_problem(text: object) -> str | None:
    """The check of ``--context-parallel``'s value: what is wrong with it, None when it is
    ``auto`` or a degree."""
    if not isinstance(text, str):
        return "expected auto or a degree N >= 1"
    try:
        parse_context_parallel(text)
    except ContextParallelError as e:
        return str(e).split(": ", 1)[1]
    return None


def check_degree(c: int, seq_len: int | None, devices: int) -> None:
    """Why degree ``c`` cannot split sequences of ``seq_len`` tokens over ``devices`` devices
    (a :class:`ContextParallelError`), nothing when it can: the 2·c load-balanced chunks must
    be whole tokens, and the group no larger than the cluster."""
    if c == 1:
        return
    if seq_len is None:
        raise ContextParallelError(f"context parallel {c}: the model has no sequence length; expected --seq-len")
    if seq_len % (2 * c):
        raise ContextParallelError(
            f"context parallel {c}: the sequence length {seq_len} is not a multiple of 2·c = {2 * c} "
            "(the load-balanced chunks of causal attention); expected a degree c with 2·c dividing it"
        )
    if c > devices:
        raise ContextParallelError(f"context parallel {c}: expected at most --devices {devices}")


def auto_degrees(seq_len: int | None, devices: int) -> tuple[int, ...]:
    """The degrees ``--context-parallel auto`` tries: 1, then each power of two c that splits
    the sequence (:func:`check_degree`) into local sequences of at least
    :data:`AUTO_MIN_LOCAL_TOKENS`."""
    out = [1]
    c = 2
    while seq_len is not None and seq_len // c >= AUTO_MIN_LOCAL_TOKENS and c <= devices:
        if seq_len % (2 * c) == 0:
            out.append(c)
        c *= 2
    return tuple(out)


def local_seq_len(seq_len: int | None, c: int) -> int | None:
    """The tokens per sample one device of a CP group of ``c`` holds."""
    return None if seq_len is None else seq_len // c


def ring_step_s(levels: Sequence[LevelLike], nbytes: float, c: int, tp: int) -> tuple[float, int]:
    """(seconds, level index) of one hop of the CP ring: ``nbytes`` sent to the next device
    while as many arrive from the one before (full duplex), neighbours ``tp`` devices apart on
    the level of c·t devices, at its point-to-point bandwidth (``network.p2p_bandwidth_Bps``)."""
    index = level_for(levels, c * tp)
    level = levels[index]
    return level.latency_s + float(nbytes) / p2p_bandwidth_Bps(levels, index, tp), index


def off_diagonal_gemm(d: MatmulDesc) -> MatmulDesc | None:
    """The GEMM ``d`` of a fused causal attention (one device's local attention, traced) as an
    off-diagonal step of the ring runs it: unmasked, over half the rows of its score square (the
    keys' first half against every query, or the queries' second half against every key: the
    same FLOPs), so half of ``d``'s M rows and of its left operand, at the unmasked kernel's
    rate at the same sequence (the longest dimension, S/c, as a fused attention is looked up);
    None when ``d`` is not a causal attention GEMM or has an odd M."""
    if not d.causal or not d.attention or d.m % 2:
        return None
    return dataclasses.replace(d, m=d.m // 2, a_bytes=d.a_bytes // 2, onchip_bytes=d.onchip_bytes // 2, causal=False)


def forward_ring(diagonal_s: float, off_s: float, hop_s: float, c: int) -> list[tuple[float, float]]:
    """(step seconds, seconds of the hop beside it) of a forward ring of ``c`` steps: the
    diagonal first, beside it the hop of the next step's keys and values, every other step but
    the last likewise, the last alone (``AttnFuncWithCPAndKVP2P.forward``)."""
    if c <= 1:
        return [(diagonal_s, 0.0)]
    return [(diagonal_s, hop_s)] + [(off_s, hop_s)] * (c - 2) + [(off_s, 0.0)]


def backward_ring(
    diagonal_s: float, off_s: float, kv_hop_s: float, kv_grad_hop_s: float, c: int
) -> list[tuple[float, float]]:
    """(step seconds, seconds of the hop beside it) of a backward ring of ``c`` steps: the
    forward's in reverse, the off-diagonal steps first, the diagonal last; beside the first its
    keys and values go on (``kv_hop_s``), beside each middle one they go on with the partial
    ``dk``, ``dv`` (``kv_grad_hop_s``), beside the last those gradients alone (``kv_hop_s``:
    as many bytes), which it waits for (``AttnFuncWithCPAndKVP2P.backward``)."""
    if c <= 1:
        return [(diagonal_s, 0.0)]
    return [(off_s, kv_hop_s)] + [(off_s, kv_grad_hop_s)] * (c - 2) + [(diagonal_s, kv_hop_s)]


def ring_s(steps: Sequence[tuple[float, float]], share: float) -> float:
    """Seconds of a ring's ``steps`` ((step x, hop r beside it) each), a hop slowing the step
    beside it by ``share`` of their overlap (the level's ``collective_compute_share``): each
    ends at max(r, x + f·min(r, x))."""
    return sum(max(r, x + share * min(r, x)) for x, r in steps)


# -- the memory-bound passes around the steps ---------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RingTensors:
    """One device's tensors of one attention of the ring, in bytes (S/c tokens, its TP share of
    the heads): the queries, the keys and values together, the output (and as many of its
    gradient), and ``elem`` the bytes of one element."""

    q: int
    kv: int
    out: int
    elem: int = 2


def _copy(nbytes: int, elem: int, launches: int = 1) -> VectorDesc:
    """A copy of ``nbytes`` (``.contiguous()``, ``torch.cat``, ``copy_``): read once, written once."""
    return VectorDesc(work=nbytes // elem, read_bytes=nbytes, write_bytes=nbytes, launches=launches)


def _accumulate(nbytes: int, elem: int, launches: int = 1) -> VectorDesc:
    """``total += part`` over ``nbytes`` of ``total`` (``add_``, an output correction): both read,
    ``total`` written."""
    return VectorDesc(work=nbytes // elem, read_bytes=2 * nbytes, write_bytes=nbytes, launches=launches)


def _bytes_moved(passes: Sequence[VectorDesc]) -> int:
    return sum(d.read_bytes + d.write_bytes for d in passes)


@dataclasses.dataclass(frozen=True)
class RingPasses:
    """The memory-bound passes of one ring (one attention, one phase) where they run: ``before``
    the first step, ``beside[i]`` on the compute stream beside step i's hop, ``after[i]`` once
    step i's hop has arrived, ``end`` after the last step (steps in the ring's order)."""

    before: tuple[VectorDesc, ...] = ()
    beside: tuple[tuple[VectorDesc, ...], ...] = ()
    after: tuple[tuple[VectorDesc, ...], ...] = ()
    end: tuple[VectorDesc, ...] = ()

    def descs(self) -> list[VectorDesc]:
        """Every pass, once each."""
        every = [*self.before, *(d for ds in self.beside for d in ds), *(d for ds in self.after for d in ds), *self.end]
        return list(dict.fromkeys(every))

    def around(
        self, steps: Sequence[tuple[float, float]], seconds: Callable[[VectorDesc], float]
    ) -> list[tuple[float, float]]:
        """The ring's (step seconds, hop seconds beside it) with the passes (``seconds`` each):
        those beside a step lengthen it, the others take the compute stream alone."""

        def total(passes: Sequence[VectorDesc]) -> float:
            return sum(seconds(d) for d in passes)

        out = [(total(self.before), 0.0)]
        for i, (x, r) in enumerate(steps):
            out.append((x + (total(self.beside[i]) if i < len(self.beside) else 0.0), r))
            if i < len(self.after):
                out.append((total(self.after[i]), 0.0))
        out.append((total(self.end), 0.0))
        return [s for s in out if s != (0.0, 0.0)]


def forward_passes(t: RingTensors, c: int) -> RingPasses:
    """The passes of a forward ring of ``c`` steps (TE 2.20's ``AttnFuncWithCPAndKVP2P.forward``):
    ``torch.cat`` of the keys and values into the first send buffer; beside each off-diagonal
    step its half made contiguous, the keys' and values' (``lower-triangle``, two copies) or the
    queries' (``upper-triangle``), whichever moves more; after the last step the c partial
    outputs merged: the first scaled into the output, each other scaled and added to it
    (``flash_attn_fwd_out_correction_init``, ``flash_attn_fwd_out_correction``: the device that
    runs no upper triangle merges whole outputs every step). Empty without a ring."""
    if c <= 1:
        return RingPasses()
    lower = (_copy(t.kv // 2, t.elem, launches=2),)
    upper = (_copy(t.q // 2, t.elem),)
    off = max(lower, upper, key=_bytes_moved)
    return RingPasses(
        before=(_copy(t.kv, t.elem),),
        beside=((),) + (off,) * (c - 1),
        end=(_copy(t.out, t.elem),) + (_accumulate(t.out, t.elem),) * (c - 1),
    )


def backward_passes(t: RingTensors, c: int) -> RingPasses:
    """The passes of a backward ring of ``c`` steps (TE 2.20's ``AttnFuncWithCPAndKVP2P.backward``,
    the steps in :func:`backward_ring`'s order, the diagonal last): the keys and values copied into
    the first send buffer; beside each off-diagonal step its halves made contiguous and its
    ``dq`` copied (the first step) or added into the device's, the ``lower-triangle`` kind
    (the keys' and values' halves, the whole ``dq``) or the ``upper-triangle`` kind (the
    queries', output's and its gradient's halves, ``dq``'s second half), whichever moves more
    with its gradients; once the step's hop has arrived its ``dk``, ``dv`` copied (the first) or
    added into those it received, half of them under the lower triangle, all of them under the
    upper and the diagonal. Empty without a ring."""
    if c <= 1:
        return RingPasses()
    beside: list[tuple[VectorDesc, ...]] = []
    after: list[tuple[VectorDesc, ...]] = []
    for i in range(c - 1):
        merge = _copy if i == 0 else _accumulate
        lower = ((_copy(t.kv // 2, t.elem, launches=2), merge(t.q, t.elem)), (merge(t.kv // 2, t.elem, launches=2),))
        upper = (
            (_copy(t.q // 2 + t.out, t.elem, launches=3), merge(t.q // 2, t.elem)),
            (merge(t.kv, t.elem, launches=2),),
        )
        slower = max(lower, upper, key=lambda kind: _bytes_moved(kind[0] + kind[1]))
        beside.append(slower[0])
        after.append(slower[1])
    beside.append((_accumulate(t.q, t.elem),))
    after.append((_accumulate(t.kv, t.elem, launches=2),))
    return RingPasses(before=(_copy(t.kv, t.elem),), beside=tuple(beside), after=tuple(after))
