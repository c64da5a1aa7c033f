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
  the same, S²/(2c²) score elements (the diagonal step half of a (S/c)² block, every other
  step half of the keys or half of the queries: ``_templated_ring_attention`` in torch 2.15's
  ``torch/distributed/tensor/experimental/_context_parallel/_attention.py`` splits them
  alike), which is the work of the local causal attention the trace holds. So the attention
  of c steps takes c times the traced attention, and the c−1 transfers hide behind the steps
  before them (:func:`ring_attention_s`). torch's own context parallelism, which torchtitan
  runs, all-gathers the keys and values instead by default (``_RotateMethod.ALL_GATHER``):
  priced here as the ring, which moves the same bytes.
- Forward, a step sends the keys and values (the attention's K and V, as the trace has them:
  one device's TP share); backward, the keys and values again and their gradients' partial sums
  (TE's backward ring carries ``dk`` and ``dv`` with them): twice the bytes.
- The ring's neighbours are t devices apart (ranks numbered TP innermost, then CP: Megatron-LM's
  ``tp-cp-ep-dp-pp``, torchtitan's mesh ``[pp, dp_replicate, dp_shard, cp, tp]``), on the
  network level of c·t devices. An overlapped transfer holds the SMs its NCCL channels run on:
  the level's ``collective_compute_share`` f slows the step beside it, as for the DP's
  collectives: a transfer of r seconds beside a step of x ends at max(r, x + f·min(r, x)).

The gradients of the weights are shared by the d·c devices of the DP×CP group (every device
of a CP group holds the whole layer): the placement DP's ``cp`` (``rust/phaze-dp``).
"""

from __future__ import annotations

from collections.abc import Sequence

from passes.algorithms.network import LevelLike, level_for, p2p_bandwidth_Bps
from passes.algorithms.placement import PlacementError

#: ``--context-parallel auto`` tries c = 1 and the powers of two whose local sequence, S/c, is at
#: least this many tokens. A bound of the search space, as the TP widths 1-8 are, not a fact of
#: a chip: below it a step's attention is too short to hide its transfer (docs/design.md §6.8a).
AUTO_MIN_LOCAL_TOKENS = 4096
#: The settings of ``--context-parallel`` besides a degree.
AUTO = "auto"


class ContextParallelError(PlacementError):
    """A context-parallel degree that cannot split the run's sequences, said in one line."""


def parse_context_parallel(text: str) -> int | None:
    """``"auto"`` -> None (the sweep tries :func:`auto_degrees`), ``"N"`` -> N >= 1."""
    if text == AUTO:
        return None
    if not text.isdigit() or int(text) < 1 or len(text) > 10:
        shown = text if len(text) <= 40 else text[:40] + "..."
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


def ring_attention_s(local_s: float, step_s: float, c: int, share: float) -> float:
    """Seconds of a ring attention of ``c`` steps, each as long as the traced local attention
    (``local_s``), each hop of the ring ``step_s`` beside the step before it, which it slows by
    ``share`` of the overlap (the level's ``collective_compute_share``): the first step alone,
    then c−1 steps each ending at max(r, x + f·min(r, x))."""
    if c <= 1:
        return local_s
    hop = max(step_s, local_s + share * min(step_s, local_s))
    return local_s + (c - 1) * hop
