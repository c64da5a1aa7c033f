//! Inputs of the placement search (layers, network, setup), their validation, and the α–β
//! network formulas. Everything is SI: seconds, bytes, bytes per second.
//!
//! The network formulas ([`Problem::level_for`], [`Problem::ring_bandwidth_bps`],
//! [`Problem::ring_allreduce_s`], [`Problem::p2p_s`]) are written operation for operation like
//! `passes/algorithms/network.py` (`level_for`, `ring_bandwidth_Bps`, `ring_all_reduce_s`,
//! `send_recv_s`), so that Python and Rust give bit-identical floats; change both together.
//!
//! The inputs derive serde's `Deserialize` in the form the Python dicts have (the keys of
//! `passes/algorithms/_phaze_rs.pyi`, `deny_unknown_fields` so that a misspelt optional key is
//! not silently its default); the forms serde does not derive are in [`crate::input`].

use crate::input;
use serde::{Deserialize, Serialize};

/// Activation-recomputation policy of a pipeline stage.
///
/// The discriminant is the index into [`Layer::recompute_s`] and [`Layer::saved_bytes`],
/// and the order of the tie-break "lower policy index first".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Recompute {
    /// Stash every activation autograd saves; no extra forward work.
    None = 0,
    /// Recompute the cheap, memory-hungry parts (e.g. attention scores) in backward.
    Selective = 1,
    /// Stash only the layer inputs and rerun the whole forward in backward.
    Full = 2,
}

impl Recompute {
    /// All policies, in index order.
    pub const ALL: [Recompute; 3] = [Recompute::None, Recompute::Selective, Recompute::Full];

    /// The policy with the given index (0, 1, 2), if any.
    pub fn from_index(i: usize) -> Option<Recompute> {
        Self::ALL.get(i).copied()
    }

    /// Index into the per-policy arrays of a [`Layer`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The policy of a lower-case name (`"none"`, `"selective"`, `"full"`), if any.
    pub fn from_name(name: &str) -> Option<Recompute> {
        Self::ALL.into_iter().find(|r| r.as_str() == name)
    }

    /// A recompute setting as users give it: `"auto"` lets the search choose per stage
    /// (`None`), a policy's name fixes that policy for every stage (see
    /// [`Problem::recompute`]). Anything else is an input error naming the words.
    pub fn setting(name: &str) -> Result<Option<Recompute>, InputError> {
        if name == "auto" {
            return Ok(None);
        }
        Self::from_name(name).map(Some).ok_or_else(|| InputError {
            message: format!("recompute must be one of auto, none, selective, full, got {name:?}"),
        })
    }

    /// Lower-case name used across the Python boundary: `"none"`, `"selective"`, `"full"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Recompute::None => "none",
            Recompute::Selective => "selective",
            Recompute::Full => "full",
        }
    }
}

/// How the data-parallel group shares the training state (ZeRO stage; Rajbhandari et al. 2020).
///
/// The discriminant is the stage number, and the order of the tie-break "lower stage first".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(into = "u8")]
pub enum Zero {
    /// Plain data parallelism: every replica holds everything; one gradient all-reduce per step.
    Off = 0,
    /// Optimizer state sharded over the DP group (Megatron's distributed optimizer): gradients
    /// reduce-scattered and parameters all-gathered once per step.
    Optimizer = 1,
    /// Optimizer state and gradients sharded: the gradients cannot be accumulated unsharded,
    /// so they are reduce-scattered after every micro-batch; parameters all-gathered per step.
    Gradients = 2,
    /// Everything sharded (FSDP): each micro-batch all-gathers the parameters in forward and
    /// again in backward and reduce-scatters the gradients; two layers' full parameters are
    /// held while they run (the current one and the one prefetched).
    Parameters = 3,
}

impl Zero {
    /// All stages, in order.
    pub const ALL: [Zero; 4] = [
        Zero::Off,
        Zero::Optimizer,
        Zero::Gradients,
        Zero::Parameters,
    ];

    /// The stage number 0..=3.
    pub fn stage(self) -> u8 {
        self as u8
    }

    /// The ZeRO stage of a number, if it is one.
    pub fn from_stage(z: u8) -> Option<Zero> {
        Self::ALL.get(usize::from(z)).copied()
    }

    /// A sharding setting as users give it: `"auto"` lets the search choose (`None`), `"0"` to
    /// `"3"` fix the stage. Anything else is an input error naming the words.
    pub fn setting(name: &str) -> Result<Option<Zero>, InputError> {
        if name == "auto" {
            return Ok(None);
        }
        name.parse::<u8>()
            .ok()
            .and_then(Zero::from_stage)
            .map(Some)
            .ok_or_else(|| InputError {
                message: format!("zero must be one of auto, 0, 1, 2, 3, got {name:?}"),
            })
    }
}

/// A plan names its ZeRO stage by number.
impl From<Zero> for u8 {
    fn from(z: Zero) -> u8 {
        z.stage()
    }
}

/// How the cluster's devices are numbered into TP, PP and DP groups: which groups are
/// contiguous decides which network level each collective crosses. TP is innermost in both.
///
/// The variant order is the tie-break's: the launchers' default first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RankOrder {
    /// TP, then DP, then PP outermost: Megatron-LM's default (`tp-cp-ep-dp-pp`), torchtitan's
    /// device mesh (`pp, dp, tp`) and Megatron-DeepSpeed's topology (`pipe, data, model`). A DP
    /// group's members lie t apart (level of d·t); pipeline neighbours d·t apart (level of
    /// d·p·t).
    TpDpPp,
    /// TP, then PP, then DP outermost: Megatron-LM's `--use-tp-pp-dp-mapping`. A pipeline
    /// replica's p·t devices are contiguous (neighbours on the level of p·t); a DP group's
    /// members lie p·t apart (level of d·p·t).
    TpPpDp,
}

impl RankOrder {
    /// Both orders, in tie-break order.
    pub const ALL: [RankOrder; 2] = [RankOrder::TpDpPp, RankOrder::TpPpDp];

    /// The order's name as users write it: `tp-dp-pp` or `tp-pp-dp`.
    pub fn name(self) -> &'static str {
        match self {
            RankOrder::TpDpPp => "tp-dp-pp",
            RankOrder::TpPpDp => "tp-pp-dp",
        }
    }

    /// An order as users give it: `"auto"` lets the search choose (`None`), `"tp-dp-pp"` and
    /// `"tp-pp-dp"` fix it. Anything else is an input error naming the words.
    pub fn setting(name: &str) -> Result<Option<RankOrder>, InputError> {
        if name == "auto" {
            return Ok(None);
        }
        Self::ALL
            .into_iter()
            .find(|o| o.name() == name)
            .map(Some)
            .ok_or_else(|| InputError {
                message: format!(
                    "rank_order must be one of auto, tp-dp-pp, tp-pp-dp, got {name:?}"
                ),
            })
    }

    /// (devices between consecutive DP-group members, devices between pipeline neighbours) at
    /// DP degree d, p stages, TP width t: the DP group's level is that of d times the first,
    /// its EP groups' that of e times it, the pipeline's that of p times the second.
    /// Under context parallelism d is the DP×CP group's d·c and t the TP width: the group's
    /// members are t apart, the pipeline neighbours d·c·t.
    pub fn strides(self, d: u64, p: u64, t: u64) -> (u64, u64) {
        match self {
            RankOrder::TpDpPp => (t, d * t),
            RankOrder::TpPpDp => (p * t, t),
        }
    }
}

/// One layer (prologue, a transformer block, the head), priced for ONE micro-batch at the
/// problem's micro-batch size and TP width, on one device of its TP group. Its TP collectives
/// are ops of the layer: their time is in `fwd_s` and `bwd_s`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Layer {
    /// Forward compute time (s).
    pub fwd_s: f64,
    /// Backward compute time (s), input and weight gradients.
    pub bwd_s: f64,
    /// Extra time per micro-batch under each recompute policy (none, selective, full) (s).
    pub recompute_s: [f64; 3],
    /// The layer's optimizer step (s): once per batch, after the pipeline flush, updating all
    /// of the layer's state held by one device of its TP group (the scheduled makespan of its
    /// optimizer ops). ZeRO >= 1 divides it over the d replicas (each updates its 1/d of the
    /// state); expert parallelism divides its experts' part, `expert_opt_s`, over e.
    #[serde(default)]
    pub opt_s: f64,
    /// The part of `opt_s` that updates the experts' state (0 in a dense layer).
    #[serde(default)]
    pub expert_opt_s: f64,
    /// The Transformer Engine casts of the layer's weights to FP8 (rowwise and the transposed
    /// columnwise copy) of one forward, for all of its experts (s): not in `fwd_s` nor in
    /// `recompute_s`. TE casts them on a step's first micro-batch and reuses the cached copies
    /// in the later ones (`quantize_weight` with `cache_weight`, `update_workspace` only when
    /// `is_first_microbatch`, TE 2.20.0.dev0 `module/linear.py`, `module/base.py`): once per
    /// step below ZeRO-3, beside the optimizer step; under ZeRO-3 (FSDP2: no cache,
    /// `cache_name = None`) in every forward, a full recompute's again. Expert parallelism
    /// leaves a device its own experts' casts, `expert_cast_s` of them over e. 0 when the
    /// weights are FP8 already (FP8 primary weights) or not FP8 at all.
    #[serde(default)]
    pub cast_s: f64,
    /// The part of `cast_s` that casts the experts' weights (0 in a dense layer).
    #[serde(default)]
    pub expert_cast_s: f64,
    /// Activation bytes stashed per micro-batch under each policy (none, selective, full).
    /// Usually non-increasing, which the search does not assume.
    #[serde(deserialize_with = "input::per_policy_bytes")]
    pub saved_bytes: [u64; 3],
    /// Weight bytes held per device, after TP sharding.
    #[serde(deserialize_with = "input::bytes")]
    pub param_bytes: u64,
    /// Gradient bytes held per device; also what the DP all-reduce moves.
    #[serde(deserialize_with = "input::bytes")]
    pub grad_bytes: u64,
    /// Optimizer-state bytes held per device (e.g. fp32 master copy + Adam moments).
    #[serde(deserialize_with = "input::bytes")]
    pub optimizer_bytes: u64,
    /// Peak transient bytes while the layer runs (only the largest in a stage counts).
    #[serde(deserialize_with = "input::bytes")]
    pub workspace_bytes: u64,
    /// Peak transient bytes while the layer's backward runs after its forward was re-run
    /// (full recompute: the rematerialized activations are live beside the stash); what a
    /// stage under full recompute holds is the larger of this and `workspace_bytes` (0: the
    /// same as `workspace_bytes`). Selective recompute's rematerialized tensors are not
    /// counted: the field bounds them from above only, by full's.
    #[serde(default, deserialize_with = "input::bytes")]
    pub recompute_workspace_bytes: u64,
    /// Activation bytes sent to the next layer per micro-batch; the same size comes back as
    /// the gradient in backward. Paid only when a stage boundary falls after this layer.
    #[serde(deserialize_with = "input::bytes")]
    pub boundary_bytes: u64,
    /// Experts of an MoE layer (its per-expert weights' count); 0 in a dense layer.
    #[serde(default)]
    pub experts: u64,
    /// The part of `param_bytes` that is per-expert weights: expert parallelism (EP e) divides
    /// it by e and the data-parallel collectives of it run over the d/e replicas that hold
    /// the same experts.
    #[serde(default, deserialize_with = "input::bytes")]
    pub expert_param_bytes: u64,
    /// The part of `grad_bytes` that is the experts' gradients.
    #[serde(default, deserialize_with = "input::bytes")]
    pub expert_grad_bytes: u64,
    /// The part of `optimizer_bytes` that is the experts' state.
    #[serde(default, deserialize_with = "input::bytes")]
    pub expert_optimizer_bytes: u64,
    /// Bytes of the tokens one forward routes to the experts, per micro-batch on one device:
    /// under EP each forward moves them in two all-to-alls over the EP group (dispatch and
    /// combine), each backward in two more, and a full recompute's forward in two again.
    #[serde(default, deserialize_with = "input::bytes")]
    pub dispatch_bytes: u64,
    /// The FP8 copies of the layer's weights (rowwise and columnwise) that Transformer Engine
    /// casts on a step's first micro-batch and keeps for its later ones: held once beside the
    /// weights whatever the micro-batches in flight, and not at all under ZeRO-3 (with FSDP,
    /// TE saves no FP8 workspace and casts again from the re-gathered weight).
    #[serde(default, deserialize_with = "input::bytes")]
    pub fp8_weight_bytes: u64,
    /// The bytes of the layer's parameters that ZeRO's parameter all-gathers move, when fewer
    /// than `param_bytes` (0: `param_bytes`): under FP8 primary weights the FP8 linears'
    /// weights are gathered at 1 byte an element (Megatron-LM d98e8a64's `--fp8-param-gather`
    /// keeps them in a `torch.uint8` parameter buffer, `group_params_for_buffers` in
    /// `megatron/core/distributed/param_and_grad_buffer.py`, and makes the transpose after
    /// the gather); the other parameters at their own bytes.
    #[serde(default, deserialize_with = "input::bytes")]
    pub param_gather_bytes: u64,
    /// The layer's expert GEMMs at each EP degree e the search may choose (one entry per e,
    /// e = 1 among them; empty in a dense layer, or when they are priced at the traced shape
    /// whatever e): their time in the forward, the backward and each recompute policy's extra
    /// forward, at the EP member's shape (E/e experts on e times the rows each: Megatron-LM's
    /// GroupedMLP runs a rank's local experts on the tokens all-to-all'd to it). The layer's
    /// times at e are its own less the experts' at 1 plus theirs at e ([`Layer::at_ep`]); only
    /// the differences count, so the times may be from any common base (the search gives the
    /// changes from e = 1, 0 there, of either sign).
    #[serde(default)]
    pub expert_gemm_s: Vec<ExpertGemms>,
}

/// A layer's expert GEMMs at one EP degree ([`Layer::expert_gemm_s`]).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpertGemms {
    /// The EP degree (divides the layer's experts).
    pub e: u64,
    /// Their time in the forward (s).
    pub fwd_s: f64,
    /// Their time in the backward (s).
    pub bwd_s: f64,
    /// Their time in each recompute policy's extra forward (none, selective, full) (s).
    pub recompute_s: [f64; 3],
}

impl Layer {
    /// The layer as a member of an EP group of `e` runs it: its forward, backward and
    /// recompute times with the expert GEMMs' at e in place of theirs at 1
    /// (`time − expert(1) + expert(e)`, at least 0); itself when it has no entry for e (or
    /// e = 1, where the difference is 0).
    pub fn at_ep(&self, e: u64) -> Layer {
        let (Some(one), Some(at)) = (self.expert_gemms(1), self.expert_gemms(e)) else {
            return self.clone();
        };
        if e == 1 {
            return self.clone();
        }
        let moved = |time: f64, base: f64, now: f64| (time + (now - base)).max(0.0);
        let mut l = self.clone();
        l.fwd_s = moved(self.fwd_s, one.fwd_s, at.fwd_s);
        l.bwd_s = moved(self.bwd_s, one.bwd_s, at.bwd_s);
        for r in 0..3 {
            l.recompute_s[r] = moved(self.recompute_s[r], one.recompute_s[r], at.recompute_s[r]);
        }
        l
    }

    /// The entry of [`Layer::expert_gemm_s`] for EP degree `e`, if any.
    pub fn expert_gemms(&self, e: u64) -> Option<&ExpertGemms> {
        self.expert_gemm_s.iter().find(|x| x.e == e)
    }

    /// The bytes a ZeRO parameter all-gather of this layer moves ([`Layer::param_gather_bytes`]).
    #[inline]
    pub fn gathered_bytes(&self) -> u64 {
        if self.param_gather_bytes == 0 {
            self.param_bytes
        } else {
            self.param_gather_bytes
        }
    }
}

/// How a protocol moves an all-reduce (docs/design.md §5.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Algorithm {
    /// A ring: `2(g−1)/g · bytes` leave each device in `2(g−1)` steps.
    #[default]
    Ring,
    /// NVLink SHARP: each device sends its `bytes` into the NVSwitch, which reduces them and
    /// multicasts the sum back, in two passes whatever `g`; all-reduces only.
    Nvls,
}

/// One protocol of the innermost level's collectives (NCCL's LL128 or Simple, say): an
/// all-reduce costs the least over the level's protocols of `base_s + 2(g−1)·latency_s +
/// 2(g−1)/g · bytes / bandwidth_bps [+ bytes/g / shard_bps]` for a ring, `base_s +
/// 2·latency_s + bytes / bandwidth_bps [+ bytes/g / shard_bps]` for NVLS (see
/// [`Problem::ring_allreduce_s`]); reduce-scatters and all-gathers the ring protocols' halves.
#[derive(Clone, Debug, PartialEq, Default, Deserialize)]
#[serde(from = "input::NamedProtocol")]
pub struct Protocol {
    /// Per-device, per-direction bandwidth (bytes/s): the ring's, or NVLS's algorithm bandwidth;
    /// `bandwidth_Bps` in the Python dicts.
    pub bandwidth_bps: f64,
    /// Per ring step, or per switch pass with NVLS (s).
    pub latency_s: f64,
    /// Per collective, whatever its size (s); 0 by default.
    pub base_s: f64,
    /// The pass over a device's own `bytes/g` that does not overlap the ring (bytes/s), if any;
    /// `shard_Bps` in the Python dicts.
    pub shard_bps: Option<f64>,
    /// A ring (by default), or NVLink SHARP (all-reduces only).
    pub algorithm: Algorithm,
}

/// How a level's devices are connected (docs/design.md §5.5).
#[derive(Clone, Debug, PartialEq, Default)]
pub enum Topology {
    /// Every device one hop from every other (a switched NVLink domain; a rail-optimised pod
    /// above one): the rail-aware rings of [`Problem::ring_bandwidth_bps`].
    #[default]
    Switch,
    /// A 2-D or 3-D torus with wraparound links, the first dimension fastest in device order:
    /// in devices, or on a torus level above a torus level in inner tori. `bandwidth_bps` is
    /// one link's, per direction.
    Torus(Vec<u64>),
    /// A switch level whose leaves hold `leaf_size` devices: a ring that leaves its leaf runs
    /// at `1 / oversubscription` of the rate.
    FatTree {
        /// Devices under one leaf switch.
        leaf_size: u64,
        /// A leaf's down-link over its up-link bandwidth (>= 1).
        oversubscription: f64,
    },
}

/// What a ring's cost depends on besides the bytes, the group and the level
/// ([`Problem::ring_key`]): its bandwidth's bits, its steps, and the tree's chain and depth
/// on a level with `tree` ((0, 0) without).
pub type RingKey = (u64, u64, u64, u64);

/// One level of the cluster network (a node's fabric, the scale-out network, ...).
#[derive(Clone, Debug, PartialEq, Default, Deserialize)]
#[serde(from = "input::Level")]
pub struct NetLevel {
    /// Devices that share this level (e.g. 8 per node); the last level is the whole cluster.
    pub group_size: u64,
    /// Per-link bandwidth (bytes/s); `bandwidth_Bps` in the Python dicts.
    pub bandwidth_bps: f64,
    /// Per-message latency (s).
    pub latency_s: f64,
    /// The most one group of the level below sends into this level at once, all its devices
    /// together (bytes/s; a node's NICs together); `None`: no cap beyond the links'.
    /// `uplink_Bps` in the Python dicts.
    pub uplink_bps: Option<f64>,
    /// How the level's devices are connected; [`Topology::Switch`] by default.
    pub topology: Topology,
    /// The ring collectives' protocols (innermost level only); empty: `bandwidth_bps` and
    /// `latency_s` price them.
    pub protocols: Vec<Protocol>,
    /// Whether an all-reduce on this level (above the innermost, not a torus) may also run as
    /// NCCL's tree, at the less of ring and tree ([`Problem::tree_allreduce_s`]); false by
    /// default: rings only.
    pub tree: bool,
    /// The fraction of a device's compute a collective on this level takes while it runs
    /// (NCCL's channels, one SM each, over the SMs); 0: overlap is free. An overlapped
    /// collective of X seconds beside C seconds of compute ends the two at
    /// max(X, C + share·min(X, C)).
    pub collective_compute_share: f64,
}

/// A placement problem: the priced layers, the cluster and the training setup.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Problem {
    /// Layers in topological order (prologue, blocks, head).
    pub layers: Vec<Layer>,
    /// Devices in the cluster (N).
    pub devices: u64,
    /// HBM capacity of one device (bytes).
    #[serde(deserialize_with = "input::bytes")]
    pub hbm_bytes: u64,
    /// Network levels, innermost first; a flat network is one level.
    pub levels: Vec<NetLevel>,
    /// Global batch B (samples per optimizer step).
    pub global_batch: u64,
    /// Micro-batch size b (samples).
    pub micro_batch: u64,
    /// TP width t: devices per pipeline stage.
    pub tp: u64,
    /// Context-parallel degree c: each sequence's tokens split over c devices (Megatron-LM's
    /// `--context-parallel-size`, torchtitan's `context_parallel_degree`), whose attention
    /// exchanges keys and values around a ring (priced in the layers' times, for one device of
    /// c). A stage replica is t·c devices, numbered TP innermost, then CP (`tp-cp-dp-pp`); the
    /// gradients are shared by the d·c devices of the DP×CP group, t apart, over which ZeRO
    /// shards too. The micro-batches per replica are still B / (b·d). 1: no CP.
    #[serde(default = "one")]
    pub cp: u64,
    /// Whether the DP gradient all-reduce overlaps the stage's last backward.
    pub dp_overlap: bool,
    /// Upper bound on the number of pipeline stages, if any.
    #[serde(default)]
    pub max_stages: Option<usize>,
    /// The recompute policy of every stage, as a user fixes it (`--recompute full`), or `None`
    /// to let the search choose the best policy per stage (`"auto"`). A fixed policy is the
    /// only one the search, the memory check and the infeasibility report consider.
    #[serde(default, deserialize_with = "input::recompute")]
    pub recompute: Option<Recompute>,
    /// The ZeRO stage of the plan as a user fixes it (`--zero 1`), or `None` to let the search
    /// choose (`"auto"`).
    #[serde(default, deserialize_with = "input::zero")]
    pub zero: Option<Zero>,
    /// Model chunks per pipeline device as a user fixes them: `Some(1)` is plain 1F1B,
    /// `Some(v)` with v >= 2 Megatron's interleaved 1F1B with v chunks; `None` lets the search
    /// choose among 1 and every v the layer count allows (`"auto"`).
    #[serde(default)]
    pub virtual_stages: Option<u64>,
    /// The repeated blocks, as (first layer, count); the layers before them (embeddings) go to
    /// the first model chunk and those after (head) to the last one under interleaving, which
    /// splits the blocks evenly over the p·v chunks, or as Megatron-LM does when they do not
    /// divide: the embedding and the loss counted as one block each. `None`: every layer is a
    /// block.
    #[serde(default)]
    pub blocks: Option<(usize, usize)>,
    /// The expert-parallel degree e as a user fixes it (`Some(1)`: every replica holds every
    /// expert), or `None` to let the search choose among the e that divide both d and the
    /// experts (`"auto"`). The EP group is e consecutive DP replicas (Megatron-LM carves it out
    /// of the data-parallel group); under context parallelism the replicas at one CP rank, t·c
    /// devices apart (Megatron-core 0.9's rank order `tp-cp-ep-dp-pp`, which requires e to
    /// divide d, not d·c: `megatron/core/parallel_state.py`, `initialize_model_parallel`).
    #[serde(default)]
    pub expert_parallel: Option<u64>,
    /// Expert tensor parallelism k (Megatron-core's `--expert-tensor-parallel-size`, "MoE
    /// parallel folding"; `None`: the TP width t, the layout above). Below t the experts get
    /// their own mesh over a stage's t·c·d devices, ETP k innermost, then EP e, then the expert
    /// data parallelism t·c·d/(k·e) (Megatron-core 0.10's expert `RankGenerator`, `cp=1`, order
    /// `tp-ep-dp-pp`: `megatron/core/parallel_state.py`, tag `core_r0.10.0`, `7ee599a2`): the
    /// EP group is e devices k apart, so it may be wider than d, and a device holds 1/(k·e) of
    /// the experts, t/(k·e) of what the layers' expert bytes (traced at t) say. k divides t.
    #[serde(default)]
    pub expert_tensor_parallel: Option<u64>,
    /// How devices are numbered into groups ([`RankOrder`]) as a user fixes it, or `None` to
    /// let the search choose per option (`"auto"`).
    #[serde(default, deserialize_with = "input::rank_order")]
    pub rank_order: Option<RankOrder>,
    /// Whether a pipeline transfer is split over the TP group: each of the t ranks sends 1/t of
    /// the boundary bytes and the receiving TP group all-gathers them (DeepSpeed's pipeline
    /// engine, `pipe_partitioned`; Megatron-LM's scatter-gather before sequence parallelism),
    /// instead of every rank sending them whole (Megatron-LM today). Meaningless at t = 1.
    #[serde(default)]
    pub pipeline_split: bool,
    /// Whether the runtime allocates a layer's gradients during its backward and frees them all
    /// after the optimizer step (PyTorch's `zero_grad(set_to_none=True)`, eager and compiled
    /// training loops), instead of holding them in a buffer for the whole run (Megatron-LM's
    /// and DeepSpeed's gradient buffers). With one micro-batch per step (m = 1), gradients
    /// unsharded (ZeRO below 2) and every replica holding every expert, a stage then holds
    /// only the gradients of the layers whose backward has run next to the activations of
    /// those whose backward has not: its peak is max over its layers k of
    /// Σ_{i..k} saved + Σ_{k..j} grad, not the two sums added ([`crate::MemoryParts::grads`]).
    #[serde(default)]
    pub grads_freed: bool,
    /// Bytes the DP gradient collectives (ZeRO-0/1's all-reduce, ZeRO-2/3's reduce-scatter)
    /// move per byte of `grad_bytes`: the wire dtype over the gradients' own, 2.0 when bf16
    /// gradients are reduced in fp32 (FSDP2's `MixedPrecisionPolicy(reduce_dtype=float32)`,
    /// Megatron-LM's `--bf16` without `--grad-reduce-in-bf16`); 1.0 by default.
    #[serde(default = "unit")]
    pub grad_reduce_scale: f64,
    /// HSDP (torch's `fully_shard` on a 2-D DeviceMesh, torchtitan's
    /// `data_parallel_shard_degree`): ZeRO-2/3 shards the parameters, gradients and optimizer
    /// state over groups of this many consecutive members of the DP×CP group (`dp_stride`
    /// apart) instead of over all of it, and the g / `dp_shard` groups are replicas whose
    /// sharded gradients each layer's backward all-reduces across (torch 2.15
    /// `_fully_shard/_fsdp_collectives.py` `foreach_reduce`: the reduce-scatter over the shard
    /// group, then `dist.all_reduce` over the replicate group on its own `all_reduce_stream`,
    /// every micro-batch while `all_reduce_grads` holds, its default). `None`: ZeRO shards
    /// over the whole group (FSDP, `data_parallel_shard_degree` = the DP degree).
    #[serde(default)]
    pub dp_shard: Option<u64>,
    /// FSDP's own kernels beside the graph's under ZeRO-3 (docs/design.md §6.5, "FSDP's
    /// copies"): the casts and copies into and out of its flat all-gather and reduce-scatter
    /// buffers that each micro-batch runs, priced by their bytes at the chip's memory-bound
    /// rate. `None`: not priced (the copies cost nothing).
    #[serde(default)]
    pub fsdp_copies: Option<FsdpCopies>,
}

/// Which FSDP runs a ZeRO-3 plan: its copies differ ([`FsdpCopies`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FsdpImplementation {
    /// torch's `FullyShardedDataParallel` with `use_orig_params=False` (FSDP1, fms-fsdp's):
    /// each layer's parameters are views of one flat parameter gathered in place.
    Fsdp1,
    /// torch's `fully_shard` (FSDP2, torchtitan's): per-parameter shards gathered into a flat
    /// buffer and copied out of it.
    Fsdp2,
}

/// What FSDP's copies cost: the chip's memory-bound rate, the implementation that runs them,
/// and the bytes of its sharded master weights per byte of `param_bytes`.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FsdpCopies {
    /// The rate a memory-bound kernel moves bytes at (bytes read plus written per second): the
    /// HBM bandwidth times the chip's memory efficiency, as the graph's elementwise ops are
    /// priced; `bandwidth_Bps` in the Python dicts.
    #[serde(rename = "bandwidth_Bps")]
    pub bandwidth_bps: f64,
    /// FSDP1 or FSDP2.
    pub implementation: FsdpImplementation,
    /// Bytes of the fp32 sharded parameter FSDP keeps per byte of `param_bytes` (2 with bf16
    /// parameters, 1 when the parameters are fp32): what its cast to the parameters' dtype
    /// before each all-gather reads.
    pub master_scale: f64,
}

fn one() -> u64 {
    1
}

fn unit() -> f64 {
    1.0
}

/// A problem that cannot even be posed (NaN times, zero devices, no layers, ...).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InputError {
    /// What is wrong, naming the field (e.g. `layers[3].fwd_s must be finite and >= 0, got NaN`).
    pub message: String,
}

impl std::fmt::Display for InputError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for InputError {}

fn err(message: String) -> Result<(), InputError> {
    Err(InputError { message })
}

fn check_time(name: &str, v: f64) -> Result<(), InputError> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        err(format!("{name} must be finite and >= 0, got {v}"))
    }
}

impl Problem {
    /// Checks that the problem is well posed. Infeasibility (nothing fits) is *not* an input
    /// error: it is an answer of the search. This only rejects data the formulas cannot use.
    pub fn validate(&self) -> Result<(), InputError> {
        if self.layers.is_empty() {
            return err("layers must not be empty".into());
        }
        if !(self.grad_reduce_scale.is_finite() && self.grad_reduce_scale > 0.0) {
            return err(format!(
                "grad_reduce_scale must be finite and > 0, got {}",
                self.grad_reduce_scale
            ));
        }
        for (i, l) in self.layers.iter().enumerate() {
            check_time(&format!("layers[{i}].fwd_s"), l.fwd_s)?;
            check_time(&format!("layers[{i}].bwd_s"), l.bwd_s)?;
            // A time and its experts' part: the optimizer step, the FP8 weight casts.
            for (name, whole, part) in [
                ("opt_s", l.opt_s, l.expert_opt_s),
                ("cast_s", l.cast_s, l.expert_cast_s),
            ] {
                check_time(&format!("layers[{i}].{name}"), whole)?;
                check_time(&format!("layers[{i}].expert_{name}"), part)?;
                if part > whole {
                    return err(format!(
                        "layers[{i}]: expert_{name} ({part}) must be part of {name} ({whole})"
                    ));
                }
            }
            for (r, v) in l.recompute_s.iter().enumerate() {
                check_time(&format!("layers[{i}].recompute_s[{r}]"), *v)?;
            }
            for (k, x) in l.expert_gemm_s.iter().enumerate() {
                let at = format!("layers[{i}].expert_gemm_s[{k}]");
                if x.e == 0 || l.experts == 0 || !l.experts.is_multiple_of(x.e) {
                    return err(format!(
                        "{at}.e = {}: expected an EP degree that divides the layer's {} experts",
                        x.e, l.experts
                    ));
                }
                if l.expert_gemm_s[..k].iter().any(|y| y.e == x.e) {
                    return err(format!("{at}.e = {}: a second entry for it", x.e));
                }
                // Times from a common base (e = 1's own, or 0 there: the changes), of any sign.
                let finite = [x.fwd_s, x.bwd_s]
                    .iter()
                    .chain(x.recompute_s.iter())
                    .all(|v| v.is_finite());
                if !finite {
                    return err(format!("{at}: its times must be finite, got {x:?}"));
                }
            }
            if !l.expert_gemm_s.is_empty() && l.expert_gemms(1).is_none() {
                return err(format!(
                    "layers[{i}].expert_gemm_s: no entry for e = 1 (the traced shape's, which \
                     the layer's times include)"
                ));
            }
        }
        if self.levels.is_empty() {
            return err("levels must not be empty (a flat network is one level)".into());
        }
        for (i, lv) in self.levels.iter().enumerate() {
            if lv.group_size == 0 {
                return err(format!("levels[{i}].group_size must be >= 1"));
            }
            if !(lv.bandwidth_bps.is_finite() && lv.bandwidth_bps > 0.0) {
                return err(format!(
                    "levels[{i}].bandwidth_Bps must be finite and > 0, got {}",
                    lv.bandwidth_bps
                ));
            }
            check_time(&format!("levels[{i}].latency_s"), lv.latency_s)?;
            self.validate_topology(i)?;
        }
        for (name, v) in [
            ("devices", self.devices),
            ("global_batch", self.global_batch),
            ("micro_batch", self.micro_batch),
            ("tp", self.tp),
            ("cp", self.cp),
        ] {
            if v == 0 {
                return err(format!("{name} must be >= 1"));
            }
        }
        if self.cp > 1 && self.rank_order == Some(RankOrder::TpPpDp) {
            return err(format!(
                "rank_order tp-pp-dp with cp = {}: context parallelism is numbered tp-cp-dp-pp",
                self.cp
            ));
        }
        if self.max_stages == Some(0) {
            return err("max_stages must be >= 1 when given".into());
        }
        if self.virtual_stages == Some(0) {
            return err("virtual_stages must be >= 1 when given".into());
        }
        if let Some(e) = self.expert_parallel {
            let experts = self.experts();
            if e == 0 {
                return err("expert_parallel must be >= 1 when given".into());
            }
            if e > 1 && experts == 0 {
                return err(format!(
                    "expert_parallel = {e}: the model has no experts (no MoE layer)"
                ));
            }
            if e > 1 && !experts.is_multiple_of(e) {
                return err(format!(
                    "expert_parallel = {e} must divide the {experts} experts"
                ));
            }
        }
        if let Some(k) = self.expert_tensor_parallel {
            if k == 0 || !self.tp.is_multiple_of(k) {
                return err(format!(
                    "expert_tensor_parallel = {k} must divide the TP width {}",
                    self.tp
                ));
            }
            if k != self.tp && self.experts() == 0 {
                return err(format!(
                    "expert_tensor_parallel = {k}: the model has no experts (no MoE layer)"
                ));
            }
            if k != self.tp && self.rank_order == Some(RankOrder::TpPpDp) {
                return err(format!(
                    "expert_tensor_parallel = {k} with rank_order tp-pp-dp: the expert mesh is \
                     numbered tp-ep-dp-pp (Megatron-LM refuses EP under tp-pp-dp mapping)"
                ));
            }
            if k != self.tp && self.dp_shard.is_some() {
                return err(format!(
                    "expert_tensor_parallel = {k} with dp_shard: experts are not folded over an HSDP run"
                ));
            }
        }
        for (i, l) in self.layers.iter().enumerate() {
            if l.expert_param_bytes > l.param_bytes
                || l.expert_grad_bytes > l.grad_bytes
                || l.expert_optimizer_bytes > l.optimizer_bytes
            {
                return err(format!(
                    "layers[{i}]: the experts' bytes must be part of the layer's (expert_param_bytes <= param_bytes, ...)"
                ));
            }
            if l.param_gather_bytes > l.param_bytes {
                return err(format!(
                    "layers[{i}]: param_gather_bytes = {} must be at most param_bytes = {}",
                    l.param_gather_bytes, l.param_bytes
                ));
            }
        }
        if let Some(c) = &self.fsdp_copies {
            let rates = [
                ("bandwidth_Bps", c.bandwidth_bps),
                ("master_scale", c.master_scale),
            ];
            for (name, v) in rates {
                if !(v.is_finite() && v > 0.0) {
                    return err(format!(
                        "fsdp_copies.{name} must be finite and > 0, got {v}"
                    ));
                }
            }
        }
        if let Some(s) = self.dp_shard {
            if s == 0 {
                return err("dp_shard must be >= 1 when given".into());
            }
            if !matches!(self.zero, Some(Zero::Gradients | Zero::Parameters)) {
                return err(format!(
                    "dp_shard = {s}: HSDP shards as FSDP does, so zero must be fixed at 2 or 3"
                ));
            }
            if self.expert_parallel.is_some_and(|e| e > 1) {
                return err(format!(
                    "dp_shard = {s} with expert_parallel > 1: experts are not split over an HSDP run"
                ));
            }
        }
        if let Some((first, count)) = self.blocks {
            if count == 0 || first.saturating_add(count) > self.layers.len() {
                return err(format!(
                    "blocks ({first}, {count}) must be a non-empty range of the {} layers",
                    self.layers.len()
                ));
            }
        }
        Ok(())
    }

    /// A level's topology and protocols (as `phaze_ir/hardware.py` checks them).
    fn validate_topology(&self, i: usize) -> Result<(), InputError> {
        let lv = &self.levels[i];
        if !lv.protocols.is_empty() && (i > 0 || lv.topology != Topology::Switch) {
            return err(format!(
                "levels[{i}].protocols: only the innermost level, a switch, has protocols"
            ));
        }
        for (j, p) in lv.protocols.iter().enumerate() {
            let shard_ok = p.shard_bps.is_none_or(|x| x.is_finite() && x > 0.0);
            if !(p.bandwidth_bps.is_finite() && p.bandwidth_bps > 0.0 && shard_ok) {
                return err(format!(
                    "levels[{i}].protocols[{j}]: bandwidths must be finite and > 0"
                ));
            }
            check_time(
                &format!("levels[{i}].protocols[{j}].latency_s"),
                p.latency_s,
            )?;
            check_time(&format!("levels[{i}].protocols[{j}].base_s"), p.base_s)?;
        }
        let share = lv.collective_compute_share;
        if !(share.is_finite() && (0.0..=1.0).contains(&share)) {
            return err(format!(
                "levels[{i}].collective_compute_share: expected a fraction in [0, 1], got {share}"
            ));
        }
        if lv.tree && (i == 0 || matches!(lv.topology, Topology::Torus(_))) {
            return err(format!(
                "levels[{i}].tree: NCCL's tree only on a switch or fat-tree level above the innermost"
            ));
        }
        if !lv.protocols.is_empty() && lv.protocols.iter().all(|p| p.algorithm == Algorithm::Nvls) {
            return err(format!(
                "levels[{i}].protocols: at least one ring protocol (NVLS prices all-reduces only)"
            ));
        }
        match &lv.topology {
            Topology::Switch => Ok(()),
            Topology::FatTree {
                leaf_size,
                oversubscription,
            } => {
                if !(oversubscription.is_finite() && *oversubscription >= 1.0) {
                    return err(format!("levels[{i}].oversubscription must be >= 1"));
                }
                if *leaf_size == 0 || !lv.group_size.is_multiple_of(*leaf_size) {
                    return err(format!(
                        "levels[{i}].leaf_size must divide group_size = {}",
                        lv.group_size
                    ));
                }
                Ok(())
            }
            Topology::Torus(dims) => {
                if lv.uplink_bps.is_some() {
                    return err(format!(
                        "levels[{i}].uplink_Bps: a torus has no uplink (its chips' own links carry every transfer)"
                    ));
                }
                if !(2..=3).contains(&dims.len()) || dims.contains(&0) {
                    return err(format!(
                        "levels[{i}].torus_dims must be 2 or 3 positive integers"
                    ));
                }
                let mut product: u64 = dims.iter().product();
                if i > 0 {
                    match &self.levels[i - 1].topology {
                        Topology::Torus(inner) if inner.len() == dims.len() => {
                            product = product.saturating_mul(self.levels[i - 1].group_size);
                        }
                        _ => {
                            return err(format!(
                                "levels[{i}]: a torus only as the innermost level or on a torus level of as many dimensions"
                            ));
                        }
                    }
                }
                if product != lv.group_size {
                    return err(format!(
                        "levels[{i}].torus_dims: their product must make group_size = {}",
                        lv.group_size
                    ));
                }
                Ok(())
            }
        }
    }

    /// The indices of the policies a stage may use: all three, or the fixed one.
    pub fn policies(&self) -> &'static [usize] {
        match self.recompute {
            None => &[0, 1, 2],
            Some(Recompute::None) => &[0],
            Some(Recompute::Selective) => &[1],
            Some(Recompute::Full) => &[2],
        }
    }

    /// The ZeRO stages the search may use: all four, or the fixed one.
    pub fn zero_stages(&self) -> &'static [Zero] {
        match self.zero {
            None => &Zero::ALL,
            Some(Zero::Off) => &Zero::ALL[0..1],
            Some(Zero::Optimizer) => &Zero::ALL[1..2],
            Some(Zero::Gradients) => &Zero::ALL[2..3],
            Some(Zero::Parameters) => &Zero::ALL[3..4],
        }
    }

    /// The rank orders the search may use: both, or the fixed one; under context parallelism
    /// `tp-dp-pp` alone (CP between TP and DP, as Megatron-LM and torchtitan number it).
    pub fn rank_orders(&self) -> &'static [RankOrder] {
        if self.cp > 1 || self.experts_folded() {
            return &RankOrder::ALL[0..1];
        }
        match self.rank_order {
            None => &RankOrder::ALL,
            Some(RankOrder::TpDpPp) => &RankOrder::ALL[0..1],
            Some(RankOrder::TpPpDp) => &RankOrder::ALL[1..2],
        }
    }

    /// The experts of the model's MoE layers (the most of any layer); 0 for a dense model.
    pub fn experts(&self) -> u64 {
        self.layers.iter().map(|l| l.experts).max().unwrap_or(0)
    }

    /// The expert tensor-parallel width k ([`Problem::expert_tensor_parallel`], t by default).
    pub fn expert_tp(&self) -> u64 {
        self.expert_tensor_parallel.unwrap_or(self.tp)
    }

    /// Whether the experts have their own mesh (k below t, [`Problem::expert_tensor_parallel`]).
    pub fn experts_folded(&self) -> bool {
        self.expert_tp() != self.tp
    }

    /// The devices an EP degree must divide at DP degree d: d (the EP group is e of the d
    /// replicas; under context parallelism e divides d too, not d·c: e replicas at one CP
    /// rank), or with the experts folded the t·c·d/k ETP groups of a stage.
    pub fn expert_parallel_room(&self, d: u64) -> u64 {
        if self.experts_folded() {
            self.tp * self.cp * d / self.expert_tp()
        } else {
            d
        }
    }

    /// The expert-parallel degrees the search may use at DP degree d: the fixed one where it
    /// divides [`Problem::expert_parallel_room`], or every e that divides both it and the
    /// experts (1 for a dense model).
    pub fn expert_parallel_degrees(&self, d: u64) -> Vec<u64> {
        let room = self.expert_parallel_room(d);
        match self.expert_parallel {
            Some(e) => {
                if room.is_multiple_of(e) {
                    vec![e]
                } else {
                    Vec::new()
                }
            }
            None => {
                let experts = self.experts().max(1);
                (1..=room.min(experts))
                    .filter(|&e| room.is_multiple_of(e) && experts.is_multiple_of(e))
                    .collect()
            }
        }
    }

    /// The blocks as (first layer, count): [`Problem::blocks`], or every layer.
    pub fn block_range(&self) -> (usize, usize) {
        self.blocks.unwrap_or((0, self.layers.len()))
    }

    /// Index of the network level that a group of `g` contiguously placed devices uses: the
    /// innermost level whose `group_size >= g`, else the last (outermost) level. A group whose
    /// members lie a stride `s` apart is asked with its span, `g · s` (the DP: `d · p · t`).
    pub fn level_for(&self, g: u64) -> usize {
        self.levels
            .iter()
            .position(|lv| lv.group_size >= g)
            .unwrap_or(self.levels.len() - 1)
    }

    /// Per-device bandwidth (bytes/s) of a ring over a group of `g` devices on `level`, whose
    /// consecutive members lie `stride` devices apart (contiguous: 1; `stride >= 1`).
    ///
    /// Rail-aware: at a level `i > 0`, a group with `k = per_inner(g, stride,
    /// levels[i−1].group_size)` members inside each group of the level below drives `k` of
    /// that group's links to level `i` at once (NCCL runs one ring per channel, the channels
    /// over different NICs: one NIC per GPU on DGX A100 / H100), so the ring's bandwidth is
    /// `min(k · bw_i, bw_{i−1})`, capped by the inner level's own bandwidth. At level 0, or
    /// with `k = 1`, it is `bw_i` itself. A level with an uplink (what one inner group, a
    /// node, sends into it at once: its NICs together) caps either by the group's share of
    /// it, `uplink_i · k / inner`: the groups of one kind (a placement's DP groups, its EP
    /// groups) run at once and cover every device, so the `inner / k` of them with members in
    /// one node share its uplink evenly (contention). Rail links are not shared (one NIC per
    /// device; `k` of them per group).
    ///
    /// On a torus level it is `L · bw` with the links `L` of [`Problem::torus_rings`]; on a
    /// fat tree a ring whose span `g · stride` exceeds a leaf is divided by the
    /// oversubscription.
    pub fn ring_bandwidth_bps(&self, g: u64, level: usize, stride: u64) -> f64 {
        let lv = &self.levels[level];
        if let Topology::Torus(_) = lv.topology {
            let (_, _, links) = self.torus_rings(g, level, stride);
            return links.iter().sum::<u64>().max(1) as f64 * lv.bandwidth_bps;
        }
        let bw = if level == 0 {
            lv.bandwidth_bps
        } else {
            let below = &self.levels[level - 1];
            let k = per_inner(g, stride, below.group_size);
            let bw = if k <= 1 {
                lv.bandwidth_bps
            } else {
                (k as f64 * lv.bandwidth_bps).min(below.bandwidth_bps)
            };
            lv.uplink_bps
                .map_or(bw, |up| bw.min(up * k as f64 / below.group_size as f64))
        };
        match lv.topology {
            Topology::FatTree {
                leaf_size,
                oversubscription,
            } if g.saturating_mul(stride) > leaf_size => bw / oversubscription,
            _ => bw,
        }
    }

    /// (ring length per axis, axes, links per axis) of a group of `g` devices, consecutive members
    /// `stride` apart, on the torus `level` (as `torus_rings` in
    /// `passes/algorithms/network.py`). The device order runs a mixed radix, fastest first:
    /// the level's dimensions, or on a torus above a torus the inner torus's dimensions then
    /// the level's own. The stride skips whole digits (or part of one); the group takes
    /// `min(rest, radix / pos)` along each digit after it, the rest rounded up. An axis's ring
    /// is closed when it fills the inner torus's axis or the level's own; an axis has 2 links
    /// per device for a closed ring longer than 2 and 1 for an open one or a pair (their sum
    /// is the all-reduce's `L`). Not a torus: no rings.
    pub fn torus_rings(&self, g: u64, level: usize, stride: u64) -> ([u64; 3], usize, [u64; 3]) {
        let Topology::Torus(dims) = &self.levels[level].topology else {
            return ([1; 3], 0, [0; 3]);
        };
        let axes = dims.len();
        let inner: &[u64] = match level.checked_sub(1).map(|i| &self.levels[i].topology) {
            Some(Topology::Torus(inner)) => inner,
            _ => &[],
        };
        let mut radices = [1u64; 6];
        let n = inner.len() + axes;
        radices[..inner.len()].copy_from_slice(inner);
        radices[inner.len()..n].copy_from_slice(dims);
        let mut counts = [1u64; 6];
        let mut pos = stride;
        let mut rest = g;
        for i in 0..n {
            if rest <= 1 {
                break;
            }
            let radix = radices[i];
            if pos >= radix {
                pos /= radix;
                continue;
            }
            let take = rest.min(radix / pos);
            counts[i] = take;
            rest = rest.div_ceil(take);
            pos = 1;
        }
        if rest > 1 {
            counts[n - 1] *= rest;
        }
        let mut lengths = [1u64; 3];
        let mut links = [0u64; 3];
        for j in 0..axes {
            let (c, closed) = if inner.is_empty() {
                (counts[j], counts[j] == dims[j])
            } else {
                (
                    counts[j] * counts[axes + j],
                    counts[j] == inner[j] || counts[axes + j] == dims[j],
                )
            };
            lengths[j] = c;
            if c > 1 {
                links[j] = if closed && c > 2 { 2 } else { 1 };
            }
        }
        (lengths, axes, links)
    }

    /// Steps of one half of a ring collective over `g` devices on `level`: `g − 1`, or
    /// `Σ_j (c_j − 1)` over a torus's rings (as `ring_steps` in Python).
    pub fn ring_steps(&self, g: u64, level: usize, stride: u64) -> u64 {
        if let Topology::Torus(_) = self.levels[level].topology {
            let (lengths, axes, _) = self.torus_rings(g, level, stride);
            return lengths[..axes].iter().map(|c| c - 1).sum();
        }
        g.saturating_sub(1)
    }

    /// What a DP ring's cost depends on besides the bytes, the group and the level: its
    /// bandwidth's bits, its steps and, on a level with `tree`, the tree's chain and depth
    /// ([`Problem::tree_steps`]; (0, 0) without: nothing changes there). The search's classes
    /// of p: two strides with the same ring bandwidth and steps may span a different number of
    /// inner groups, so a different tree.
    pub fn ring_key(&self, g: u64, level: usize, stride: u64) -> RingKey {
        let (chain, depth) = if level > 0 && self.levels[level].tree {
            self.tree_steps(g, level, stride)
        } else {
            (0, 0)
        };
        (
            self.ring_bandwidth_bps(g, level, stride).to_bits(),
            self.ring_steps(g, level, stride),
            chain,
            depth,
        )
    }

    /// (steps of the chain inside an inner group, depth of the tree across them) of NCCL's
    /// tree all-reduce over `g` devices, consecutive members `stride` apart, on `level > 0`
    /// (as `tree_steps` in Python): `k − 1` with `k = per_inner(g, stride, inner)` members per
    /// group of the level below, and `⌈log2 m⌉` over the `m = ⌈g / k⌉` inner groups spanned.
    pub fn tree_steps(&self, g: u64, level: usize, stride: u64) -> (u64, u64) {
        let k = per_inner(g, stride, self.levels[level - 1].group_size);
        let m = g.div_ceil(k);
        // ⌈log2 m⌉ in integers: the bit length of m − 1 (0 for m = 1), as Python's bit_length.
        (k - 1, u64::from(u64::BITS - (m - 1).leading_zeros()))
    }

    /// NCCL's tree all-reduce of `bytes` over `g` devices on `level > 0` at the ring's
    /// bandwidth `bw`: `2 · bytes / bw + 2 · (k − 1) · lat_{level−1} + 2 · ⌈log2 m⌉ · lat_level`
    /// ([`Problem::tree_steps`]). NCCL's tuning model (`src/graph/tuning.cc`): the tree's
    /// algorithm bandwidth is half its bus bandwidth, its latency `2 · ((k−1) · intra +
    /// log2(nodes) · inter)`. The inner level's `latency_s` is taken even where protocols price
    /// its rings. Written as `tree_all_reduce_s` in Python, operation for operation.
    pub fn tree_allreduce_s(&self, bytes: f64, g: u64, level: usize, stride: u64, bw: f64) -> f64 {
        let (chain, depth) = self.tree_steps(g, level, stride);
        2.0 * bytes / bw
            + 2.0 * chain as f64 * self.levels[level - 1].latency_s
            + 2.0 * depth as f64 * self.levels[level].latency_s
    }

    /// Ring all-reduce of `bytes` over `g` devices on `level`, consecutive members `stride`
    /// apart: `2(g−1)/g · bytes / bw + 2 · steps · lat`, with `bw` =
    /// [`Problem::ring_bandwidth_bps`], `steps` = [`Problem::ring_steps`] (`g − 1` but on a
    /// torus) and `lat` the level's; on a level with protocols the least over them of `base +
    /// 2(g−1)·lat_p + 2(g−1)/g · bytes / bw_p [+ bytes/g / shard_p]` (a ring) or `base +
    /// 2·lat_p + bytes / bw_p [+ bytes/g / shard_p]` (NVLS); on a level with `tree` the less
    /// of the ring and [`Problem::tree_allreduce_s`]; 0 when `g <= 1`.
    pub fn ring_allreduce_s(&self, bytes: f64, g: u64, level: usize, stride: u64) -> f64 {
        if g <= 1 {
            return 0.0;
        }
        let lv = &self.levels[level];
        let gf = g as f64;
        if !lv.protocols.is_empty() {
            return lv.protocols.iter().fold(f64::INFINITY, |best, p| {
                let mut t = match p.algorithm {
                    Algorithm::Nvls => p.base_s + 2.0 * p.latency_s + bytes / p.bandwidth_bps,
                    Algorithm::Ring => {
                        p.base_s
                            + 2.0 * (gf - 1.0) * p.latency_s
                            + 2.0 * (gf - 1.0) / gf * bytes / p.bandwidth_bps
                    }
                };
                if let Some(shard) = p.shard_bps {
                    t += bytes / gf / shard;
                }
                best.min(t)
            });
        }
        let bw = self.ring_bandwidth_bps(g, level, stride);
        let steps = self.ring_steps(g, level, stride) as f64;
        let ring = 2.0 * (gf - 1.0) / gf * bytes / bw + 2.0 * steps * lv.latency_s;
        if level > 0 && lv.tree {
            return ring.min(self.tree_allreduce_s(bytes, g, level, stride, bw));
        }
        ring
    }

    /// Ring reduce-scatter (or all-gather: the same ring, the same cost) of `bytes` (the full,
    /// unsharded size) over `g` devices: `(g−1)/g · bytes / bw + steps · lat`, half a ring
    /// all-reduce (with protocols, each ring protocol's half); 0 when `g <= 1`. Same `bw` and
    /// steps as [`Problem::ring_allreduce_s`].
    pub fn ring_reduce_scatter_s(&self, bytes: f64, g: u64, level: usize, stride: u64) -> f64 {
        if g <= 1 {
            return 0.0;
        }
        let lv = &self.levels[level];
        let gf = g as f64;
        if !lv.protocols.is_empty() {
            let rings = lv
                .protocols
                .iter()
                .filter(|p| p.algorithm == Algorithm::Ring);
            return rings.fold(f64::INFINITY, |best, p| {
                let mut t =
                    p.base_s + (gf - 1.0) * p.latency_s + (gf - 1.0) / gf * bytes / p.bandwidth_bps;
                if let Some(shard) = p.shard_bps {
                    t += bytes / gf / shard;
                }
                best.min(t)
            });
        }
        let bw = self.ring_bandwidth_bps(g, level, stride);
        let steps = self.ring_steps(g, level, stride) as f64;
        (gf - 1.0) / gf * bytes / bw + steps * lv.latency_s
    }

    /// All-to-all of `bytes` per device over `g` devices on `level` (expert parallelism's
    /// dispatch or combine), consecutive members `stride` apart: each device keeps 1/g of its
    /// bytes and exchanges the rest with the g − 1 others, `(g−1)/g · bytes / bw + (g−1) ·
    /// lat` with the rail-aware `bw` ([`Problem::ring_bandwidth_bps`]), the same bytes and
    /// steps as a ring reduce-scatter; 0 when `g <= 1`. `count` such collectives (one per MoE
    /// layer, `bytes` their total) pay the latency `count` times.
    ///
    /// On a torus the bytes travel several hops ([`Problem::torus_all_to_all_time`]), so the
    /// byte term is the busiest axis's links, not the reduce-scatter's.
    pub fn all_to_all_s(&self, bytes: f64, count: u64, g: u64, level: usize, stride: u64) -> f64 {
        if g <= 1 || count == 0 {
            return 0.0;
        }
        let lv = &self.levels[level];
        let gf = g as f64;
        let latency = count as f64 * (gf - 1.0) * lv.latency_s;
        if let Topology::Torus(_) = lv.topology {
            return bytes * self.torus_all_to_all_time(g, level, stride) / lv.bandwidth_bps
                + latency;
        }
        let bw = self.ring_bandwidth_bps(g, level, stride);
        (gf - 1.0) / gf * bytes / bw + latency
    }

    /// Link time of a torus all-to-all, in units of `bytes / bw`: the busiest axis's
    /// `⌊c²/4⌋ / (c · links)`. Dimension-ordered routing sends a device's bytes for each of
    /// the c positions along an axis over the shortest path; on a closed ring of c the
    /// `Σ_x min(x, c − x) = ⌊c²/4⌋` hop-bytes per device spread evenly over its 2 links, on
    /// an open line (or a pair) the middle link carries `⌊c/2⌋ · ⌈c/2⌉ / c = ⌊c²/4⌋ / c` of
    /// them (the bisection bound). The axes run at once. A ring of c ≥ 3 takes `c / 8` or
    /// `c / 4` where the reduce-scatter takes `(c−1)/c / links`: slower by about the mean hop
    /// count.
    pub fn torus_all_to_all_time(&self, g: u64, level: usize, stride: u64) -> f64 {
        let (lengths, axes, links) = self.torus_rings(g, level, stride);
        (0..axes)
            .filter(|&j| lengths[j] > 1)
            .map(|j| {
                let c = lengths[j];
                (c * c / 4) as f64 / (c * links[j]) as f64
            })
            .fold(0.0, f64::max)
    }

    /// Per-device bandwidth of the pipeline's point-to-point transfers on `level`, neighbours
    /// `stride` devices apart: the level's own, and on a level with an uplink at most
    /// `uplink_i / senders`, where `senders = min(stride, inner)` devices of one inner group
    /// (a node) send across it at once (every pair of a stage boundary transfers at the same
    /// time in 1F1B's steady state: they share the node's uplink).
    pub fn p2p_bandwidth_bps(&self, level: usize, stride: u64) -> f64 {
        let lv = &self.levels[level];
        match (level.checked_sub(1), lv.uplink_bps) {
            (Some(below), Some(up)) => {
                let senders = stride.min(self.levels[below].group_size).max(1);
                lv.bandwidth_bps.min(up / senders as f64)
            }
            _ => lv.bandwidth_bps,
        }
    }

    /// Point-to-point transfer of `bytes` on `level` between pipeline neighbours `stride`
    /// devices apart: `lat + bytes / bw` with [`Problem::p2p_bandwidth_bps`].
    pub fn p2p_s(&self, bytes: f64, level: usize, stride: u64) -> f64 {
        self.levels[level].latency_s + bytes / self.p2p_bandwidth_bps(level, stride)
    }

    /// One pipeline transfer of a boundary of `bytes` (per rank, as the layer counts it) on
    /// `level`, neighbours `stride` apart: [`Problem::p2p_s`] of them whole, or, split over
    /// the TP group ([`Problem::pipeline_split`], t > 1), of 1/t of them plus the receiving TP
    /// group's all-gather of the whole (a ring on the level of t).
    pub fn pipeline_transfer_s(&self, bytes: f64, level: usize, stride: u64) -> f64 {
        let t = self.tp;
        if self.pipeline_split && t > 1 {
            self.p2p_s(bytes / t as f64, level, stride)
                + self.ring_reduce_scatter_s(bytes, t, self.level_for(t), 1)
        } else {
            self.p2p_s(bytes, level, stride)
        }
    }
}

/// Members of a group of `g` devices, consecutive members `stride` devices apart, that fall
/// inside one group of `inner` devices of the level below: `max(1, min(g, inner / stride))`
/// (integer division; 1 when `stride >= inner`). `stride` must be >= 1.
fn per_inner(g: u64, stride: u64, inner: u64) -> u64 {
    (inner / stride).min(g).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a100() -> Problem {
        let level = |group_size, bandwidth_bps, latency_s| NetLevel {
            group_size,
            bandwidth_bps,
            latency_s,
            ..NetLevel::default()
        };
        Problem {
            layers: vec![Layer::default()],
            devices: 32,
            hbm_bytes: 1 << 40,
            levels: vec![level(8, 216.5e9, 6.34e-6), level(4096, 25e9, 5e-6)],
            global_batch: 1,
            micro_batch: 1,
            tp: 1,
            cp: 1,
            dp_overlap: false,
            max_stages: None,
            recompute: None,
            zero: None,
            virtual_stages: None,
            expert_parallel: None,
            expert_tensor_parallel: None,
            blocks: None,
            rank_order: None,
            pipeline_split: false,
            grads_freed: false,
            grad_reduce_scale: 1.0,
            dp_shard: None,
            fsdp_copies: None,
        }
    }

    #[test]
    fn per_inner_counts_the_members_inside_one_inner_group() {
        assert_eq!(per_inner(16, 1, 8), 8);
        assert_eq!(per_inner(4, 1, 8), 4);
        assert_eq!(per_inner(4, 2, 8), 4);
        assert_eq!(per_inner(8, 2, 8), 4);
        assert_eq!(per_inner(8, 3, 8), 2);
        assert_eq!(per_inner(2, 8, 8), 1);
        assert_eq!(per_inner(2, 16, 8), 1);
        assert_eq!(per_inner(1, 1, 8), 1);
    }

    #[test]
    fn ring_bandwidth_on_the_a100_levels() {
        let prob = a100();
        // TP 16 over 2 nodes (contiguous): 8 NICs per node, min(8 · 25e9, 216.5e9) = 200e9.
        assert_eq!(prob.level_for(16), 1);
        assert_eq!(prob.ring_bandwidth_bps(16, 1, 1), 200e9);
        // A DP group of one GPU per node (t = 8): one NIC, 25e9.
        assert_eq!(prob.ring_bandwidth_bps(2, 1, 8), 25e9);
        assert_eq!(prob.ring_bandwidth_bps(4, 1, 16), 25e9);
        // Two per node: 50e9.
        assert_eq!(prob.ring_bandwidth_bps(8, 1, 4), 50e9);
        // A node uplink of 100e9 (4 NICs' worth) caps TP 16; DP groups share it: with t = 8
        // eight groups leave every node at once (12.5e9 each), with t = 4 four (25e9 each).
        let mut capped = a100();
        capped.levels[1].uplink_bps = Some(100e9);
        assert_eq!(capped.ring_bandwidth_bps(16, 1, 1), 100e9);
        assert_eq!(capped.ring_bandwidth_bps(2, 1, 8), 12.5e9);
        assert_eq!(capped.ring_bandwidth_bps(8, 1, 4), 25e9);
        // Pipeline transfers: all 8 GPUs of a node send across at once when neighbours are
        // 8 or more apart (12.5e9 each), 2 of them when they are 2 apart (its NIC, 25e9).
        assert_eq!(capped.p2p_bandwidth_bps(1, 8), 12.5e9);
        assert_eq!(capped.p2p_bandwidth_bps(1, 32), 12.5e9);
        assert_eq!(capped.p2p_bandwidth_bps(1, 2), 25e9);
        assert_eq!(prob.p2p_bandwidth_bps(1, 8), 25e9);
        assert_eq!(capped.p2p_bandwidth_bps(0, 8), 216.5e9);
        // Split over a TP group of 8: an eighth each, then the node's all-gather.
        capped.tp = 8;
        capped.pipeline_split = true;
        let n = 8e8;
        assert_eq!(
            capped.pipeline_transfer_s(n, 1, 64),
            (5e-6 + n / 8.0 / 12.5e9) + capped.ring_reduce_scatter_s(n, 8, 0, 1)
        );
        capped.pipeline_split = false;
        assert_eq!(capped.pipeline_transfer_s(n, 1, 64), 5e-6 + n / 12.5e9);
        // Level 0: its own bandwidth, whatever the stride.
        assert_eq!(prob.ring_bandwidth_bps(8, 0, 1), 216.5e9);
        assert_eq!(prob.ring_bandwidth_bps(2, 0, 4), 216.5e9);
        // The all-reduce uses it, and nothing changes on level 0.
        let n = 1e9;
        assert_eq!(
            prob.ring_allreduce_s(n, 16, 1, 1),
            2.0 * 15.0 / 16.0 * n / 200e9 + 2.0 * 15.0 * 5e-6
        );
        assert_eq!(
            prob.ring_allreduce_s(n, 8, 0, 1),
            2.0 * 7.0 / 8.0 * n / 216.5e9 + 2.0 * 7.0 * 6.34e-6
        );
        assert_eq!(prob.ring_allreduce_s(n, 1, 1, 1), 0.0);
    }

    #[test]
    fn the_cap_is_the_inner_levels_bandwidth() {
        let mut prob = a100();
        prob.levels[0].bandwidth_bps = 150e9;
        assert_eq!(prob.ring_bandwidth_bps(16, 1, 1), 150e9);
        assert_eq!(prob.ring_bandwidth_bps(8, 1, 2), 100e9);
        // k = 1 is the level's own bandwidth even when the inner level is slower.
        prob.levels[0].bandwidth_bps = 1e9;
        assert_eq!(prob.ring_bandwidth_bps(2, 1, 8), 25e9);
    }

    fn tpuv4_torus() -> Problem {
        let torus = |group_size, latency_s| NetLevel {
            group_size,
            bandwidth_bps: 50e9,
            latency_s,
            topology: Topology::Torus(vec![4, 4, 4]),
            ..NetLevel::default()
        };
        Problem {
            levels: vec![torus(64, 1e-6), torus(4096, 2e-6)],
            devices: 4096,
            ..a100()
        }
    }

    #[test]
    fn torus_rings_grow_with_the_dimensions_used() {
        let prob = tpuv4_torus();
        assert!(prob.validate().is_ok());
        // (g, stride) -> (lengths, links), as tests/test_network_topology.py checks in Python.
        assert_eq!(prob.torus_rings(2, 0, 1), ([2, 1, 1], 3, [1, 0, 0]));
        assert_eq!(prob.torus_rings(4, 0, 1), ([4, 1, 1], 3, [2, 0, 0]));
        assert_eq!(prob.torus_rings(64, 0, 1), ([4, 4, 4], 3, [2, 2, 2]));
        assert_eq!(prob.torus_rings(8, 0, 8), ([1, 2, 4], 3, [0, 1, 2]));
        assert_eq!(prob.torus_rings(128, 1, 1), ([8, 4, 4], 3, [2, 2, 2]));
        assert_eq!(prob.torus_rings(64, 1, 64), ([4, 4, 4], 3, [2, 2, 2]));
        assert_eq!(prob.ring_bandwidth_bps(64, 0, 1), 300e9);
        // All-to-all: a pair is one link, n/2 each way; a closed ring of 4, 4/(4·2) = 1/2 of
        // n/bw (the reduce-scatter on its 2 links: 3/8); a 4x4x4 cube, each axis 1/2 at once
        // (the reduce-scatter on 6 links: 63/64/6); an open line of 2 and one of 4
        // (stride 8: 2 on the second axis, 4 on the third, closed): max(1/2, 1/2).
        assert_eq!(prob.torus_all_to_all_time(2, 0, 1), 0.5);
        assert_eq!(prob.torus_all_to_all_time(4, 0, 1), 0.5);
        assert_eq!(prob.torus_all_to_all_time(64, 0, 1), 0.5);
        assert_eq!(prob.torus_all_to_all_time(8, 0, 8), 0.5);
        // 8 chips along the first axis across two cubes (closed by the circuit switches):
        // 16/(8·2) = 1.
        assert_eq!(prob.torus_all_to_all_time(128, 1, 1), 1.0);
        let n = 1e9;
        assert_eq!(
            prob.all_to_all_s(n, 3, 64, 0, 1),
            n * 0.5 / 50e9 + 3.0 * 63.0 * 1e-6
        );
        assert_eq!(prob.all_to_all_s(n, 3, 1, 0, 1), 0.0);
        assert_eq!(prob.ring_steps(64, 0, 1), 9);
        let n = 1e9;
        assert_eq!(
            prob.ring_allreduce_s(n, 64, 0, 1),
            2.0 * 63.0 / 64.0 * n / 300e9 + 2.0 * 9.0 * 1e-6
        );
        // A torus level above a switch is not posed.
        let mut bad = tpuv4_torus();
        bad.levels[0].topology = Topology::Switch;
        assert!(bad.validate().unwrap_err().message.contains("torus"));
        let mut bad = tpuv4_torus();
        bad.levels[1].uplink_bps = Some(1e9);
        assert!(bad.validate().unwrap_err().message.contains("uplink"));
        let mut bad = tpuv4_torus();
        bad.levels[0].topology = Topology::Torus(vec![4, 4, 5]);
        assert!(bad.validate().unwrap_err().message.contains("torus_dims"));
    }

    #[test]
    fn fat_tree_and_protocols() {
        let mut prob = a100();
        prob.levels[1].topology = Topology::FatTree {
            leaf_size: 32,
            oversubscription: 2.0,
        };
        assert!(prob.validate().is_ok());
        assert_eq!(prob.ring_bandwidth_bps(16, 1, 1), 200e9);
        assert_eq!(prob.ring_bandwidth_bps(64, 1, 1), 100e9);
        assert_eq!(prob.ring_bandwidth_bps(2, 1, 32), 12.5e9);
        let small = Protocol {
            bandwidth_bps: 200e9,
            latency_s: 2e-6,
            base_s: 30e-6,
            shard_bps: Some(500e9),
            algorithm: Algorithm::Ring,
        };
        let large = Protocol {
            bandwidth_bps: 240e9,
            latency_s: 3e-6,
            base_s: 120e-6,
            shard_bps: None,
            algorithm: Algorithm::Ring,
        };
        prob.levels[0].protocols = vec![small, large];
        assert!(prob.validate().is_ok());
        let n = 1048576.0;
        let a = 30e-6 + 2.0 * 7.0 * 2e-6 + 2.0 * 7.0 / 8.0 * n / 200e9 + n / 8.0 / 500e9;
        let b = 120e-6 + 2.0 * 7.0 * 3e-6 + 2.0 * 7.0 / 8.0 * n / 240e9;
        assert_eq!(prob.ring_allreduce_s(n, 8, 0, 1), a.min(b));
        // Protocols only on the innermost level.
        prob.levels[1].protocols = prob.levels[0].protocols.clone();
        assert!(prob.validate().unwrap_err().message.contains("protocols"));
    }

    #[test]
    fn nvls_prices_all_reduces_only() {
        let mut prob = a100();
        let ring = Protocol {
            bandwidth_bps: 370e9,
            latency_s: 2e-6,
            ..Protocol::default()
        };
        let nvls = Protocol {
            bandwidth_bps: 275e9,
            latency_s: 2e-6,
            algorithm: Algorithm::Nvls,
            ..Protocol::default()
        };
        prob.levels[0].protocols = vec![nvls.clone()];
        assert!(prob
            .validate()
            .unwrap_err()
            .message
            .contains("ring protocol"));
        prob.levels[0].protocols = vec![ring, nvls];
        assert!(prob.validate().is_ok());
        let n = 1073741824.0;
        // 8 GPUs: the switch's two passes beat the ring's 14 steps and 7/4 of the bytes.
        assert_eq!(prob.ring_allreduce_s(n, 8, 0, 1), 2.0 * 2e-6 + n / 275e9);
        // 2 GPUs: the ring sends n, as NVLS does, at more bandwidth.
        let ring2 = 2.0 * 2e-6 + 2.0 * 1.0 / 2.0 * n / 370e9;
        assert_eq!(prob.ring_allreduce_s(n, 2, 0, 1), ring2);
        // Reduce-scatters run on the ring whatever NVLS would cost.
        assert_eq!(
            prob.ring_reduce_scatter_s(n, 8, 0, 1),
            7.0 * 2e-6 + 7.0 / 8.0 * n / 370e9
        );
    }

    #[test]
    fn the_tree_all_reduce_takes_the_less_of_ring_and_tree() {
        let mut prob = a100();
        // 16 nodes, one GPU each (stride 8): k = 1, m = 16, a chain of 0 steps, depth 4.
        let ring = |n: f64| 2.0 * 15.0 / 16.0 * n / 25e9 + 2.0 * 15.0 * 5e-6;
        let tree = |n: f64| 2.0 * n / 25e9 + 2.0 * 0.0 * 6.34e-6 + 2.0 * 4.0 * 5e-6;
        let (small, large) = (1e3, 1e9);
        // Without `tree`, rings only (as before).
        assert_eq!(prob.ring_allreduce_s(small, 16, 1, 8), ring(small));
        assert_eq!(prob.ring_key(16, 1, 8), (25e9f64.to_bits(), 15, 0, 0));
        prob.levels[1].tree = true;
        assert!(prob.validate().is_ok());
        assert_eq!(prob.tree_steps(16, 1, 8), (0, 4));
        // Small messages: the tree's 8 latencies beat the ring's 30.
        assert!(tree(small) < ring(small));
        assert_eq!(prob.ring_allreduce_s(small, 16, 1, 8), tree(small));
        // Large ones: the ring's 2·15/16 · n beats the tree's 2 · n.
        assert!(ring(large) < tree(large));
        assert_eq!(prob.ring_allreduce_s(large, 16, 1, 8), ring(large));
        // Contiguous 64 GPUs: k = 8 (a chain of 7 NVLink steps), m = 8 nodes (depth 3); 24
        // GPUs: 3 nodes, depth ⌈log2 3⌉ = 2; 5 nodes one GPU each: depth 3; one node: 0.
        assert_eq!(prob.tree_steps(64, 1, 1), (7, 3));
        assert_eq!(prob.tree_steps(24, 1, 1), (7, 2));
        assert_eq!(prob.tree_steps(5, 1, 8), (0, 3));
        assert_eq!(prob.tree_steps(8, 1, 1), (7, 0));
        assert_eq!(
            prob.ring_allreduce_s(small, 64, 1, 1),
            2.0 * small / 200e9 + 2.0 * 7.0 * 6.34e-6 + 2.0 * 3.0 * 5e-6
        );
        // The search's classes: with the node capping the rails at 100e9, 16 GPUs 1 or 2 apart
        // ring alike (100e9, 15 steps) but run different trees (k = 8, m = 2 against k = 4,
        // m = 4), so their keys differ with `tree` and only then.
        prob.levels[0].bandwidth_bps = 100e9;
        assert_eq!(prob.tree_steps(16, 1, 1), (7, 1));
        assert_eq!(prob.tree_steps(16, 1, 2), (3, 2));
        assert_ne!(prob.ring_key(16, 1, 1), prob.ring_key(16, 1, 2));
        prob.levels[1].tree = false;
        assert_eq!(prob.ring_key(16, 1, 1), prob.ring_key(16, 1, 2));
        // Not on the innermost level, nor on a torus.
        let mut inner = a100();
        inner.levels[0].tree = true;
        assert!(inner
            .validate()
            .unwrap_err()
            .message
            .contains("levels[0].tree"));
        let mut torus = tpuv4_torus();
        torus.levels[1].tree = true;
        assert!(torus
            .validate()
            .unwrap_err()
            .message
            .contains("levels[1].tree"));
    }
}
