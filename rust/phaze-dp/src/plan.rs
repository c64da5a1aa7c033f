//! Outputs of the placement search: plans, stages, and why something does not fit.
//!
//! Plans and violations derive serde's `Serialize`: the field names and words are those of
//! the Python result dicts (`passes/algorithms/_phaze_rs.pyi`).

use crate::model::{RankOrder, Recompute, Zero};
use serde::Serialize;

/// One pipeline stage of a plan: under plain 1F1B the layers of one pipeline device, under
/// interleaved 1F1B one model chunk (a device holds v of them: chunks k, k + p, k + 2p, ...).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Stage {
    /// The pipeline rank (device) that runs it: its index under 1F1B, `index mod p` under
    /// interleaving. Time, memory, policy, in-flight count and DP numbers are the rank's.
    pub rank: usize,
    /// First layer of the stage (inclusive, 0-based).
    pub first_layer: usize,
    /// Last layer of the stage (inclusive).
    pub last_layer: usize,
    /// Devices of the stage (its TP group, t).
    pub devices: u64,
    /// Stage time T_k per micro-batch (s): fwd + bwd + recompute + p2p + the per-micro-batch
    /// ZeRO and EP collectives.
    pub time_s: f64,
    /// `time_s` by part (they add up to it, but for rounding).
    pub time_parts: TimeParts,
    /// Peak bytes per device: weights + grads + optimizer + in_flight · stash + workspace.
    pub memory_bytes: u64,
    /// `memory_bytes` by part; `memory.total() == memory_bytes` (the DP computes the one from
    /// the other).
    pub memory: MemoryParts,
    /// Recompute policy of the stage.
    pub recompute: Recompute,
    /// Micro-batches whose activations the stage holds at once under 1F1B: min(p − k, m);
    /// under interleaving, chunk-micro-batches (units of one chunk's stash) of its rank.
    pub in_flight: u64,
    /// The stage's DP collectives per step before any overlap (s): the gradient all-reduce
    /// (ZeRO 0), or the ZeRO reduce-scatters and all-gathers (per-micro-batch ones m times).
    pub dp_comm_s: f64,
    /// What of the once-per-step DP collectives is exposed, E_k (s); per-micro-batch ones are
    /// in `time_s`.
    pub exposed_dp_s: f64,
    /// The optimizer step O_k once per batch after the flush (s): the layers' `opt_s`, 1/(d·c) of
    /// it from ZeRO-1 on (each replica updates its shard), the experts' part 1/e under EP; below
    /// ZeRO-3 with the step's FP8 weight casts (`Layer::cast_s`).
    pub optimizer_s: f64,
}

/// What a stage's (under interleaving: its rank's) time per micro-batch is made of, as the DP
/// adds it up: [`TimeParts::total`] is its `time_s` but for the rounding of the sum's order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct TimeParts {
    /// Σ (fwd_s + bwd_s) of its layers: their scheduled work, the TP collectives inside them
    /// included.
    pub compute_s: f64,
    /// Σ recompute_s[policy]: the recompute's extra work.
    pub recompute_s: f64,
    /// The stage-boundary transfers: activations in and out, their gradients back.
    pub pp_comm_s: f64,
    /// ZeRO-2/3's per-micro-batch DP collectives, what of them is not hidden.
    pub zero_comm_s: f64,
    /// EP's all-to-alls: dispatch and combine in forward and backward, and again in a full
    /// recompute's forward.
    pub ep_comm_s: f64,
}

impl TimeParts {
    /// The parts' sum.
    #[inline]
    pub fn total(&self) -> f64 {
        self.compute_s + self.recompute_s + self.pp_comm_s + self.zero_comm_s + self.ep_comm_s
    }
}

/// What a stage's (under interleaving: its rank's) bytes per device are made of, as the DP
/// counts them: each state part already divided over the DP group where the ZeRO stage shards
/// it. [`MemoryParts::total`] is the memory the DP checks against HBM and reports as
/// `memory_bytes`, so a breakdown can never disagree with the figure it explains.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MemoryParts {
    /// Parameters: Σ param_bytes, ⌈/(d·c)⌉ under ZeRO-3, which also holds two layers' gathered
    /// parameters (the layer running and the one prefetched); below ZeRO-3, plus Σ
    /// fp8_weight_bytes (Transformer Engine's FP8 weight copies, kept for the step).
    pub params: u64,
    /// Gradients: Σ grad_bytes, ⌈/(d·c)⌉ from ZeRO-2. When the runtime frees them after each
    /// one-micro-batch step ([`crate::Problem::grads_freed`]), those alive at the backward's
    /// peak of activations plus gradients: that peak less the stash.
    pub grads: u64,
    /// Optimizer state: Σ optimizer_bytes, ⌈/(d·c)⌉ from ZeRO-1.
    pub optimizer: u64,
    /// The activations stashed at the schedule's peak: in_flight · Σ `saved_bytes[policy]` under
    /// 1F1B, the simulated peak of the interleaved schedule otherwise.
    pub activations: u64,
    /// The largest transient working set of one layer: max workspace_bytes.
    pub workspace: u64,
}

impl MemoryParts {
    /// The bytes per device: the parts' sum, saturating at `u64::MAX` (for non-negative parts a
    /// saturating sum is min(sum, MAX) in any order).
    #[inline]
    pub fn total(&self) -> u64 {
        self.params
            .saturating_add(self.grads)
            .saturating_add(self.optimizer)
            .saturating_add(self.activations)
            .saturating_add(self.workspace)
    }
}

/// A placement: DP degree, pipeline stages and their recompute policies, with its cost.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Plan {
    /// DP degree d (pipeline replicas).
    pub dp: u64,
    /// Pipeline stages p (pipeline ranks; each holds `virtual_stages` model chunks).
    pub pp: usize,
    /// Model chunks per pipeline rank, v: 1 for plain 1F1B, >= 2 for interleaved 1F1B.
    pub virtual_stages: u64,
    /// How the DP group shares weights, gradients and optimizer state.
    pub zero: Zero,
    /// Expert-parallel degree e: each MoE layer's experts are split over e consecutive DP
    /// replicas (1: every replica holds them all).
    pub expert_parallel: u64,
    /// How the devices are numbered into TP, PP and DP groups (which groups the network
    /// prices as contiguous).
    pub rank_order: RankOrder,
    /// TP width t (devices per stage).
    pub tp: u64,
    /// Context-parallel degree c (devices splitting each sequence; 1: none).
    pub cp: u64,
    /// Micro-batch size b.
    pub micro_batch: u64,
    /// Micro-batches per replica per batch, m = B / (b·d).
    pub num_micro_batches: u64,
    /// Global batch B.
    pub global_batch: u64,
    /// (m + (p − 1)/v) · max_k T_k + max_k E_k + max_k O_k (s): the pipeline (its bubble
    /// included), then the exposed once-per-step DP collectives, then the optimizer step.
    pub time_per_batch_s: f64,
    /// B / time_per_batch_s (samples/s; infinite when the time is 0).
    pub throughput_samples_per_s: f64,
    /// d · p · t · c.
    pub devices_used: u64,
    /// max_k T_k (s).
    pub max_stage_time_s: f64,
    /// max_k E_k (s).
    pub max_exposed_dp_s: f64,
    /// max_k O_k (s).
    pub max_optimizer_s: f64,
    /// max_k memory (bytes per device).
    pub max_memory_bytes: u64,
    /// The stages, first to last.
    pub stages: Vec<Stage>,
}

/// Which constraint a placement violates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ViolationKind {
    /// The problem itself is malformed (see [`crate::InputError`]).
    Input,
    /// b·d does not divide the global batch B.
    Batch,
    /// More devices than the cluster has (t·c > N, or d·p·t·c > N; c = 1 without context
    /// parallelism).
    Devices,
    /// More stages than layers, or than `max_stages`.
    Stages,
    /// Some stage does not fit in HBM.
    Memory,
}

impl ViolationKind {
    /// Lower-case name used across the Python boundary.
    pub fn as_str(self) -> &'static str {
        match self {
            ViolationKind::Input => "input",
            ViolationKind::Batch => "batch",
            ViolationKind::Devices => "devices",
            ViolationKind::Stages => "stages",
            ViolationKind::Memory => "memory",
        }
    }
}

/// A violated constraint, with a human-readable message that starts with the kind
/// (e.g. `memory: ...`) and, for memory, the numbers.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Violation {
    /// Which constraint binds.
    pub kind: ViolationKind,
    /// What is wrong, in words and numbers.
    pub message: String,
    /// For memory: the smallest possible largest-stage memory (bytes per device) over the
    /// options considered, i.e. the HBM that would have been needed.
    pub needed_bytes: Option<u64>,
    /// For memory: the DP degree of the option that needs `needed_bytes`.
    pub dp: Option<u64>,
    /// For memory: the stage count of the option that needs `needed_bytes`.
    pub pp: Option<usize>,
}

impl Violation {
    pub(crate) fn new(kind: ViolationKind, message: String) -> Violation {
        Violation {
            kind,
            message,
            needed_bytes: None,
            dp: None,
            pp: None,
        }
    }
}

/// Answer of [`crate::solve`]: the optimal plan, or the constraint that makes every option
/// infeasible. A returned plan never violates a constraint.
#[derive(Clone, Debug, PartialEq)]
pub enum Solution {
    /// The optimal feasible plan.
    Feasible(Plan),
    /// Nothing fits; why (one violation: the first binding constraint in the order input,
    /// batch, devices, memory).
    Infeasible(Violation),
}

impl Solution {
    /// The plan, if feasible.
    pub fn plan(&self) -> Option<&Plan> {
        match self {
            Solution::Feasible(p) => Some(p),
            Solution::Infeasible(_) => None,
        }
    }
}

/// Answer of [`crate::evaluate_fixed`]: a fixed (p, d), with the best split and policies.
///
/// Serialized, it is the result dict of every placement function (a [`Solution`] converts).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Evaluation {
    /// True when the plan violates nothing.
    pub feasible: bool,
    /// The plan's numbers, also when it does not fit (then flagged by `violations`). For a
    /// memory violation it is the fastest plan among those whose largest stage needs the least
    /// memory. `None` only when no numbers exist (p > L, or b·d does not divide B).
    pub plan: Option<Plan>,
    /// Every violated constraint (empty when feasible).
    pub violations: Vec<Violation>,
}

/// A solution as an evaluation of the placement it chose: its plan, or none and the binding
/// constraint.
impl From<Solution> for Evaluation {
    fn from(s: Solution) -> Evaluation {
        match s {
            Solution::Feasible(plan) => Evaluation {
                feasible: true,
                plan: Some(plan),
                violations: Vec::new(),
            },
            Solution::Infeasible(v) => Evaluation {
                feasible: false,
                plan: None,
                violations: vec![v],
            },
        }
    }
}
