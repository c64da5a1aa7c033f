//! # phaze-dp: exact device placement for LLM training
//!
//! Given layers already priced for one micro-batch (at micro-batch size b and TP width t), a
//! cluster and a batch, choose the DP degree d, the number of pipeline stages p, a contiguous
//! split of the layers into stages, and a recompute policy per stage, minimizing the time per
//! batch under 1F1B. A layer's TP collectives are ops of the layer, already priced in its
//! `fwd_s` and `bwd_s` (the scheduler places them). Plain Rust, no Python: the pyo3 binding (`phaze-py`) only converts data.
//! All quantities are SI (seconds, bytes, bytes/s); bytes are integers so that memory
//! feasibility is exact.
//!
//! ## The model
//!
//! **Network (α–β).** A group of g devices placed contiguously uses the innermost level
//! whose `group_size >= g` (the last level if none). On level ℓ, a ring all-reduce of n bytes
//! over g devices takes `2(g−1)/g · n / bw + 2(g−1) · lat_ℓ` (0 when g = 1) and a
//! point-to-point transfer `lat_ℓ + n / bw_ℓ`. The ring's `bw` is rail-aware
//! ([`Problem::ring_bandwidth_bps`]): on ℓ > 0, with k = max(1, min(g, inner / s)) of the
//! group's members inside one group of level ℓ−1 (`inner` its group size, s the stride between
//! consecutive members), `bw = min(k · bw_ℓ, bw_ℓ−1)` (NCCL's channels over one NIC per GPU);
//! else `bw_ℓ`; a level's `uplink_bps` (a node's NICs together) caps either by the group's
//! share, `uplink · k / inner` (the groups of one kind run at once and share it). Devices are
//! numbered TP innermost, then by the [`RankOrder`] (fixed, or chosen per option): `tp-dp-pp`
//! (the launchers' default) puts a DP group's members t apart (the level of d·t) and pipeline
//! neighbours on the level of d·p·t; `tp-pp-dp` puts pipeline neighbours on the level of p·t
//! (the whole replica; conservative) and the DP group's members p·t apart (level d·p·t).
//!
//! **Feasible options.** b·d divides B, with m = B/(b·d) micro-batches per replica;
//! d·p·t <= N; 1 <= p <= L (and <= `max_stages`).
//!
//! **Stage k** (0-based) with layers i..=j and policy r:
//! * time `T_k = Σ_l (fwd_s + bwd_s + recompute_s[r]) + p2p`, the layers' times at the
//!   option's EP degree e ([`Layer::at_ep`]: an MoE layer's expert GEMMs at the EP member's
//!   shape in place of the traced one's), where p2p is
//!   `2 · p2p(boundary_bytes[i−1])` if k > 0 (receive the activation, send its gradient
//!   back) plus `2 · p2p(boundary_bytes[j])` if k < p−1; a transfer is
//!   [`Problem::pipeline_transfer_s`]: whole, or split over the TP group
//!   ([`Problem::pipeline_split`]: 1/t per rank, then the receivers' all-gather), at most the
//!   node uplink's share of the GPUs that send at once ([`Problem::p2p_bandwidth_bps`]);
//! * memory `Σ_l (param + grad + optimizer) + min(p − k, m) · Σ_l saved_bytes[r] +
//!   max_l workspace[r]`, which must be <= `hbm_bytes` (1F1B: stage k holds
//!   min(p − k, m) micro-batches in flight; the workspace under full recompute also holds the
//!   re-run forward's activations, [`Layer::recompute_workspace_bytes`]; a runtime that frees the
//!   gradients overlaps them with the activations, [`Problem::grads_freed`]);
//! * DP all-reduce `AR_k` = ring all-reduce of `Σ_l grad_bytes` over d devices on the DP
//!   level; exposed `E_k = AR_k`, or `max(0, AR_k − Σ_l bwd_s)` with `dp_overlap` (hidden
//!   behind the stage's last backward);
//! * optimizer step `O_k = Σ_l opt_s`, once per batch after the flush; ZeRO >= 1 divides it
//!   by d (each replica updates its 1/d of the state), and without ZeRO expert parallelism
//!   divides the experts' part `Σ_l expert_opt_s` by e; below ZeRO-3 it also holds the step's
//!   FP8 weight casts `Σ_l cast_s` (not divided by d, the experts' part by e), which under
//!   ZeRO-3 every forward (and full recompute) pays instead ([`Layer::cast_s`]).
//!
//! **Objective.** `time per batch = (m + p − 1) · max_k T_k + max_k E_k + max_k O_k`,
//! minimized: the pipeline with its bubble, then the gradients' collectives, then the
//! optimizer step. The stages update apart but not before every stage's gradients are reduced
//! (the global gradient norm and the mixed-precision overflow check of the step are
//! all-reduces over every rank), hence the maximum of each rather than of their sum.
//!
//! **Recompute setting.** `recompute: None` (`"auto"`) lets each stage take any of the three
//! policies; `Some(r)` (a user's `--recompute none|selective|full`) allows only r, in every
//! stage: the search, the memory check and the infeasibility report then see r alone, so a
//! fixed setting is priced exactly as it is run (a memory violation names it).
//!
//! **Tie-break.** Objectives within a relative 1e-12 of the optimum count as equal (they
//! differ only by rounding). Among them: fewer devices d·p·t, then fewer stages p, then fewer
//! chunks per rank, the lower ZeRO stage, the smaller EP degree, rank order `tp-dp-pp` before
//! `tp-pp-dp`, then the lexicographically smallest split (the sequence of stage last layers: earlier cuts first),
//! then the lexicographically smallest sequence of policy indices (none < selective < full).
//!
//! ## Why it is exact, and how fast
//!
//! Index stages from the end: a stage with s − 1 stages after it holds min(s, m) micro-batches,
//! whatever p is, so one table over (first layer i of a suffix, stages s in it) serves every p
//! for a given d. For a fixed stage range the fastest policy that fits memory is optimal (the
//! policy changes only T_k; E_k and O_k do not depend on it), so there is no policy
//! dimension. The objective couples max T, max E and max O, so each table cell keeps the
//! Pareto front of (max T, max E, max O) over the suffix's splits; the front of a cell weakly
//! dominates every split of its suffix, and the objective is monotone in all three, so the
//! optimum is exact. Cells whose lower bound (m + s − 1)·T + E + O exceeds the best objective
//! found so far are dropped. One run
//! per d and per network class of p (the p that share a p2p level, a DP level and a DP ring
//! bandwidth) costs
//! O(p_max · L² · front); fronts stay tiny (at most 4 points on the GPT-3 benchmark, most cells
//! empty after pruning): about 1 ms for 98 layers on 1,024 devices, 5 ms for 200 layers on
//! 16,384 (`benchmarks/bench_placement_dp.py`). The winning plan is rebuilt from the fronts
//! greedily (the shortest first stage that still admits a completion within the optimum), which
//! yields the lexicographic tie-break exactly.
//!
//! ```
//! use phaze_dp::{solve, Layer, NetLevel, Problem};
//! let layer = Layer { fwd_s: 1e-3, bwd_s: 2e-3, param_bytes: 1 << 20, grad_bytes: 1 << 20,
//!                     saved_bytes: [1 << 20, 1 << 19, 1 << 10], ..Default::default() };
//! let prob = Problem {
//!     layers: vec![layer; 4], devices: 8, hbm_bytes: 1 << 30,
//!     levels: vec![NetLevel { group_size: 8, bandwidth_bps: 1e11, latency_s: 1e-6, ..NetLevel::default() }],
//!     global_batch: 64, micro_batch: 1, tp: 1, cp: 1, dp_overlap: true, max_stages: None,
//!     recompute: None, zero: None, virtual_stages: None, blocks: None, expert_parallel: None,
//!     expert_tensor_parallel: None, rank_order: None,
//!     pipeline_split: false, grads_freed: false, grad_reduce_scale: 1.0, dp_shard: None,
//!     fsdp_copies: None,
//! };
//! let plan = solve(&prob).plan().cloned().expect("fits");
//! assert!(plan.devices_used <= 8);
//! ```

#![warn(missing_docs)]

mod input;
mod model;
mod plan;
mod search;

pub use model::{
    Algorithm, ExpertGemms, FsdpCopies, FsdpImplementation, InputError, Layer, NetLevel, Problem,
    Protocol, RankOrder, Recompute, RingKey, Topology, Zero,
};
pub use plan::{
    Evaluation, MemoryParts, Plan, Solution, Stage, TimeParts, Violation, ViolationKind,
};
pub use search::{evaluate_fixed, evaluate_many, solve, solve_many};
