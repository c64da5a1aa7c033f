"""Type stub of the Rust extension `passes.algorithms._phaze_rs` (built from rust/phaze-py).

The placement functions take and return plain dicts, the serde forms of rust/phaze-dp's types
(``Problem``, ``Evaluation``); the model (formulas, tie-break) is documented in its crate docs.
Units are SI: seconds, bytes, bytes/s. Bytes are integers (a float is accepted and rounded up to
a whole byte). Every key below is required unless marked NotRequired (absent, not None, unless
its type says None); a bool is not a number nor an int a bool, a float not a count; unknown keys
raise ValueError, missing keys KeyError, bad values ValueError, each naming the key (e.g.
``problem.layers[3].fwd_s``). Where a dict goes, a dataclass instance may go too, read as the dict
of its fields (by attribute; a field that is None as absent): a problem's ``levels`` are the
accelerator's own ``NetworkLevel`` objects (``phaze_ir.hardware``), not a copy of them. The GIL is
released while solving.
"""

from collections.abc import Sequence
from typing import Literal, NotRequired, TypedDict

from phaze_ir.hardware import NetworkLevel
from phaze_ir.op_kinds import RecomputePolicy

#: A recompute policy's word (the words are RecomputePolicy's, declared once).
Policy = RecomputePolicy | str
#: "auto": each stage takes the fastest policy that fits; a policy: every stage uses it.
RecomputeSetting = RecomputePolicy | str
#: "auto": the DP chooses the ZeRO stage; "0".."3": that stage.
ZeroSetting = Literal["auto", "0", "1", "2", "3"]
RankOrder = Literal["tp-dp-pp", "tp-pp-dp"]
RankOrderSetting = Literal["auto", "tp-dp-pp", "tp-pp-dp"]
ViolationKind = Literal["batch", "devices", "stages", "memory"]

class LayerDict(TypedDict):
    """One layer priced for ONE micro-batch at the problem's micro-batch size and TP width (its
    TP all-reduces are ops of the layer: their time is in fwd_s and bwd_s)."""

    fwd_s: float
    bwd_s: float
    recompute_s: list[float]  # [none, selective, full]: extra time per micro-batch
    # The optimizer step (default 0): once per batch after the flush, all of the layer's state
    # on one device (ZeRO >= 1 divides it by d); of it, the experts' part (EP divides it by e).
    opt_s: NotRequired[float]
    expert_opt_s: NotRequired[float]
    # The forward's FP8 weight casts (default 0), not in fwd_s nor recompute_s: once per batch
    # below ZeRO-3, every forward under it; of them, the experts' part (EP divides it by e).
    cast_s: NotRequired[float]
    expert_cast_s: NotRequired[float]
    saved_bytes: list[int]  # [none, selective, full]: activation bytes stashed per micro-batch
    param_bytes: int  # per device, after TP sharding
    grad_bytes: int
    optimizer_bytes: int
    workspace_bytes: int  # peak transient bytes while the layer runs
    # ... while its backward runs after its forward was re-run (full recompute: a stage holds
    # the larger of the two; default 0: workspace_bytes)
    recompute_workspace_bytes: NotRequired[int]
    boundary_bytes: int  # activation bytes sent to the next layer per micro-batch
    # An MoE layer (all default 0, a dense layer): its experts, the parts of the bytes above
    # that are the experts' (divided by expert parallelism), the bytes of the tokens one
    # forward dispatches to them (an all-to-all each way per forward and per backward).
    experts: NotRequired[int]
    expert_param_bytes: NotRequired[int]
    expert_grad_bytes: NotRequired[int]
    expert_optimizer_bytes: NotRequired[int]
    dispatch_bytes: NotRequired[int]
    # The FP8 weight copies Transformer Engine keeps for the step (default 0): held beside the
    # weights, none under ZeRO-3 (FSDP re-casts from the re-gathered weight)
    fp8_weight_bytes: NotRequired[int]
    param_gather_bytes: NotRequired[int]
    # An MoE layer's expert GEMMs at each EP degree e (default none: priced at the traced
    # shape at every e), e = 1 among them: the layer's times at e are its own less theirs at 1
    # plus theirs at e.
    expert_gemm_s: NotRequired[list[ExpertGemmsDict]]

class ExpertGemmsDict(TypedDict):
    """A layer's expert GEMMs at EP degree ``e``, at the EP member's shape (E/e experts on e
    times the rows each): their time in the forward, the backward and each recompute policy's
    extra forward [none, selective, full]."""

    e: int
    fwd_s: float
    bwd_s: float
    recompute_s: list[float]

class ProtocolDict(TypedDict):
    """One protocol of the innermost level's collectives (docs/design.md §5.5): the keys of
    ``phaze_ir.hardware.NetworkProtocol``."""

    name: NotRequired[str]  # its label (LL128): not the DP's, ignored
    bandwidth_Bps: float
    latency_s: float  # per ring step
    base_s: float  # per collective
    shard_Bps: NotRequired[float]  # the un-overlapped pass over a device's n/g bytes
    algorithm: NotRequired[str]  # "ring" (absent: the same) or "nvls": NVLink SHARP, all-reduces only

class LevelDict(TypedDict):
    """A network level, innermost first; the last level is the whole cluster: the keys of
    ``phaze_ir.hardware.NetworkLevel``."""

    # The level's label and its network's energy and power (the energy passes'): ignored.
    name: NotRequired[str]
    energy_j_per_byte: NotRequired[float]
    power_w_per_device: NotRequired[float]
    group_size: int
    bandwidth_Bps: float  # per link, bytes/s
    latency_s: float
    uplink_Bps: NotRequired[float]  # out of one group of the level below, all its devices (bytes/s)
    topology: NotRequired[str]  # "switch" (absent), "torus", "fat_tree"
    torus_dims: NotRequired[list[int]]  # with a torus: 2 or 3 dimensions, the first fastest
    leaf_size: NotRequired[int]  # with a fat tree: devices under one leaf
    oversubscription: NotRequired[float]  # with a fat tree: >= 1
    protocols: NotRequired[list[ProtocolDict]]  # innermost level only
    tree: NotRequired[bool]  # above the innermost, not a torus: all-reduces may run as NCCL's tree

#: A network level: the accelerator's own (``Accelerator.network``), or its dict.
Level = NetworkLevel | LevelDict

class ProblemDict(TypedDict):
    layers: list[LayerDict]  # topological order: prologue, blocks, head
    devices: int  # N
    hbm_bytes: int
    levels: Sequence[Level]
    global_batch: int  # B, samples
    micro_batch: int  # b
    tp: int  # t
    cp: NotRequired[int]  # c, context-parallel degree (default 1); the DP x CP group (d * c) shares the gradients
    dp_overlap: bool  # the DP all-reduce hides behind the stage's backward
    max_stages: NotRequired[int | None]
    # Default "auto" (or None); a policy restricts every stage to it, in the search, the memory
    # check and the infeasibility report (whose message then says "recompute = POLICY").
    recompute: NotRequired[RecomputeSetting | None]
    # Default "auto" (or None): the DP chooses the ZeRO stage; "0".."3" fixes it.
    zero: NotRequired[ZeroSetting | None]
    # Model chunks per pipeline rank: None (default) lets the DP choose 1 or an interleaving,
    # 1 is plain 1F1B, v >= 2 interleaved 1F1B with v chunks.
    virtual_stages: NotRequired[int | None]
    # [first layer, count] of the repeated blocks (interleaving splits them evenly over the
    # p * v chunks; the layers before join chunk 0, those after the last chunk). None: all.
    blocks: NotRequired[list[int] | None]
    # The expert-parallel degree e (must divide the experts): None (default) lets the DP choose
    # among the e dividing both d and the experts; 1 keeps every expert on every replica.
    expert_parallel: NotRequired[int | None]
    # Expert tensor parallelism k dividing tp (Megatron-core's --expert-tensor-parallel-size):
    # None (default) is tp; below it the experts' own mesh ETP x EP x EDP over tp * cp * d.
    expert_tensor_parallel: NotRequired[int | None]
    # How devices are numbered into groups, TP innermost: "tp-dp-pp" (PP outermost: the
    # launchers' default), "tp-pp-dp" (DP outermost), or "auto"/None (default): the DP chooses.
    rank_order: NotRequired[RankOrderSetting | None]
    # Each TP rank sends 1/t of a pipeline transfer and the receiving TP group all-gathers it
    # (DeepSpeed's partitioned pipeline); False (default): every rank sends it whole.
    pipeline_split: NotRequired[bool]
    # The runtime allocates each layer's gradients in its backward and frees them after the
    # optimizer step (PyTorch's zero_grad(set_to_none=True)): with one micro-batch per step, no
    # ZeRO-2/3 and no EP, a stage's peak is that of its activations and gradients held together
    # during the backward. False (default): the gradients are held for the whole step.
    grads_freed: NotRequired[bool]
    grad_reduce_scale: NotRequired[float]  # DP gradient collective bytes per grad_bytes byte (wire dtype / grads')
    # HSDP: ZeRO-2/3 shards over groups of this many DP ranks, replicated over the rest, each
    # layer's sharded gradients all-reduced across the replicas. None (default): over all of them.
    dp_shard: NotRequired[int | None]
    # FSDP's copies under ZeRO-3 priced at the chip's memory-bound rate; None (default): not priced.
    fsdp_copies: NotRequired[FsdpCopiesDict | None]

class FsdpCopiesDict(TypedDict):
    """What FSDP's copies cost (docs/design.md §6.5): the keys of phaze_dp's ``FsdpCopies``."""

    bandwidth_Bps: float  # a memory-bound kernel's bytes read plus written per second
    implementation: str  # "fsdp1" or "fsdp2"
    master_scale: float  # bytes of FSDP's fp32 sharded parameter per param_bytes byte

class MemoryDict(TypedDict):
    """A stage's (its rank's) bytes per device by part, as the DP counts them: the parts add up
    to its memory_bytes; state parts are already divided over the DP group where ZeRO shards them."""

    params: int  # ZeRO-3: 1/d of them plus two gathered layers
    grads: int  # 1/d from ZeRO-2
    optimizer: int  # 1/d from ZeRO-1
    activations: int  # the stash at the schedule's peak
    workspace: int  # the largest layer's transient bytes

class TimePartsDict(TypedDict):
    compute_s: float  # sum of the layers' fwd_s + bwd_s (their TP collectives included)
    recompute_s: float  # the policy's extra work
    pp_comm_s: float  # the stage-boundary transfers
    zero_comm_s: float  # ZeRO-2/3's per-micro-batch DP collectives not hidden
    ep_comm_s: float  # EP's all-to-alls (a full recompute's again)

class StageDict(TypedDict):
    rank: int  # the pipeline rank running it (index mod pp); the numbers below are the rank's
    first_layer: int
    last_layer: int  # inclusive
    devices: int  # t
    time_s: float  # T_k per micro-batch, including p2p
    time_parts: TimePartsDict  # time_s by part (they add up to it but for rounding)
    memory_bytes: int  # per device
    memory: MemoryDict  # memory_bytes by part
    recompute: Policy
    in_flight: int  # micro-batches stashed under 1F1B: min(p - k, m); chunk units if interleaved
    dp_comm_s: float  # DP collectives per step before overlap (all-reduce or ZeRO's)
    exposed_dp_s: float  # E_k
    optimizer_s: float  # O_k: the optimizer step after the flush (1/d of it under ZeRO >= 1)

class PlanDict(TypedDict):
    dp: int
    pp: int
    virtual_stages: int  # v chunks per rank (1: plain 1F1B)
    zero: int  # ZeRO stage 0..3
    expert_parallel: int  # EP degree e (1: every replica holds every expert)
    rank_order: RankOrder  # how devices are numbered into TP, DP and PP groups
    tp: int
    cp: int  # c, context-parallel degree
    micro_batch: int
    num_micro_batches: int  # m = B / (b * d)
    global_batch: int
    time_per_batch_s: float  # (m + (p - 1) / v) * max T_k + max E_k + max O_k
    throughput_samples_per_s: float  # B / time_per_batch_s
    devices_used: int  # d * p * t * c
    max_stage_time_s: float
    max_exposed_dp_s: float
    max_optimizer_s: float
    max_memory_bytes: int
    stages: list[StageDict]

class ViolationDict(TypedDict):
    kind: ViolationKind
    message: str  # starts with the kind, e.g. "devices: t = 8 exceeds N = 4"
    needed_bytes: int | None  # memory: the least largest-stage memory of the options considered
    dp: int | None  # memory: the option that needs needed_bytes
    pp: int | None

class ResultDict(TypedDict):
    feasible: bool
    # solve_*: the optimal plan, None when infeasible (never a plan that violates anything).
    # evaluate_placement: the plan's numbers also when infeasible (for memory: the fastest plan
    # among those needing the least memory); None only when p > L or b*d does not divide B.
    plan: PlanDict | None
    violations: list[ViolationDict]  # solve_*: at most one, the first binding constraint

def version() -> str:
    """Version of the Rust extension."""

def solve_placement(problem: ProblemDict) -> ResultDict:
    """Optimal (d, p, split, per-stage recompute) for one problem; exact."""

def solve_placement_batch(problems: list[ProblemDict]) -> list[ResultDict]:
    """`solve_placement` over many problems, in parallel; results in input order."""

def evaluate_placement(problem: ProblemDict, pp: int, dp: int) -> ResultDict:
    """A fixed pp and dp (best split and policies): every violated constraint and the numbers."""

def evaluate_placement_batch(problems: list[ProblemDict], pp: int, dp: int) -> list[ResultDict]:
    """`evaluate_placement` of one pp and dp over many problems, in parallel; results in input order."""

# The scheduling warm start (rust/phaze-sched). An instance is (kind, caps, modes, preds): each
# op's unit kind (an index into caps), the cores of each kind, each op's [(duration_s,
# cores_held), ...] (one core first, split second) and its predecessors (topological order).

def best_list_schedule(
    kind: list[int], caps: list[int], modes: list[list[tuple[float, int]]], preds: list[list[int]]
) -> tuple[list[float], list[int], float]:
    """The best list schedule of the portfolio, justified: (start, mode, makespan)."""

def improve_schedule(
    kind: list[int],
    caps: list[int],
    modes: list[list[tuple[float, int]]],
    preds: list[list[int]],
    start: list[float],
    mode: list[int],
    makespan: float,
    iterations: int,
    seed: int,
) -> tuple[list[float], list[int], float]:
    """The seeded local search from a schedule: `iterations` decodes; never worse."""

def decode_justified(
    kind: list[int],
    caps: list[int],
    modes: list[list[tuple[float, int]]],
    preds: list[list[int]],
    order: list[int],
    mode: list[int],
) -> tuple[list[float], float]:
    """An op list (precedence-feasible) decoded with fixed modes, then justified: (start, makespan)."""
