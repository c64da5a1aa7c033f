//! The exact search: a suffix DP with Pareto fronts, then a lexicographic reconstruction.
//!
//! See the crate docs for the model. Implementation notes:
//!
//! * Range sums are accumulated left to right (layer i, i+1, ..., j), both in the DP and when
//!   a plan is rebuilt, so a stage's time is the *same float* everywhere; the reconstruction
//!   can therefore test `objective <= bound` against the DP's own numbers without slack.
//! * Memory is integer bytes (saturating), so feasibility never depends on rounding.

use crate::model::{FsdpImplementation, Layer, Problem, RankOrder, Recompute, RingKey, Zero};
use crate::plan::{
    Evaluation, MemoryParts, Plan, Solution, Stage, TimeParts, Violation, ViolationKind,
};

/// Objectives within this relative distance of the optimum count as ties (they differ only
/// by the rounding of sums taken in different orders); ties are broken as documented.
pub(crate) const TIE_REL: f64 = 1e-12;

fn tie_bound(best: f64) -> f64 {
    best + best.abs() * TIE_REL
}

/// The time per batch of a schedule factor (m + p − 1, or m + (p − 1)/v), the largest stage
/// time per micro-batch, the largest exposed once-per-step DP collectives and the largest
/// optimizer step: `factor · t + e + o`, summed in this order everywhere (the DP, the
/// reconstruction and the plan), so they compare the same floats.
#[inline]
fn objective(factor: f64, t: f64, e: f64, o: f64) -> f64 {
    factor * t + e + o
}

/// Running sums over a contiguous range of layers (a candidate stage).
#[derive(Clone, Copy, Default)]
struct RangeSums {
    /// Σ (fwd_s + bwd_s).
    compute_s: f64,
    /// Σ fwd_s (what a ZeRO parameter all-gather can hide behind).
    fwd_s: f64,
    /// Σ recompute_s[r] per policy.
    recompute_s: [f64; 3],
    /// Σ bwd_s (what a DP all-reduce can hide behind).
    bwd_s: f64,
    /// Σ opt_s, and of it Σ expert_opt_s (what expert parallelism divides).
    opt_s: f64,
    expert_opt_s: f64,
    /// Σ cast_s, and of it Σ expert_cast_s: the FP8 weight casts of one forward.
    cast_s: f64,
    expert_cast_s: f64,
    /// Σ param_bytes.
    param_bytes: u64,
    /// Σ of what the layers' parameter all-gathers move ([`Layer::gathered_bytes`]).
    gather_bytes: u64,
    /// max over the layers of what a device holds of one gathered layer
    /// ([`Prepared::gathered`]): ZeRO-3 holds two such layers at once.
    max_gathered_bytes: u64,
    /// Σ optimizer_bytes.
    optimizer_bytes: u64,
    /// Σ saved_bytes[r] per policy.
    saved_bytes: [u64; 3],
    /// max workspace_bytes per policy: none's and selective's, and under full recompute the
    /// larger of it and the layer's recompute_workspace_bytes.
    workspace_bytes: [u64; 3],
    /// Per policy, max over the range's layers k of Σ_{i..k} saved_bytes + Σ_{k..j} grad_bytes:
    /// the activations and gradients held together during the backward when a layer's
    /// gradients are allocated by its backward ([`Problem::grads_freed`]).
    grads_peak: [u64; 3],
    /// Σ grad_bytes.
    grad_bytes: u64,
    /// Σ expert_param_bytes, Σ expert_grad_bytes, Σ expert_optimizer_bytes: the parts of the
    /// sums above that expert parallelism divides.
    expert_param_bytes: u64,
    expert_grad_bytes: u64,
    expert_optimizer_bytes: u64,
    /// Σ dispatch_bytes and the MoE layers that dispatch (each pays its all-to-alls' latency).
    dispatch_bytes: u64,
    moe_layers: u64,
    /// Σ fp8_weight_bytes: the FP8 weight copies kept for the step (none under ZeRO-3).
    fp8_weight_bytes: u64,
}

impl RangeSums {
    /// Adds layer `l`, of which a device holds `gathered` bytes when ZeRO-3 gathers it.
    #[inline]
    fn push(&mut self, l: &Layer, gathered: u64) {
        self.compute_s += l.fwd_s + l.bwd_s;
        self.fwd_s += l.fwd_s;
        for r in 0..3 {
            self.recompute_s[r] += l.recompute_s[r];
            self.saved_bytes[r] = self.saved_bytes[r].saturating_add(l.saved_bytes[r]);
            // The new last layer k = j: all the activations and its own gradients; every
            // earlier k also holds its gradients.
            self.grads_peak[r] = self.grads_peak[r]
                .max(self.saved_bytes[r])
                .saturating_add(l.grad_bytes);
        }
        self.bwd_s += l.bwd_s;
        self.opt_s += l.opt_s;
        self.expert_opt_s += l.expert_opt_s;
        self.cast_s += l.cast_s;
        self.expert_cast_s += l.expert_cast_s;
        self.param_bytes = self.param_bytes.saturating_add(l.param_bytes);
        self.gather_bytes = self.gather_bytes.saturating_add(l.gathered_bytes());
        self.max_gathered_bytes = self.max_gathered_bytes.max(gathered);
        self.optimizer_bytes = self.optimizer_bytes.saturating_add(l.optimizer_bytes);
        let remat = l.workspace_bytes.max(l.recompute_workspace_bytes);
        self.workspace_bytes = [
            self.workspace_bytes[0].max(l.workspace_bytes),
            self.workspace_bytes[1].max(l.workspace_bytes),
            self.workspace_bytes[2].max(remat),
        ];
        self.grad_bytes = self.grad_bytes.saturating_add(l.grad_bytes);
        self.expert_param_bytes = self.expert_param_bytes.saturating_add(l.expert_param_bytes);
        self.expert_grad_bytes = self.expert_grad_bytes.saturating_add(l.expert_grad_bytes);
        self.expert_optimizer_bytes = self
            .expert_optimizer_bytes
            .saturating_add(l.expert_optimizer_bytes);
        self.dispatch_bytes = self.dispatch_bytes.saturating_add(l.dispatch_bytes);
        self.moe_layers += u64::from(l.dispatch_bytes > 0);
        self.fp8_weight_bytes = self.fp8_weight_bytes.saturating_add(l.fp8_weight_bytes);
    }
}

/// A device's part of `experts` bytes of experts as traced at TP t, at EP degree e with
/// `scale` = t/k ([`ExpertMesh::scale`]): ⌈experts·scale/e⌉, 1/e of them (folded t/(k·e)).
#[inline]
fn expert_share(experts: u64, scale: u64, e: u64) -> u64 {
    experts.saturating_mul(scale).div_ceil(e)
}

/// The problem, its layers as a member of an EP group of e runs them ([`Layer::at_ep`]) and
/// their count, shared by every DP run at that e.
struct Prepared<'a> {
    prob: &'a Problem,
    n: usize,
    layers: std::borrow::Cow<'a, [Layer]>,
    /// Per layer, what a device holds of it gathered by ZeRO-3 at EP degree e: its dense part
    /// whole and its own experts, (param_bytes − expert_param_bytes) + [`expert_share`] of
    /// expert_param_bytes. FSDP2 shards the experts over the devices holding the same ones
    /// (torchtitan's `parallelize` for MoE: `fully_shard` of the experts on the
    /// `dp_shard_mod_ep` mesh), so a layer's all-gather brings back the device's E/e experts,
    /// not the other EP ranks'. A per-layer value at each e, so a stage's max of it
    /// ([`RangeSums::max_gathered_bytes`]) is exact, not max(dense) + max(experts)/e.
    gathered: Vec<u64>,
}

impl<'a> Prepared<'a> {
    /// The layers at EP degree e: the problem's own where none has expert GEMM times at e.
    fn new(prob: &'a Problem, e: u64) -> Self {
        let layers = if e > 1 && prob.layers.iter().any(|l| l.expert_gemms(e).is_some()) {
            std::borrow::Cow::Owned(prob.layers.iter().map(|l| l.at_ep(e)).collect())
        } else {
            std::borrow::Cow::Borrowed(&prob.layers[..])
        };
        // t/k: 1 unless the experts are folded (then k divides t), as ExpertMesh::scale.
        let scale = prob.tp / prob.expert_tp();
        let gathered = layers
            .iter()
            .map(|l| {
                (l.param_bytes - l.expert_param_bytes).saturating_add(expert_share(
                    l.expert_param_bytes,
                    scale,
                    e,
                ))
            })
            .collect();
        Prepared {
            prob,
            n: prob.layers.len(),
            layers,
            gathered,
        }
    }

    #[inline]
    fn push(&self, a: &mut RangeSums, l: usize) {
        a.push(&self.layers[l], self.gathered[l]);
    }

    /// Sums over layers i..=j, accumulated in the same order as the DP does.
    fn range(&self, i: usize, j: usize) -> RangeSums {
        let mut a = RangeSums::default();
        for l in i..=j {
            self.push(&mut a, l);
        }
        a
    }
}

/// The problem prepared at each EP degree the search may try ([`Prepared::new`]).
struct Preps<'a> {
    at: Vec<(u64, Prepared<'a>)>,
}

impl<'a> Preps<'a> {
    /// Every EP degree [`Problem::expert_parallel_degrees`] may give at some d: the fixed one,
    /// else the divisors of the expert count (and 1), and any a layer prices its experts at.
    fn new(prob: &'a Problem) -> Self {
        let mut es = vec![1];
        let mut add = |e: u64| {
            if !es.contains(&e) {
                es.push(e);
            }
        };
        match prob.expert_parallel {
            Some(e) => add(e),
            None => {
                let experts = prob.experts().max(1);
                (2..=experts)
                    .filter(|e| experts.is_multiple_of(*e))
                    .for_each(&mut add);
            }
        }
        for l in &prob.layers {
            for x in &l.expert_gemm_s {
                add(x.e);
            }
        }
        Preps {
            at: es
                .into_iter()
                .map(|e| (e, Prepared::new(prob, e)))
                .collect(),
        }
    }

    /// The problem at EP degree e.
    fn at(&self, e: u64) -> &Prepared<'a> {
        self.at
            .iter()
            .find(|(x, _)| *x == e)
            .map(|(_, p)| p)
            .expect("Preps::new prepares every EP degree the search tries")
    }
}

/// How a stage's state is divided over the data-parallel replicas: the ZeRO stage and the
/// expert-parallel degree e (e consecutive replicas hold 1/e of the experts each); and how
/// the devices are numbered into groups (the rank order), which places the DP group on the
/// network.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Shard {
    z: Zero,
    e: u64,
    o: RankOrder,
}

/// The (ZeRO stage, EP degree, rank order) triples worth trying at DP degree d, least memory
/// last (the highest ZeRO stage with the largest e; memory does not depend on the order). At
/// d = 1 nothing is sharded and every ZeRO stage prices exactly like the first allowed one,
/// which the tie-break prefers, so only that one; nor do the rank orders differ there (one
/// replica: its pipeline neighbours are t apart in both), so only the first allowed.
fn shard_options(prob: &Problem, d: u64) -> Vec<Shard> {
    let all = prob.zero_stages();
    // Under CP the DP×CP group (d·c) shares the gradients and the ZeRO shards; folded, the
    // experts are sharded over their own group, which may span the TP ranks at d·c = 1.
    let zs = if d * prob.cp == 1 && !prob.experts_folded() {
        &all[..1]
    } else {
        all
    };
    let orders = prob.rank_orders();
    let os = if d == 1 { &orders[..1] } else { orders };
    let es = prob.expert_parallel_degrees(d);
    let mut out = Vec::with_capacity(zs.len() * es.len() * os.len());
    for &z in zs {
        for &e in &es {
            for &o in os {
                out.push(Shard { z, e, o });
            }
        }
    }
    out
}

/// Where a stage's experts live at EP degree e ([`Problem::expert_tensor_parallel`]).
#[derive(Clone, Copy, Debug, PartialEq)]
struct ExpertMesh {
    /// A device's expert bytes over what the layers record (traced at TP t): t/k, 1 unless
    /// the experts are folded; a device holds ⌈X·scale/e⌉ of X.
    scale: u64,
    /// The devices holding the same experts, over which ZeRO shards them and their gradients
    /// are reduced: the d·c/e replicas, or folded t·c·d/(k·e).
    edp: u64,
    /// Devices between consecutive members of that group: e·s (s the DP stride), or folded k·e.
    edp_stride: u64,
    /// The EP group's level and its members' stride: e replicas at one CP rank, c·s apart
    /// (`tp-cp-ep-dp-pp`), or folded e devices k apart, on the level of e·k.
    ep_level: usize,
    ep_stride: u64,
}

impl ExpertMesh {
    /// The mesh at DP×CP group g (its ZeRO group zg), DP stride s and EP degree e.
    fn new(prob: &Problem, g: u64, zg: u64, stride: u64, e: u64) -> Self {
        let k = prob.expert_tp();
        if prob.experts_folded() {
            // Megatron-core 0.10's expert ranks over a stage's t·g devices (contiguous under
            // tp-dp-pp, the only order allowed folded): ETP k innermost, then EP, then EDP.
            ExpertMesh {
                scale: prob.tp / k,
                edp: prob.tp * g / (k * e),
                edp_stride: k * e,
                ep_level: prob.level_for(e * k),
                ep_stride: k,
            }
        } else {
            ExpertMesh {
                scale: 1,
                edp: zg / e,
                edp_stride: e * stride,
                ep_level: prob.level_for(e * prob.cp * stride),
                ep_stride: prob.cp * stride,
            }
        }
    }

    /// Whether the experts are split from the dense part (EP, or a folded ETP).
    #[inline]
    fn apart(&self, e: u64) -> bool {
        e > 1 || self.scale > 1
    }
}

/// Everything that is fixed for one (d, network class of p, HBM, ZeRO stage, EP degree): the
/// DP's cost model.
struct Ctx<'p, 'a> {
    prep: &'p Prepared<'a>,
    d: u64,
    /// The devices that share a stage's gradients and ZeRO shards: the DP×CP group, d·c
    /// (d without context parallelism).
    g: u64,
    /// The devices ZeRO shards over: g, or under HSDP ([`Problem::dp_shard`]) the shard
    /// group, whose collectives ([`Ctx::over_dp`]) run on the level of `zg`·`dp_stride`.
    zg: u64,
    /// HSDP's replicate group: (g / zg replicas, their level, zg·`dp_stride` apart), or `None`.
    replicas: Option<(u64, usize, u64)>,
    zero: Zero,
    /// Expert-parallel degree e: the EP group is e consecutive DP replicas (`dp_stride`
    /// apart, on the level of e·stride); the replicas holding the same experts, d/e of them,
    /// lie e·stride apart (on the DP level).
    e: u64,
    /// How devices are numbered into groups (decides `dp_stride` and the levels).
    order: RankOrder,
    /// Where the experts live ([`ExpertMesh`]).
    mesh: ExpertMesh,
    m: u64,
    hbm: u64,
    /// cut[l] = 2 · p2p(boundary_bytes[l]) on the pipeline level: the cost a stage pays on
    /// each side of a boundary after layer l (activation one way, its gradient back).
    cut: Vec<f64>,
    /// The pipeline level's `collective_compute_share`: under interleaving a rank's receives
    /// and backward sends run beside its chunks' compute and take that share of the SMs (its
    /// forward sends are waited on: [`Rank::p2p_exposed`]).
    pp_share: f64,
    dp_level: usize,
    /// Devices between consecutive members of a DP group ([`RankOrder::strides`]): t when
    /// PP is outermost (`tp-dp-pp`: the DP level is that of d·t, the p2p level that of
    /// d·p·t), p·t when DP is (`tp-pp-dp`: a replica's p·t devices are contiguous, the p2p
    /// level is that of p·t, the DP level that of d·p·t).
    dp_stride: u64,
    /// The policies a stage may use ([`Problem::policies`]): all three, or the fixed one.
    policies: &'static [usize],
    /// Whether a 1F1B stage holds only the gradients whose backward has run
    /// ([`Problem::grads_freed`] with m = 1, no ZeRO-2/3 and no EP: the gradients whole, freed
    /// after each step).
    grads_freed: bool,
    /// ZeRO-2/3's per-layer collectives overlapped layer by layer ([`Windows`]); `None`
    /// without `dp_overlap` or below ZeRO-2 (then the stage's sums price them).
    windows: Option<Windows>,
}

/// ZeRO-2/3's collectives as FSDP overlaps them, one layer's at a time (docs/design.md §6.5):
/// each layer's parameters all-gathered while the layer before it computes (prefetched one
/// layer ahead, forward and backward), its gradients reduce-scattered while the layer before
/// it runs its backward; the collectives of one group run one after another (one NCCL
/// communicator, one stream), and a stage's first all-gather in each direction and its last
/// reduce-scatter have no compute beside them. Per layer l: `ag[l]`, `rs[l]` (the rings of its
/// parameters and gradients), and prefix sums of the windows' unhidden time, so a stage's is
/// O(1): `fwd[l]` = Σ_{k<l} hide(ag[k+1], F_k), `bwd[l]` = Σ_{k<l} hide(rs[k+1] + ag[k−1], B_k),
/// `grads[l]` = Σ_{k<l} hide(rs[k+1], B_k).
struct Windows {
    ag: Vec<f64>,
    rs: Vec<f64>,
    fwd: Vec<f64>,
    bwd: Vec<f64>,
    grads: Vec<f64>,
    /// HSDP's all-reduce of each layer's sharded gradients across the replicas (0 without),
    /// and its prefix sums, `ar_sum[l]` = Σ_{k<l} ar[k]; `bwd_sum[l]` = Σ_{k<l} B_k.
    ar: Vec<f64>,
    ar_sum: Vec<f64>,
    bwd_sum: Vec<f64>,
}

impl<'p, 'a> Ctx<'p, 'a> {
    /// `p` stages (a network class's representative): with the rank order it picks the p2p
    /// level and the DP group's stride and level.
    /// The layers are the problem's at the shard's EP degree ([`Preps::at`]).
    fn new(preps: &'p Preps<'a>, d: u64, p: usize, hbm: u64, shard: Shard) -> Self {
        let prep = preps.at(shard.e);
        let prob = prep.prob;
        let g = d * prob.cp;
        let (stride, pp_stride) = shard.o.strides(g, p as u64, prob.tp);
        let pp_level = prob.level_for(p as u64 * pp_stride);
        let cut = prob
            .layers
            .iter()
            .map(|l| 2.0 * prob.pipeline_transfer_s(l.boundary_bytes as f64, pp_level, pp_stride))
            .collect();
        let m = prob.global_batch / (prob.micro_batch * d);
        // HSDP: ZeRO within groups of s, replicated over g / s of them (when s divides g and
        // is below it; dp_degrees keeps only the d whose g it divides).
        let zg = prob
            .dp_shard
            .filter(|&s| s < g && g.is_multiple_of(s))
            .unwrap_or(g);
        let replicas = (zg < g).then(|| (g / zg, prob.level_for(g * stride), zg * stride));
        let mut ctx = Ctx {
            prep,
            d,
            g,
            zg,
            replicas,
            zero: shard.z,
            e: shard.e,
            order: shard.o,
            mesh: ExpertMesh::new(prob, g, zg, stride, shard.e),
            m,
            hbm,
            cut,
            pp_share: prob.levels[pp_level].collective_compute_share,
            dp_level: prob.level_for(zg * stride),
            dp_stride: stride,
            policies: prob.policies(),
            grads_freed: prob.grads_freed
                && m == 1
                && shard.z.stage() < 2
                && shard.e == 1
                && !prob.experts_folded(),
            windows: None,
        };
        if prob.dp_overlap && shard.z >= Zero::Gradients && ctx.sharded() {
            ctx.windows = Some(ctx.windows());
        }
        ctx
    }

    /// The [`Windows`] of every layer.
    fn windows(&self) -> Windows {
        let layers = &self.prep.layers;
        let n = layers.len();
        let ring = |l: &Layer, grads: bool| {
            let (bytes, experts) = if grads {
                self.on_wire(l.grad_bytes, l.expert_grad_bytes)
            } else {
                gathered(l.gathered_bytes(), l.param_bytes, l.expert_param_bytes)
            };
            self.half_ring(bytes, experts)
        };
        let ag: Vec<f64> = layers.iter().map(|l| ring(l, false)).collect();
        let rs: Vec<f64> = layers.iter().map(|l| ring(l, true)).collect();
        let ar: Vec<f64> = layers
            .iter()
            .map(|l| self.replica_allreduce(l.grad_bytes))
            .collect();
        let (mut ar_sum, mut bwd_sum) = (vec![0.0; n + 1], vec![0.0; n + 1]);
        for k in 0..n {
            ar_sum[k + 1] = ar_sum[k] + ar[k];
            bwd_sum[k + 1] = bwd_sum[k] + layers[k].bwd_s;
        }
        let (mut fwd, mut bwd, mut grads) = (vec![0.0; n + 1], vec![0.0; n + 1], vec![0.0; n + 1]);
        for k in 0..n {
            let next_rs = if k + 1 < n { rs[k + 1] } else { 0.0 };
            let next_ag = if k + 1 < n { ag[k + 1] } else { 0.0 };
            let prev_ag = if k > 0 { ag[k - 1] } else { 0.0 };
            let (f, b) = (layers[k].fwd_s, layers[k].bwd_s);
            fwd[k + 1] = fwd[k] + self.unhidden(next_ag, f);
            bwd[k + 1] = bwd[k] + self.unhidden(next_rs + prev_ag, b);
            grads[k + 1] = grads[k] + self.unhidden(next_rs, b);
        }
        Windows {
            ag,
            rs,
            fwd,
            bwd,
            grads,
            ar,
            ar_sum,
            bwd_sum,
        }
    }

    /// HSDP's all-reduce across the replicas of `grad_bytes` of gradients: each device's
    /// 1/zg shard, in the reduce dtype ([`Ctx::on_wire`]); 0 without HSDP.
    fn replica_allreduce(&self, grad_bytes: u64) -> f64 {
        let Some((reps, level, stride)) = self.replicas else {
            return 0.0;
        };
        let (bytes, _) = self.on_wire(grad_bytes, 0);
        self.prep
            .prob
            .ring_allreduce_s(bytes.div_ceil(self.zg) as f64, reps, level, stride)
    }

    #[inline]
    fn p2p_in(&self, i: usize) -> f64 {
        if i > 0 {
            self.cut[i - 1]
        } else {
            0.0
        }
    }

    #[inline]
    fn p2p_out(&self, j: usize) -> f64 {
        if j + 1 < self.prep.n {
            self.cut[j]
        } else {
            0.0
        }
    }

    /// The bytes per device of layers `a` with `stash` bytes of activations in flight, by part:
    /// weights, gradients and optimizer state, each divided over the DP group (rounded up)
    /// where the ZeRO stage shards it (ZeRO-3's parameters with its two gathered layers), the
    /// stash, and the largest workspace. The one formula of a stage's memory: the DP's
    /// feasibility checks take its total ([`Ctx::stash_mem`]), the plan reports both.
    #[inline]
    fn parts(&self, a: &RangeSums, stash: u64, r: usize) -> MemoryParts {
        let z = self.zero.stage();
        // Under EP the experts' part is 1/e per device (folded t/(k·e)), and ZeRO shards it
        // over the devices that hold the same experts; the rest over all d.
        let shard = |bytes: u64, experts: u64, sharded: bool| {
            let over = |x: u64, g: u64| if sharded { x.div_ceil(g) } else { x };
            if !self.mesh.apart(self.e) {
                over(bytes, self.zg)
            } else {
                over(bytes - experts, self.zg)
                    .saturating_add(over(self.expert_share(experts), self.mesh.edp))
            }
        };
        // ZeRO-3's two gathered layers (the running one and the prefetched next): each a
        // layer's dense part whole and the device's own experts ([`Prepared::gathered`]).
        let gathered = if z >= 3 && self.sharded() {
            a.max_gathered_bytes.saturating_mul(2)
        } else {
            0
        };
        // Transformer Engine's FP8 weight copies, kept for the step beside replicated weights;
        // under ZeRO-3 (FSDP) it keeps none.
        let fp8_copies = if z >= 3 { 0 } else { a.fp8_weight_bytes };
        MemoryParts {
            params: shard(a.param_bytes, a.expert_param_bytes, z >= 3)
                .saturating_add(gathered)
                .saturating_add(fp8_copies),
            grads: shard(a.grad_bytes, a.expert_grad_bytes, z >= 2),
            optimizer: shard(a.optimizer_bytes, a.expert_optimizer_bytes, z >= 1),
            activations: stash,
            workspace: a.workspace_bytes[r],
        }
    }

    /// [`Ctx::parts`] with `f` micro-batches of policy r's stash in flight (1F1B). When the
    /// gradients are freed after each step and a step is one micro-batch ([`Ctx::grads_freed`];
    /// then f = 1), the gradients counted are those alive at the backward's peak of
    /// activations plus gradients ([`RangeSums::grads_peak`]), so the parts add up to it.
    #[inline]
    fn mem_parts(&self, a: &RangeSums, f: u64, r: usize) -> MemoryParts {
        let mut parts = self.parts(a, f.saturating_mul(a.saved_bytes[r]), r);
        if self.grads_freed {
            parts.grads = a.grads_peak[r].saturating_sub(a.saved_bytes[r]);
        }
        parts
    }

    #[inline]
    fn mem(&self, a: &RangeSums, f: u64, r: usize) -> u64 {
        self.mem_parts(a, f, r).total()
    }

    /// Memory with `stash` bytes of activations in flight.
    #[inline]
    fn stash_mem(&self, a: &RangeSums, stash: u64, r: usize) -> u64 {
        self.parts(a, stash, r).total()
    }

    /// The fastest allowed policy whose memory fits with `f` micro-batches in flight (ties:
    /// lower index). The fastest fitting policy is always optimal: the policy changes only T_k.
    #[inline]
    fn fastest_fit(&self, a: &RangeSums, f: u64) -> Option<usize> {
        self.fastest_policy(&self.recompute(a), |r| self.mem(a, f, r))
    }

    /// Extra time per micro-batch of each recompute policy: the layers' `recompute_s`, and
    /// under EP full recompute's second forward pays its dispatch and combine again.
    #[inline]
    fn recompute(&self, a: &RangeSums) -> [f64; 3] {
        let mut r = a.recompute_s;
        r[2] += 2.0 * self.all_to_all(a) + self.microbatch_casts(a);
        r
    }

    /// A device's FP8 weight casts of one forward of `a` ([`Layer::cast_s`]): its experts'
    /// part 1/e under EP (a device casts the experts it holds).
    #[inline]
    fn casts(&self, a: &RangeSums) -> f64 {
        self.device_part(a.cast_s, a.expert_cast_s)
    }

    /// A device's part of a time over a layer range's weights or state, `whole` of which
    /// `experts` is the experts' (the optimizer's update, the FP8 weight casts): all of the
    /// dense part, and under EP 1/e of the experts' (folded t/(k·e), [`ExpertMesh::scale`]).
    #[inline]
    fn device_part(&self, whole: f64, experts: f64) -> f64 {
        if self.mesh.apart(self.e) {
            (whole - experts).max(0.0) + experts * self.mesh.scale as f64 / self.e as f64
        } else {
            whole
        }
    }

    /// The casts every forward pays: under ZeRO-3 only, where Transformer Engine keeps no
    /// cast copy between micro-batches ([`Layer::cast_s`]); ZeRO-3 with nothing to shard
    /// prices as no ZeRO (see [`shard_options`]).
    #[inline]
    fn zero3_casts(&self) -> bool {
        self.zero == Zero::Parameters && self.sharded()
    }

    /// What [`Ctx::zero3_casts`] makes every forward pay.
    #[inline]
    fn microbatch_casts(&self, a: &RangeSums) -> f64 {
        if self.zero3_casts() {
            self.casts(a)
        } else {
            0.0
        }
    }

    /// The stage's compute per micro-batch: its layers' forward and backward and the casts
    /// each forward pays.
    #[inline]
    fn compute(&self, a: &RangeSums) -> f64 {
        a.compute_s + self.microbatch_casts(a)
    }

    /// One all-to-all of every MoE layer of `a` over the EP group (0 without EP).
    #[inline]
    fn all_to_all(&self, a: &RangeSums) -> f64 {
        self.prep.prob.all_to_all_s(
            a.dispatch_bytes as f64,
            a.moe_layers,
            self.e,
            self.mesh.ep_level,
            self.mesh.ep_stride,
        )
    }

    /// Whether ZeRO has more than one device to shard over: the ZeRO group, or the experts'
    /// ([`ExpertMesh::edp`]; folded, it may span the TP ranks of one replica).
    #[inline]
    fn sharded(&self) -> bool {
        self.zg > 1 || (self.mesh.apart(self.e) && self.mesh.edp > 1)
    }

    /// A device's part of `experts` bytes of the layers' experts (as traced at TP t): 1/e, or
    /// folded t/(k·e) ([`ExpertMesh::scale`]).
    #[inline]
    fn expert_share(&self, experts: u64) -> u64 {
        expert_share(experts, self.mesh.scale, self.e)
    }

    /// The allowed policy with the least `recompute_s` whose memory `mem(r)` fits (ties:
    /// lower index): a stage's ([`Ctx::fastest_fit`]) or an interleaved rank's.
    #[inline]
    fn fastest_policy(&self, recompute_s: &[f64; 3], mem: impl Fn(usize) -> u64) -> Option<usize> {
        let mut best: Option<usize> = None;
        for &r in self.policies {
            if mem(r) <= self.hbm && best.is_none_or(|b| recompute_s[r] < recompute_s[b]) {
                best = Some(r);
            }
        }
        best
    }

    /// The smallest memory any allowed policy gives.
    fn min_mem(&self, a: &RangeSums, f: u64) -> u64 {
        self.policies
            .iter()
            .map(|&r| self.mem(a, f, r))
            .min()
            .unwrap()
    }

    /// T_k of layers i..=j under policy r. The summation order is fixed (see module docs).
    #[inline]
    fn stage_time(&self, a: &RangeSums, r: usize, i: usize, j: usize) -> f64 {
        (((self.compute(a) + self.recompute(a)[r]) + self.p2p_in(i)) + self.p2p_out(j))
            + self.mb_comm(a, i, j)
    }

    /// The gradients' all-reduce over the DP group (see [`Ctx::over_dp`]).
    fn allreduce(&self, a: &RangeSums) -> f64 {
        let (bytes, experts) = self.on_wire(a.grad_bytes, a.expert_grad_bytes);
        self.over_dp(bytes, experts, Problem::ring_allreduce_s)
    }

    /// Gradient bytes as the DP collectives move them ([`Problem::grad_reduce_scale`]).
    #[inline]
    fn on_wire(&self, bytes: u64, experts: u64) -> (u64, u64) {
        let s = self.prep.prob.grad_reduce_scale;
        if s == 1.0 {
            return (bytes, experts);
        }
        let scale = |b: u64| (b as f64 * s).round() as u64;
        (scale(bytes), scale(experts).min(scale(bytes)))
    }

    /// A reduce-scatter or all-gather over the DP group of `bytes`, of which `experts` are
    /// the experts' (see [`Ctx::over_dp`]).
    fn half_ring(&self, bytes: u64, experts: u64) -> f64 {
        self.over_dp(bytes, experts, Problem::ring_reduce_scatter_s)
    }

    /// A DP collective `ring` (bytes, group, level, stride) of `bytes`, of which `experts` are
    /// the experts': over the d replicas, `dp_stride` apart; under EP the experts' 1/e per
    /// device separately, over the d/e replicas holding the same experts, e·`dp_stride` apart
    /// (folded: t/(k·e) over the t·c·d/(k·e) devices k·e apart, [`ExpertMesh`]). The experts'
    /// group spans the DP×CP group's devices, so it runs on its level.
    fn over_dp(
        &self,
        bytes: u64,
        experts: u64,
        ring: fn(&Problem, f64, u64, usize, u64) -> f64,
    ) -> f64 {
        let (prob, level, stride) = (self.prep.prob, self.dp_level, self.dp_stride);
        if !self.mesh.apart(self.e) {
            ring(prob, bytes as f64, self.zg, level, stride)
        } else {
            ring(prob, (bytes - experts) as f64, self.zg, level, stride)
                + ring(
                    prob,
                    self.expert_share(experts) as f64,
                    self.mesh.edp,
                    level,
                    self.mesh.edp_stride,
                )
        }
    }

    /// What a DP collective of `c` seconds adds to `behind` seconds of compute: all of it, or
    /// when `dp_overlap` what does not hide behind the compute, and at least what it takes
    /// from the compute beside it (the DP level's `collective_compute_share` of `c`: the two
    /// end at max(c, behind + share·min(c, behind))).
    #[inline]
    fn unhidden(&self, c: f64, behind: f64) -> f64 {
        self.unhidden_on(c, behind, self.dp_level)
    }

    /// [`Ctx::unhidden`] for a collective that runs on `level`, whose share of the compute it
    /// takes: HSDP's all-reduces cross the replicas' level, not the shard group's, and NCCL
    /// opens that level's channels for them (docs/design.md §6.5, HSDP).
    #[inline]
    fn unhidden_on(&self, c: f64, behind: f64, level: usize) -> f64 {
        if self.prep.prob.dp_overlap {
            let share = self.prep.prob.levels[level].collective_compute_share;
            (c - behind).max(share * c.min(behind))
        } else {
            c
        }
    }

    /// The collectives every micro-batch pays in the stage: ZeRO's ([`Ctx::zero_mb`]) and
    /// under EP the MoE layers' dispatch and combine all-to-alls, two in forward and two in
    /// backward, which nothing hides (the expert GEMMs wait for them).
    #[inline]
    fn mb_comm(&self, a: &RangeSums, i: usize, j: usize) -> f64 {
        self.zero_mb(a, i, j) + 4.0 * self.all_to_all(a)
    }

    /// ZeRO's per-micro-batch collectives, what of them is not hidden: ZeRO-2's gradient
    /// reduce-scatter, behind the backward; ZeRO-3's parameter all-gather behind the forward,
    /// again with the reduce-scatter behind the backward (none for ZeRO 0 and 1).
    /// Under ZeRO-3 also FSDP's copies of the stage's layers ([`Ctx::fsdp_copies`]).
    #[inline]
    fn zero_mb(&self, a: &RangeSums, i: usize, j: usize) -> f64 {
        let comm = if let Some(w) = &self.windows {
            self.zero_windows(w, i, j)
        } else {
            let ar = self.replica_allreduce(a.grad_bytes);
            match self.zero {
                Zero::Off | Zero::Optimizer => 0.0,
                Zero::Gradients => self.unhidden(self.grads_half_ring(a) + ar, a.bwd_s),
                Zero::Parameters => {
                    let ag = self.params_half_ring(a);
                    let rs = self.grads_half_ring(a);
                    self.unhidden(ag, a.fwd_s) + self.unhidden(ag + rs + ar, a.bwd_s)
                }
            }
        };
        self.with_fsdp_copies(comm, a)
    }

    /// `comm` with FSDP's copies of `a` added where they are priced (unchanged, not `+ 0.0`,
    /// where they are not: a plan without them keeps its floats).
    #[inline]
    fn with_fsdp_copies(&self, comm: f64, a: &RangeSums) -> f64 {
        match self.fsdp_copies(a) {
            Some(copies) => comm + copies,
            None => comm,
        }
    }

    /// FSDP's own kernels per micro-batch for the layers of `a` under ZeRO-3 (docs/design.md
    /// §6.5, "FSDP's copies"): their bytes read and written at the chip's memory-bound rate,
    /// every one added to the stage's time whatever its stream (a side stream's copy shares the
    /// SMs with the GEMMs beside it rather than running in their shadow). With P the
    /// layers' parameter bytes, P_g what their all-gathers move, G their gradient bytes, s the
    /// reduce dtype's bytes per gradient byte, k the fp32 master's per parameter byte and zg
    /// the shard group; every micro-batch gathers twice (forward and backward):
    ///
    /// * FSDP2 (torch 2.15, `_fully_shard/_fsdp_collectives.py`): per gather the shard cast to
    ///   the parameters' dtype (`_foreach_copy_` into `flat_foreach_copy_input`) and copied into
    ///   the all-gather input (`all_gather_copy_in`), (k + 1 + 2)·P/zg, and the copy out of the
    ///   gathered buffer into the parameters (`split_with_sizes_copy`), 2·P_g; per backward the
    ///   gradients copied into the reduce-scatter input in the reduce dtype (`_chunk_cat`),
    ///   (1 + s)·G, and the reduced shard cast to the master's dtype when they differ,
    ///   (s + k)·G/zg. No divides: bf16 and fp32 reduce with NCCL's `ReduceOp.AVG`.
    /// * FSDP1 (`FullyShardedDataParallel`; `_flat_param.py`, `_runtime_utils.py`; its forward
    ///   reads autograd-tracked views of the flat parameter whatever `use_orig_params`): per gather the shard cast to the low-precision `_mp_shard`,
    ///   (k + 1)·P/zg, gathered in place into the flat parameter (its views need no copy); per
    ///   backward the parameters' gradients concatenated into the flat gradient (autograd's
    ///   `split_with_sizes` backward), 2·G, cast to the reduce dtype where it differs, (1 + s)·G,
    ///   pre-divided in place, 2s·G, the shard post-divided, 2s·G/zg, and cast to the master's
    ///   dtype where they differ, (s + k)·G/zg.
    ///
    /// `None` outside ZeRO-3 over more than one device or when the problem does not price them.
    #[inline]
    fn fsdp_copies(&self, a: &RangeSums) -> Option<f64> {
        let c = self.prep.prob.fsdp_copies.as_ref()?;
        if self.zero != Zero::Parameters || !self.sharded() {
            return None;
        }
        // A device's bytes of a sum: under EP 1/e of the experts' (folded t/(k·e)). Its shard
        // is 1/zg of the layers' bytes whatever e (the experts' 1/e over zg/e replicas; folded
        // t/(k·e) over t·zg/(k·e) devices).
        let device =
            |bytes: u64, experts: u64| (bytes - experts) as f64 + self.expert_share(experts) as f64;
        let (gather, gather_experts) =
            gathered(a.gather_bytes, a.param_bytes, a.expert_param_bytes);
        let p_g = device(gather, gather_experts);
        let g = device(a.grad_bytes, a.expert_grad_bytes);
        let zg = self.zg as f64;
        let (p_shard, g_shard) = (a.param_bytes as f64 / zg, a.grad_bytes as f64 / zg);
        let (s, k) = (self.prep.prob.grad_reduce_scale, c.master_scale);
        let recast =
            |bytes: f64, from: f64, to: f64| if from == to { 0.0 } else { (from + to) * bytes };
        let bytes = match c.implementation {
            FsdpImplementation::Fsdp2 => {
                2.0 * ((k + 3.0) * p_shard + 2.0 * p_g) + (1.0 + s) * g + recast(g_shard, s, k)
            }
            FsdpImplementation::Fsdp1 => {
                2.0 * (k + 1.0) * p_shard
                    + 2.0 * g
                    + recast(g, 1.0, s)
                    + 2.0 * s * (g + g_shard)
                    + recast(g_shard, s, k)
            }
        };
        Some(bytes / c.bandwidth_bps)
    }

    /// [`Ctx::zero_mb`] of layers i..=j overlapped layer by layer ([`Windows`]): ZeRO-2's
    /// reduce-scatters, each beside the backward of the layer before it, the first layer's
    /// last and alone; ZeRO-3's all-gathers in forward (the first alone) and in backward (the
    /// last layer's alone), beside which the backward of layer l also has layer l+1's
    /// reduce-scatter, and the first layer's reduce-scatter at the end, alone.
    #[inline]
    fn zero_windows(&self, w: &Windows, i: usize, j: usize) -> f64 {
        // hide() of the stage's inner windows: prefix differences, never below 0 by rounding.
        let inner = |p: &[f64], lo: usize, hi: usize| {
            if hi > lo {
                (p[hi] - p[lo]).max(0.0)
            } else {
                0.0
            }
        };
        let (layers, rs, ag) = (&self.prep.layers, &w.rs, &w.ag);
        // HSDP: the all-reduces run on their own stream, each after its layer's
        // reduce-scatter: those of layers i+1..=j beside the backward of layers i..j-1, taking
        // the replicas' level's share of it, the first layer's after its reduce-scatter, alone
        // (0 without HSDP).
        let ar = if let Some((_, level, _)) = self.replicas {
            w.ar[i]
                + self.unhidden_on(
                    inner(&w.ar_sum, i + 1, j + 1),
                    inner(&w.bwd_sum, i, j),
                    level,
                )
        } else {
            0.0
        };
        if self.zero == Zero::Gradients {
            // Layers i+1..=j: each one's reduce-scatter beside the backward of the one before.
            return rs[i] + inner(&w.grads, i, j) + ar;
        }
        let fwd = ag[i] + inner(&w.fwd, i, j);
        let bwd = if i == j {
            ag[j] + rs[i]
        } else {
            ag[j]
                + self.unhidden(ag[j - 1], layers[j].bwd_s)
                + inner(&w.bwd, i + 1, j)
                + self.unhidden(rs[i + 1], layers[i].bwd_s)
                + rs[i]
        };
        fwd + bwd + ar
    }

    /// A stage's (or an interleaved rank's) time per micro-batch under policy r by part, with
    /// `p2p_s` its boundary transfers: they add up to its time ([`Ctx::stage_time`],
    /// [`Rank::time`]) but for rounding. EP's all-to-alls are their own part, those a full
    /// recompute's second forward pays included.
    fn time_parts(&self, a: &RangeSums, r: usize, p2p_s: f64, zero_s: f64) -> TimeParts {
        let a2a = self.all_to_all(a);
        TimeParts {
            compute_s: self.compute(a),
            recompute_s: a.recompute_s[r]
                + if r == 2 {
                    self.microbatch_casts(a)
                } else {
                    0.0
                },
            pp_comm_s: p2p_s,
            zero_comm_s: zero_s,
            ep_comm_s: 4.0 * a2a + if r == 2 { 2.0 * a2a } else { 0.0 },
        }
    }

    /// O_k: the stage's optimizer step, once per batch after the flush, on one device: its
    /// layers' `opt_s`; from ZeRO-1 on each of the d replicas updates 1/d of the state
    /// (experts' included: 1/e of them over the d/e replicas that hold them is 1/d too);
    /// without ZeRO, EP leaves each device 1/e of the experts' update. Below ZeRO-3 the step's
    /// FP8 weight casts, once per batch ([`Layer::cast_s`]), are here too: every replica casts
    /// all the weights it holds.
    #[inline]
    fn optimizer(&self, a: &RangeSums) -> f64 {
        let casts = if self.zero3_casts() {
            0.0
        } else {
            self.casts(a)
        };
        self.update(a) + casts
    }

    /// The optimizer's update of [`Ctx::optimizer`].
    #[inline]
    fn update(&self, a: &RangeSums) -> f64 {
        if self.zero >= Zero::Optimizer {
            a.opt_s / self.zg as f64
        } else {
            self.device_part(a.opt_s, a.expert_opt_s)
        }
    }

    #[inline]
    fn grads_half_ring(&self, a: &RangeSums) -> f64 {
        let (bytes, experts) = self.on_wire(a.grad_bytes, a.expert_grad_bytes);
        self.half_ring(bytes, experts)
    }

    #[inline]
    fn params_half_ring(&self, a: &RangeSums) -> f64 {
        let (bytes, experts) = gathered(a.gather_bytes, a.param_bytes, a.expert_param_bytes);
        self.half_ring(bytes, experts)
    }

    /// E_k: the DP collectives paid once per step, less what hides behind the stage's last
    /// backward (the gradients) and first forward (the parameters) when overlapped: ZeRO-0 the
    /// gradient all-reduce; ZeRO-1 its reduce-scatter and the parameters' all-gather; ZeRO-2
    /// the all-gather; ZeRO-3 nothing (its collectives are per micro-batch, [`Ctx::mb_comm`]).
    #[inline]
    fn exposed(&self, a: &RangeSums) -> f64 {
        match self.zero {
            Zero::Off => self.unhidden(self.allreduce(a), a.bwd_s),
            Zero::Optimizer => {
                self.unhidden(self.grads_half_ring(a), a.bwd_s)
                    + self.unhidden(self.params_half_ring(a), a.fwd_s)
            }
            Zero::Gradients => self.unhidden(self.params_half_ring(a), a.fwd_s),
            Zero::Parameters => 0.0,
        }
    }

    /// The stage's DP collective time per step before any overlap (per-micro-batch ones
    /// counted m times).
    fn dp_comm(&self, a: &RangeSums) -> f64 {
        let m = self.m as f64;
        match self.zero {
            Zero::Off => self.allreduce(a),
            Zero::Optimizer => self.grads_half_ring(a) + self.params_half_ring(a),
            Zero::Gradients => {
                m * (self.grads_half_ring(a) + self.replica_allreduce(a.grad_bytes))
                    + self.params_half_ring(a)
            }
            Zero::Parameters => {
                let ag = self.params_half_ring(a);
                m * (ag + ag + self.grads_half_ring(a) + self.replica_allreduce(a.grad_bytes))
            }
        }
    }

    /// The objective's factor m + p − 1.
    #[inline]
    fn factor(&self, p: usize) -> f64 {
        (self.m + p as u64 - 1) as f64
    }
}

/// What a parameter all-gather moves of `param` bytes, `experts` of them the experts', when it
/// moves `gather` bytes in all: the experts' part in the same proportion.
#[inline]
fn gathered(gather: u64, param: u64, experts: u64) -> (u64, u64) {
    if gather >= param || param == 0 {
        return (param, experts);
    }
    let scaled = (experts as f64 * gather as f64 / param as f64).round() as u64;
    (gather, scaled.min(gather))
}

/// A point of a front: (max T, max E, max O) of a suffix's stages.
type Point = (f64, f64, f64);

/// Pareto fronts F[s][i] of (max T, max E, max O) over suffixes that start at layer i and are
/// cut into s stages, in one arena. Buffers are reused between DP runs.
#[derive(Default)]
struct SuffixFronts {
    n: usize,
    idx: Vec<(u32, u32)>,
    arena: Vec<Point>,
    scratch: Vec<Vec<Point>>,
}

impl SuffixFronts {
    fn reset(&mut self, s_max: usize, n: usize) {
        self.n = n;
        self.idx.clear();
        self.idx.resize((s_max + 1) * n, (0, 0));
        self.arena.clear();
        if self.scratch.len() < s_max + 1 {
            self.scratch.resize(s_max + 1, Vec::new());
        }
    }

    fn front(&self, s: usize, i: usize) -> &[Point] {
        let (start, len) = self.idx[s * self.n + i];
        &self.arena[start as usize..(start + len) as usize]
    }
}

/// Adds (t, e, o) to a Pareto front (minimizing all three), unless a member weakly dominates it.
#[inline]
fn insert(front: &mut Vec<Point>, (t, e, o): Point) {
    if front
        .iter()
        .any(|&(ft, fe, fo)| ft <= t && fe <= e && fo <= o)
    {
        return;
    }
    front.retain(|&(ft, fe, fo)| !(t <= ft && e <= fe && o <= fo));
    front.push((t, e, o));
}

/// Fills F[s][i] for s = 1..=s_max. Entries whose lower bound (m + s − 1)·T + E + O exceeds
/// `bound` are dropped: every completion to p ≥ s stages costs at least that much.
fn run_dp(ctx: &Ctx, s_max: usize, bound: f64, fronts: &mut SuffixFronts) {
    let prep = ctx.prep;
    let n = prep.n;
    let m = ctx.m;
    fronts.reset(s_max, n);
    let SuffixFronts {
        idx,
        arena,
        scratch,
        ..
    } = fronts;
    for i in (0..n).rev() {
        // One stage: layers i..n-1, the last stage, with min(1, m) = 1 micro-batch in flight.
        let start = arena.len() as u32;
        let a = prep.range(i, n - 1);
        if let Some(r) = ctx.fastest_fit(&a, 1) {
            let t = ctx.stage_time(&a, r, i, n - 1);
            let e = ctx.exposed(&a);
            let o = ctx.optimizer(&a);
            if objective(ctx.factor(1), t, e, o) <= bound {
                arena.push((t, e, o));
            }
        }
        idx[n + i] = (start, arena.len() as u32 - start);

        let s_hi = s_max.min(n - i);
        if s_hi < 2 {
            continue;
        }
        for f in scratch.iter_mut().take(s_hi + 1) {
            f.clear();
        }
        let mut a = RangeSums::default();
        let t_in = ctx.p2p_in(i);
        // First stage of the suffix = layers i..=j; the other s-1 stages need >= s-1 layers.
        for j in i..n - 1 {
            prep.push(&mut a, j);
            let s_top = s_hi.min(n - j);
            if s_top < 2 {
                break;
            }
            // Lower bound of this stage's time for every policy and every longer range; its
            // optimizer step only grows with the range too.
            let t_lb = a.compute_s + t_in;
            let t_out = ctx.p2p_out(j);
            let e = ctx.exposed(&a);
            let o = ctx.optimizer(&a);
            let mb = ctx.mb_comm(&a, i, j);
            let rc = ctx.recompute(&a);
            let mut alive = false;
            for s in 2..=s_top {
                // Memory grows with s (more in flight): once nothing fits, stop.
                let Some(r) = ctx.fastest_fit(&a, (s as u64).min(m)) else {
                    break;
                };
                let k = ctx.factor(s);
                if k * t_lb + o > bound {
                    break;
                }
                alive = true;
                let t = (((ctx.compute(&a) + rc[r]) + t_in) + t_out) + mb;
                let (start, len) = idx[(s - 1) * n + j + 1];
                for &(ts, es, os) in &arena[start as usize..(start + len) as usize] {
                    let c = (t.max(ts), e.max(es), o.max(os));
                    if objective(k, c.0, c.1, c.2) <= bound {
                        insert(&mut scratch[s], c);
                    }
                }
            }
            // Nothing fit (or everything exceeded the bound) at the smallest s: a longer first
            // stage only needs more memory and more time.
            if !alive {
                break;
            }
        }
        for (s, f) in scratch.iter().enumerate().take(s_hi + 1).skip(2) {
            let start = arena.len() as u32;
            arena.extend_from_slice(f);
            idx[s * n + i] = (start, f.len() as u32);
        }
    }
}

/// Best objective of p stages from a filled table.
fn best_value(ctx: &Ctx, fronts: &SuffixFronts, p: usize) -> Option<f64> {
    let k = ctx.factor(p);
    fronts
        .front(p, 0)
        .iter()
        .map(|&(t, e, o)| objective(k, t, e, o))
        .min_by(f64::total_cmp)
}

/// One stage of a plan being rebuilt: layers `first..=last`, their sums, the micro-batches in
/// flight, the recompute policy, and the stage's time, exposed DP all-reduce and optimizer
/// step.
struct StageChoice {
    first: usize,
    last: usize,
    sums: RangeSums,
    in_flight: u64,
    policy: usize,
    time_s: f64,
    exposed_s: f64,
    optimizer_s: f64,
}

/// Rebuilds the lexicographically smallest plan with objective <= bound from filled fronts
/// (s_max >= p): stage ends first, then policies.
fn reconstruct(ctx: &Ctx, fronts: &SuffixFronts, p: usize, bound: f64) -> Plan {
    let mut stages = choose_split(ctx, fronts, p, bound);
    lower_policies(ctx, &mut stages, p, bound);
    assemble_plan(ctx, &stages, p)
}

/// The split, greedily: the shortest first stage that still admits a completion within
/// `bound` (which the suffix fronts answer exactly), each stage at its fastest fitting policy.
fn choose_split(ctx: &Ctx, fronts: &SuffixFronts, p: usize, bound: f64) -> Vec<StageChoice> {
    let prep = ctx.prep;
    let n = prep.n;
    let k_obj = ctx.factor(p);
    let mut stages: Vec<StageChoice> = Vec::with_capacity(p);
    // The largest stage time, exposed all-reduce and optimizer step of the stages chosen so far.
    let (mut max_t, mut max_e, mut max_o) = (0.0f64, 0.0f64, 0.0f64);
    let mut first = 0;
    for k in 0..p {
        let s = p - k;
        let in_flight = (s as u64).min(ctx.m);
        let mut sums = RangeSums::default();
        let mut chosen = None;
        for last in first..=n - s {
            prep.push(&mut sums, last);
            if s == 1 && last < n - 1 {
                continue;
            }
            let Some(policy) = ctx.fastest_fit(&sums, in_flight) else {
                break;
            };
            let t = ctx.stage_time(&sums, policy, first, last);
            let e = ctx.exposed(&sums);
            let o = ctx.optimizer(&sums);
            let (ct, ce, co) = (max_t.max(t), max_e.max(e), max_o.max(o));
            let completes = if s == 1 {
                objective(k_obj, ct, ce, co) <= bound
            } else {
                fronts.front(s - 1, last + 1).iter().any(|&(ts, es, os)| {
                    objective(k_obj, ct.max(ts), ce.max(es), co.max(os)) <= bound
                })
            };
            if completes {
                chosen = Some(StageChoice {
                    first,
                    last,
                    sums,
                    in_flight,
                    policy,
                    time_s: t,
                    exposed_s: e,
                    optimizer_s: o,
                });
                break;
            }
        }
        let c = chosen.expect("phaze-dp: reconstruction found no stage the DP promised");
        max_t = max_t.max(c.time_s);
        max_e = max_e.max(c.exposed_s);
        max_o = max_o.max(c.optimizer_s);
        first = c.last + 1;
        stages.push(c);
    }
    stages
}

/// The lowest policy index per stage, stage by stage, that keeps the objective within `bound`,
/// with the other stages at their current policy (the later ones still at their fastest: the
/// most permissive completion).
fn lower_policies(ctx: &Ctx, stages: &mut [StageChoice], p: usize, bound: f64) {
    let max_e = stages.iter().map(|s| s.exposed_s).fold(0.0f64, f64::max);
    let max_o = stages.iter().map(|s| s.optimizer_s).fold(0.0f64, f64::max);
    let mut policy: Vec<usize> = stages.iter().map(|s| s.policy).collect();
    let mut times: Vec<f64> = stages.iter().map(|s| s.time_s).collect();
    lower_to_bound(
        ctx,
        (ctx.factor(p), max_e, max_o, bound),
        &mut policy,
        &mut times,
        |k, r| ctx.stage_time(&stages[k].sums, r, stages[k].first, stages[k].last),
        |k, r| ctx.mem(&stages[k].sums, stages[k].in_flight, r) <= ctx.hbm,
    );
    for (s, (r, t)) in stages.iter_mut().zip(policy.into_iter().zip(times)) {
        s.policy = r;
        s.time_s = t;
    }
}

/// Stage by stage (or rank by rank), the lowest allowed policy index that fits (`fits(k, r)`)
/// and keeps `factor · max_k T_k + max_e + max_o` within `bound` (the policy changes neither
/// E nor O), with the other stages at their
/// current policy: the earlier ones already lowered, the later ones still at their fastest
/// (the most permissive completion), which yields the lexicographically smallest policies.
/// `time(k, r)` is stage k's time under r; `policy` and `times` start at the fastest fitting.
fn lower_to_bound(
    ctx: &Ctx,
    (factor, max_e, max_o, bound): (f64, f64, f64, f64),
    policy: &mut [usize],
    times: &mut [f64],
    time: impl Fn(usize, usize) -> f64,
    fits: impl Fn(usize, usize) -> bool,
) {
    for k in 0..policy.len() {
        let rest_t = (0..times.len())
            .filter(|&q| q != k)
            .map(|q| times[q])
            .fold(0.0f64, f64::max);
        for &r in ctx.policies {
            if r == policy[k] {
                break; // the current (fastest) policy is within bound by construction
            }
            if !fits(k, r) {
                continue;
            }
            let t = time(k, r);
            if objective(factor, rest_t.max(t), max_e, max_o) <= bound {
                policy[k] = r;
                times[k] = t;
                break;
            }
        }
    }
}

/// The plan of the chosen stages, with its numbers.
fn assemble_plan(ctx: &Ctx, chosen: &[StageChoice], p: usize) -> Plan {
    let prob = ctx.prep.prob;
    let stages: Vec<Stage> = chosen
        .iter()
        .enumerate()
        .map(|(k, s)| {
            let memory = ctx.mem_parts(&s.sums, s.in_flight, s.policy);
            let p2p = ctx.p2p_in(s.first) + ctx.p2p_out(s.last);
            Stage {
                rank: k,
                first_layer: s.first,
                last_layer: s.last,
                devices: prob.tp,
                time_s: s.time_s,
                time_parts: ctx.time_parts(
                    &s.sums,
                    s.policy,
                    p2p,
                    ctx.zero_mb(&s.sums, s.first, s.last),
                ),
                memory_bytes: memory.total(),
                memory,
                recompute: Recompute::from_index(s.policy).unwrap(),
                in_flight: s.in_flight,
                dp_comm_s: ctx.dp_comm(&s.sums),
                exposed_dp_s: s.exposed_s,
                optimizer_s: s.optimizer_s,
            }
        })
        .collect();
    plan_of_stages(ctx, p, 1, ctx.factor(p), stages)
}

/// The plan of `stages` (of p ranks with v chunks each), its time per batch
/// `factor · max T + max E + max O` (`factor`: the schedule's, m + p − 1 or m + (p − 1)/v).
fn plan_of_stages(ctx: &Ctx, p: usize, v: u64, factor: f64, stages: Vec<Stage>) -> Plan {
    let prob = ctx.prep.prob;
    let max_t = stages.iter().map(|s| s.time_s).fold(0.0, f64::max);
    let max_e = stages.iter().map(|s| s.exposed_dp_s).fold(0.0, f64::max);
    let max_o = stages.iter().map(|s| s.optimizer_s).fold(0.0, f64::max);
    let time = objective(factor, max_t, max_e, max_o);
    Plan {
        dp: ctx.d,
        pp: p,
        virtual_stages: v,
        zero: ctx.zero,
        expert_parallel: ctx.e,
        rank_order: ctx.order,
        tp: prob.tp,
        cp: prob.cp,
        micro_batch: prob.micro_batch,
        num_micro_batches: ctx.m,
        global_batch: prob.global_batch,
        time_per_batch_s: time,
        throughput_samples_per_s: prob.global_batch as f64 / time,
        devices_used: ctx.g * p as u64 * prob.tp,
        max_stage_time_s: max_t,
        max_exposed_dp_s: max_e,
        max_optimizer_s: max_o,
        max_memory_bytes: stages.iter().map(|s| s.memory_bytes).max().unwrap_or(0),
        stages,
    }
}

/// G[s][i]: the least possible largest-stage memory of a suffix from layer i cut into s
/// stages (policy per stage = the allowed one with least memory). Flat, indexed s * n + i.
fn min_max_memory(ctx: &Ctx, s_max: usize) -> Vec<u64> {
    let prep = ctx.prep;
    let n = prep.n;
    let m = ctx.m;
    let mut g = vec![u64::MAX; (s_max + 1) * n];
    for i in (0..n).rev() {
        g[n + i] = ctx.min_mem(&prep.range(i, n - 1), 1);
        let s_hi = s_max.min(n - i);
        let mut a = RangeSums::default();
        for j in i..n - 1 {
            prep.push(&mut a, j);
            for s in 2..=s_hi.min(n - j) {
                let v = ctx
                    .min_mem(&a, (s as u64).min(m))
                    .max(g[(s - 1) * n + j + 1]);
                let cell = &mut g[s * n + i];
                *cell = (*cell).min(v);
            }
        }
    }
    g
}

/// The DP degrees d with b·d | B and d·t <= N, ascending.
fn dp_degrees(prob: &Problem) -> Vec<u64> {
    let q = prob.global_batch / prob.micro_batch;
    let limit = q.min(prob.devices / (prob.tp * prob.cp));
    let mut ds = Vec::new();
    if limit <= 1 << 16 {
        ds.extend((1..=limit).filter(|&d| q.is_multiple_of(d)));
        ds.retain(|&d| hsdp_divides(prob, d));
    } else {
        // Trial division up to sqrt(q), so huge N costs nothing.
        let mut x = 1u64;
        while x.saturating_mul(x) <= q {
            if q.is_multiple_of(x) {
                ds.push(x);
                if x != q / x {
                    ds.push(q / x);
                }
            }
            x += 1;
        }
        ds.retain(|&d| d <= limit && hsdp_divides(prob, d));
        ds.sort_unstable();
    }
    ds
}

/// Whether HSDP's shard group ([`Problem::dp_shard`]) divides the DP×CP group d·c (always
/// without HSDP): a 2-D mesh of shard × replicate ranks.
fn hsdp_divides(prob: &Problem, d: u64) -> bool {
    prob.dp_shard
        .is_none_or(|s| (d * prob.cp).is_multiple_of(s))
}

/// Largest stage count for DP degree d.
fn p_max(prob: &Problem, d: u64) -> usize {
    let by_devices = prob.devices / (d * prob.tp * prob.cp);
    let mut pm = prob
        .layers
        .len()
        .min(usize::try_from(by_devices).unwrap_or(usize::MAX));
    if let Some(ms) = prob.max_stages {
        pm = pm.min(ms);
    }
    pm
}

/// Groups p = 1..=pmax by the network they use under the shard's rank order (p2p level;
/// DP level and the DP ring's bandwidth, which depend on p through the DP group's stride or
/// not at all, [`RankOrder::strides`]; under EP e also the all-to-all's level and bandwidth
/// and the experts' DP ring's); one DP run serves a whole group, priced at its largest p (all
/// p in it share every level and bandwidth). p = 1 has no p2p, so it joins p = 2's group
/// when it can.
fn classes(prob: &Problem, d: u64, shard: Shard, pmax: usize) -> Vec<(usize, Vec<usize>)> {
    let (t, e, g) = (prob.tp, shard.e, d * prob.cp);
    // ((p2p level, its bandwidth's bits), DP level, DP ring's key, EP level, all-to-all's and
    // experts' DP ring's keys; a ring's key is its bandwidth's bits, its steps and, on a level
    // with `tree`, the tree's chain and depth, `Problem::ring_key`).
    type Key = ((usize, u64), usize, RingKey, usize, RingKey, RingKey);
    let key = |p: usize| -> Key {
        let q = p.max(2) as u64;
        let pp_stride = shard.o.strides(g, q, t).1;
        let pp_level = prob.level_for(q * pp_stride);
        let pp = (
            pp_level,
            prob.p2p_bandwidth_bps(pp_level, pp_stride).to_bits(),
        );
        let (stride, _) = shard.o.strides(g, p as u64, t);
        let (level, bw) = if g > 1 {
            let level = prob.level_for(g * stride);
            (level, prob.ring_key(g, level, stride))
        } else {
            (0, (0, 0, 0, 0))
        };
        let mesh = ExpertMesh::new(prob, g, g, stride, e);
        if mesh.apart(e) {
            let a2a = prob.ring_key(e, mesh.ep_level, mesh.ep_stride);
            let experts = prob.ring_key(mesh.edp, level, mesh.edp_stride);
            (pp, level, bw, mesh.ep_level, a2a, experts)
        } else {
            (pp, level, bw, 0, (0, 0, 0, 0), (0, 0, 0, 0))
        }
    };
    let mut out: Vec<(Key, Vec<usize>)> = Vec::new();
    for p in 1..=pmax {
        let k = key(p);
        match out.iter_mut().find(|(kk, _)| *kk == k) {
            Some((_, ps)) => ps.push(p),
            None => out.push((k, vec![p])),
        }
    }
    out.into_iter()
        .map(|(_, ps)| (*ps.last().unwrap(), ps))
        .collect()
}

/// What an EP degree must divide, in a message's words ([`Problem::expert_parallel_room`]).
fn ep_group_words(prob: &Problem) -> String {
    if prob.experts_folded() {
        format!(
            "needs e·{} (ETP) to divide a stage's t·c·d devices (Megatron-core's expert mesh \
             ETP × EP × EDP)",
            prob.expert_tp()
        )
    } else {
        "needs a DP degree d that e divides (the EP group is e of the d replicas)".into()
    }
}

/// The settings a user fixed, for memory messages, in the flags' words: `, recompute full,
/// ZeRO 1, interleaved:3`, or '' when everything is left to the search.
fn fixed_settings(prob: &Problem) -> String {
    let mut out = String::new();
    if let Some(r) = prob.recompute {
        out.push_str(&format!(", recompute {}", r.as_str()));
    }
    if let Some(z) = prob.zero {
        out.push_str(&format!(", ZeRO {}", z.stage()));
    }
    match prob.virtual_stages {
        Some(1) => out.push_str(", 1F1B"),
        Some(v) => out.push_str(&format!(", interleaved:{v}")),
        None => {}
    }
    if let Some(e) = prob.expert_parallel.filter(|&e| e > 1) {
        out.push_str(&format!(", EP {e}"));
    }
    if prob.experts_folded() {
        out.push_str(&format!(", ETP {}", prob.expert_tp()));
    }
    out
}

/// Bytes for a message: binary units (GiB, 2^30 bytes, from 1 GiB; else MiB or KiB: the units
/// memory is said in everywhere a person reads it) with the exact count beside them.
fn bytes_said(bytes: u64) -> String {
    let (scale, unit) = match bytes {
        b if b >= 1 << 30 => (1u64 << 30, "GiB"),
        b if b >= 1 << 20 => (1u64 << 20, "MiB"),
        _ => (1u64 << 10, "KiB"),
    };
    format!("{:.1} {unit} ({bytes} bytes)", bytes as f64 / scale as f64)
}

// ---- interleaved 1F1B -----------------------------------------------------------------------
//
// Megatron-LM's interleaved schedule (Narayanan et al., SC'21, §2.2): the blocks are split
// into p·v model chunks, chunk c on pipeline rank c mod p; the layers before the blocks
// (embeddings) join chunk 0 and the layers after them (head) the last chunk. The split is fixed
// by (p, v) ([`interleave_split`]), so there is no split to search: each (d, p, v, ZeRO stage)
// is priced directly.

/// The blocks of each of the p·v chunks as Megatron-LM builds them, in chunk order (chunk 0 also
/// holds the layers before the blocks, the last chunk those after them):
///
/// * evenly when p·v divides the blocks; else counting the embedding and/or the loss as one
///   block each, `--account-for-embedding-in-pipeline-split` / `--account-for-loss-in-pipeline-split`
///   (megatron/core/transformer/transformer_block.py `get_num_layers_to_build` at d98e8a64: the
///   blocks plus the counted ones split evenly, the first chunk building one block fewer for the
///   embedding and the last one fewer for the loss), tried as (both, embedding, loss), which is
///   how Llama 3.1 405B's 126 blocks run on PP 8 × VP 8;
/// * else as a `--pipeline-model-parallel-layout` (megatron/core/transformer/
///   pipeline_parallel_layer_layout.py) laid out as NeMo lays out DeepSeek-V3's 61 blocks
///   (`map_pp_vp_to_layout` in scripts/performance/llm/pretrain_deepseek_v3.py at NeMo 9244b1ec,
///   the launcher of NVIDIA's DGX Cloud DeepSeek-V3 runs; e.g. PP 8 × VP 2: the embedding and 4
///   blocks, 14 chunks of 4, 1 block and the loss): ⌈B/(p·v)⌉ blocks a chunk from the first on,
///   the last chunk the rest. Where that leaves later chunks none (61 over 32 chunks), each chunk
///   takes fewer so that every later chunk keeps one block: the same layout wherever NeMo's
///   table has one, defined for any B >= p·v.
///
/// `None` when p·v exceeds the blocks (some chunk would hold none).
fn interleave_split(blocks: usize, chunks: usize) -> Option<Vec<usize>> {
    if chunks == 0 || blocks < chunks {
        return None;
    }
    for (e, l) in [(0, 0), (1, 1), (1, 0), (0, 1)] {
        let units = blocks + e + l;
        if units.is_multiple_of(chunks) && units / chunks > e.max(l) {
            let mut sizes = vec![units / chunks; chunks];
            sizes[0] -= e;
            sizes[chunks - 1] -= l;
            return Some(sizes);
        }
    }
    let per = blocks.div_ceil(chunks);
    let mut left = blocks;
    Some(
        (0..chunks)
            .map(|c| {
                let after = chunks - 1 - c;
                let take = if after == 0 {
                    left
                } else {
                    per.min(left - after)
                };
                left -= take;
                take
            })
            .collect(),
    )
}

/// Whether v >= 2 chunks per rank are possible at p stages and m micro-batches: p >= 2, a block
/// for each of the p·v chunks ([`interleave_split`]), and p divides m (Megatron-LM requires it
/// of the interleaved schedule).
fn interleave_allowed(prob: &Problem, p: usize, v: u64, m: u64) -> bool {
    let (_, blocks) = prob.block_range();
    v >= 2
        && p >= 2
        && interleave_split(blocks, p * v as usize).is_some()
        && m.is_multiple_of(p as u64)
}

/// The chunk counts v >= 2 to try at (p, m): the fixed one if it is allowed, or with the search
/// choosing, every allowed one; none for plain 1F1B.
fn interleave_options(prob: &Problem, p: usize, m: u64) -> Vec<u64> {
    let (_, blocks) = prob.block_range();
    match prob.virtual_stages {
        Some(v) if interleave_allowed(prob, p, v, m) => vec![v],
        Some(_) => Vec::new(),
        None => (2..=(blocks / p.max(1)) as u64)
            .filter(|&v| interleave_allowed(prob, p, v, m))
            .collect(),
    }
}

/// The layers (first, last) of each of the p·v chunks, split as [`interleave_split`] says.
fn chunk_layers(prob: &Problem, p: usize, v: u64) -> Vec<(usize, usize)> {
    let (first, blocks) = prob.block_range();
    let sizes = interleave_split(blocks, p * v as usize).expect("an allowed interleaving");
    let last = sizes.len() - 1;
    let mut next = first;
    sizes
        .iter()
        .enumerate()
        .map(|(c, &n)| {
            let lo = if c == 0 { 0 } else { next };
            next += n;
            let hi = if c == last {
                prob.layers.len() - 1
            } else {
                next - 1
            };
            (lo, hi)
        })
        .collect()
}

/// One pipeline rank under interleaving: the sums over the layers of its v chunks, their
/// boundary transfers, and its peak stash per policy.
struct Rank {
    sums: RangeSums,
    /// Every boundary transfer of its chunks per micro-batch: in and out, forward and back.
    p2p_s: f64,
    /// Of `p2p_s`, the forward sends (one transfer per chunk that is not the model's last),
    /// which the compute stream waits for ([`Rank::p2p_exposed`]).
    fwd_send_s: f64,
    /// ZeRO's per-micro-batch collectives of its chunks, each chunk's own ([`Ctx::zero_mb`]).
    zero_s: f64,
    stash: [u64; 3],
    in_flight: u64,
}

/// The p ranks at (p, v), with the peak stash of Megatron-LM's interleaved schedule
/// (`forward_backward_pipelining_with_interleaving`). Rank k runs U = v·m forward units
/// (chunk-micro-batches) and U backward units: forward unit u is on its chunk
/// `(u mod p·v) / p`, backward unit u on chunk `v − 1 − (u mod p·v) / p`. It first runs
/// `W = min(2(p − k − 1) + (v − 1)·p, U)` forwards (the warm-up), then alternates one forward
/// (unit W + i) and one backward (unit i). The stash after the forward of step i is
/// `Σ_{u <= W+i} saved(fwd chunk) − Σ_{u < i} saved(bwd chunk)`; both sequences repeat every
/// p·v units with the same sums, so the peak is reached within one period of steps. With equal
/// chunks it is `(1 + (p − 1)/(p·v))` times the plain 1F1B stash of the first rank
/// (Korthikanti et al. 2022, §4.2.3); with unequal ones (the embedding and head chunks) it is
/// computed exactly.
fn ranks(ctx: &Ctx, p: usize, v: u64) -> Vec<Rank> {
    let prep = ctx.prep;
    let pu = p as u64;
    let layers = chunk_layers(prep.prob, p, v);
    (0..p)
        .map(|k| {
            let mut sums = RangeSums::default();
            let mut p2p_s = 0.0;
            let mut fwd_send_s = 0.0;
            let mut windows_s = 0.0;
            let mut chunk_saved = Vec::with_capacity(v as usize);
            for j in 0..v as usize {
                let (lo, hi) = layers[k + j * p];
                chunk_saved.push(prep.range(lo, hi).saved_bytes);
                if let Some(w) = &ctx.windows {
                    windows_s += ctx.zero_windows(w, lo, hi);
                }
                for l in lo..=hi {
                    prep.push(&mut sums, l);
                }
                p2p_s += ctx.p2p_in(lo) + ctx.p2p_out(hi);
                // cut is the two transfers of a boundary (activation, gradient): one is the send.
                fwd_send_s += 0.5 * ctx.p2p_out(hi);
            }
            // Overlapped layer by layer, each chunk's windows; else the rank's sums.
            let zero_s = if ctx.windows.is_some() {
                ctx.with_fsdp_copies(windows_s, &sums)
            } else {
                ctx.zero_mb(&sums, 0, 0)
            };
            let units = v * ctx.m;
            let warmup = (2 * (pu - 1 - k as u64) + (v - 1) * pu).min(units);
            let fwd_chunk = |u: u64| ((u % (pu * v)) / pu) as usize;
            let bwd_chunk = |u: u64| (v - 1 - (u % (pu * v)) / pu) as usize;
            let mut stash = [0u64; 3];
            for r in 0..3 {
                // i128: the running stash goes up and down; its peak is what is kept.
                let mut now: i128 = 0;
                for u in 0..warmup {
                    now += i128::from(chunk_saved[fwd_chunk(u)][r]);
                }
                let mut peak = now;
                for i in 0..(units - warmup).min(pu * v) {
                    now += i128::from(chunk_saved[fwd_chunk(warmup + i)][r]);
                    peak = peak.max(now);
                    now -= i128::from(chunk_saved[bwd_chunk(i)][r]);
                }
                stash[r] = u64::try_from(peak).unwrap_or(u64::MAX);
            }
            Rank {
                sums,
                p2p_s,
                fwd_send_s,
                zero_s,
                stash,
                in_flight: (warmup + 1).min(units),
            }
        })
        .collect()
}

impl Rank {
    /// Time per micro-batch under policy r: its chunks' compute and recompute, what their
    /// boundary transfers (v× those of one stage) leave exposed ([`Rank::p2p_exposed`]), and the
    /// per-micro-batch DP collectives.
    fn time(&self, ctx: &Ctx, r: usize) -> f64 {
        let work = ctx.compute(&self.sums) + ctx.recompute(&self.sums)[r];
        (work + self.p2p_exposed(ctx, r)) + (self.zero_s + 4.0 * ctx.all_to_all(&self.sums))
    }

    /// The rank's boundary transfers per micro-batch that its compute does not hide
    /// (docs/design.md §6.6). Megatron-LM overlaps the interleaved schedule's receives and its
    /// backward sends with the chunks' compute (`overlap_p2p_comm`, on by default with virtual
    /// stages: `validate_args` at d98e8a64 turns it off only without them): c seconds of them
    /// beside w of compute end at max(c, w + f·min(c, w)), f the pipeline level's
    /// `collective_compute_share`. Its forward sends it does not: Megatron-LM's training sets
    /// `deallocate_pipeline_outputs` (`megatron/training/argument_utils.py` at d98e8a64), so
    /// `forward_backward_pipelining_with_interleaving` (`schedules.py`) waits on each chunk's
    /// `send_next` right after posting it, before the next compute on the stream, in the
    /// steady state and (blocking `send_forward_recv_forward`) in the warm-up alike: one
    /// transfer per chunk on the critical path.
    fn p2p_exposed(&self, ctx: &Ctx, r: usize) -> f64 {
        let work = ctx.compute(&self.sums) + ctx.recompute(&self.sums)[r];
        if self.p2p_s <= 0.0 {
            return 0.0;
        }
        let overlapped = self.p2p_s - self.fwd_send_s;
        self.fwd_send_s + (overlapped - work).max(ctx.pp_share * overlapped.min(work))
    }

    fn mem(&self, ctx: &Ctx, r: usize) -> u64 {
        ctx.stash_mem(&self.sums, self.stash[r], r)
    }

    /// [`Rank::mem`] by part: the rank's v chunks together, with the schedule's peak stash.
    fn mem_parts(&self, ctx: &Ctx, r: usize) -> MemoryParts {
        ctx.parts(&self.sums, self.stash[r], r)
    }
}

/// The interleaved plan at (ctx's d and ZeRO stage, p, v): each rank at its fastest policy that
/// fits, then, rank by rank, the lowest policy index that keeps the objective within `bound`
/// (as [`lower_policies`]; `None`: the tie bound of this option's own optimum). Time per batch `(m + (p − 1)/v) · max_k T_k + max_k E_k + max_k O_k`
/// (the bubble of Narayanan et al. 2021: (p − 1)/v of a rank's time per micro-batch). `Err`
/// with the least memory the largest rank needs when some rank fits no policy.
fn interleaved_plan(ctx: &Ctx, p: usize, v: u64, bound: Option<f64>) -> Result<Plan, u64> {
    let prob = ctx.prep.prob;
    let rs = ranks(ctx, p, v);
    let needed = least_memory(ctx, &rs);
    if needed > ctx.hbm {
        return Err(needed);
    }
    let mut policy: Vec<usize> = rs
        .iter()
        .map(|rk| {
            ctx.fastest_policy(&ctx.recompute(&rk.sums), |r| rk.mem(ctx, r))
                .expect("a policy fits: needed <= hbm")
        })
        .collect();
    let factor = ctx.m as f64 + (p - 1) as f64 / v as f64;
    let exposed: Vec<f64> = rs.iter().map(|rk| ctx.exposed(&rk.sums)).collect();
    let max_e = exposed.iter().copied().fold(0.0f64, f64::max);
    let optimizer: Vec<f64> = rs.iter().map(|rk| ctx.optimizer(&rk.sums)).collect();
    let max_o = optimizer.iter().copied().fold(0.0f64, f64::max);
    let mut times: Vec<f64> = rs
        .iter()
        .zip(&policy)
        .map(|(rk, &r)| rk.time(ctx, r))
        .collect();
    let bound = bound.unwrap_or_else(|| {
        let max_t = times.iter().copied().fold(0.0f64, f64::max);
        tie_bound(objective(factor, max_t, max_e, max_o))
    });
    lower_to_bound(
        ctx,
        (factor, max_e, max_o, bound),
        &mut policy,
        &mut times,
        |k, r| rs[k].time(ctx, r),
        |k, r| rs[k].mem(ctx, r) <= ctx.hbm,
    );
    let layers = chunk_layers(prob, p, v);
    let stages: Vec<Stage> = (0..p * v as usize)
        .map(|c| {
            let k = c % p;
            let (first_layer, last_layer) = layers[c];
            let memory = rs[k].mem_parts(ctx, policy[k]);
            Stage {
                rank: k,
                first_layer,
                last_layer,
                devices: prob.tp,
                time_s: times[k],
                time_parts: ctx.time_parts(
                    &rs[k].sums,
                    policy[k],
                    rs[k].p2p_exposed(ctx, policy[k]),
                    rs[k].zero_s,
                ),
                memory_bytes: memory.total(),
                memory,
                recompute: Recompute::from_index(policy[k]).unwrap(),
                in_flight: rs[k].in_flight,
                dp_comm_s: ctx.dp_comm(&rs[k].sums),
                exposed_dp_s: exposed[k],
                optimizer_s: optimizer[k],
            }
        })
        .collect();
    Ok(plan_of_stages(ctx, p, v, factor, stages))
}

/// The least memory the largest of the ranks needs, each at its least-memory allowed policy.
fn least_memory(ctx: &Ctx, rs: &[Rank]) -> u64 {
    rs.iter()
        .map(|rk| ctx.policies.iter().map(|&r| rk.mem(ctx, r)).min().unwrap())
        .max()
        .unwrap_or(0)
}

/// Why interleaving with a fixed v is impossible at (p, m), in words.
fn interleave_refusal(prob: &Problem, p: usize, v: u64, m: u64) -> String {
    let (_, blocks) = prob.block_range();
    format!(
        "stages: interleaved:{v} needs p >= 2 stages, p·v chunks of at least one of the {blocks} \
         blocks each and p dividing the m micro-batches; got p = {p}, p·v = {}, m = {m}",
        p as u64 * v
    )
}

// ---- the searches ---------------------------------------------------------------------------

/// Why every option of the problem is infeasible, given that batch and devices are fine:
/// the least largest-stage memory over every allowed (d, p), each at its least-memory ZeRO
/// stage (and, with a fixed v >= 2, under that interleaving).
fn memory_violation(preps: &Preps) -> Violation {
    let prep = preps.at(1);
    let prob = prep.prob;
    let mut best: Option<(u64, u64, usize)> = None; // (bytes, d, p)
    let mut consider = |v: u64, d: u64, p: usize| {
        let better = match best {
            None => true,
            Some((bv, bd, bp)) => (v, d * p as u64, p) < (bv, bd * bp as u64, bp),
        };
        if better {
            best = Some((v, d, p));
        }
    };
    let plain = prob.virtual_stages.is_none_or(|v| v == 1);
    for d in dp_degrees(prob) {
        let pmax = p_max(prob, d);
        if pmax == 0 {
            continue;
        }
        let Some(&least) = shard_options(prob, d).last() else {
            continue; // a fixed EP degree that does not divide d
        };
        if plain {
            // Memory does not depend on the network: one table per d serves every p.
            let ctx = Ctx::new(preps, d, 1, prob.hbm_bytes, least);
            let g = min_max_memory(&ctx, pmax);
            for p in 1..=pmax {
                consider(g[p * prep.n], d, p);
            }
        } else {
            let m = prob.global_batch / (prob.micro_batch * d);
            for p in 2..=pmax {
                for v in interleave_options(prob, p, m) {
                    let ctx = Ctx::new(preps, d, p, prob.hbm_bytes, least);
                    consider(least_memory(&ctx, &ranks(&ctx, p, v)), d, p);
                }
            }
        }
    }
    let Some((needed, d, p)) = best else {
        let v = prob.virtual_stages.unwrap_or(1);
        return Violation::new(
            ViolationKind::Stages,
            format!(
                "stages: no (d, p) allows interleaved:{v}: it needs p >= 2 stages, p·v chunks of \
                 at least one of the {} blocks each and p dividing the micro-batches per replica",
                prob.block_range().1
            ),
        );
    };
    Violation {
        kind: ViolationKind::Memory,
        message: format!(
            "memory: no placement fits: the least memory any option needs is {} per device on \
             its largest stage (DP {d}, PP {p}, TP {}{}{}), but HBM is {}",
            bytes_said(needed),
            prob.tp,
            if prob.cp > 1 {
                format!(", CP {}", prob.cp)
            } else {
                String::new()
            },
            fixed_settings(prob),
            bytes_said(prob.hbm_bytes)
        ),
        needed_bytes: Some(needed),
        dp: Some(d),
        pp: Some(p),
    }
}

/// A priced option of the search: DP degree, stages, chunks per rank, ZeRO stage and EP
/// degree, objective.
#[derive(Clone, Copy)]
struct Option5 {
    d: u64,
    p: usize,
    v: u64,
    shard: Shard,
    value: f64,
}

impl Option5 {
    /// The tie-break among options within [`TIE_REL`] of the optimum: fewer devices, fewer
    /// stages, fewer chunks per rank, lower ZeRO stage, smaller EP degree.
    fn tie_key(&self) -> (u64, usize, u64, Shard) {
        (self.d * self.p as u64, self.p, self.v, self.shard)
    }
}

/// The plan of an option (its split and policies rebuilt with the lexicographic tie-break).
fn plan_of(preps: &Preps, o: Option5, bound: f64, fronts: &mut SuffixFronts) -> Plan {
    let prob = preps.at(1).prob;
    let ctx = Ctx::new(preps, o.d, o.p, prob.hbm_bytes, o.shard);
    if o.v == 1 {
        run_dp(&ctx, o.p, bound, fronts);
        reconstruct(&ctx, fronts, o.p, bound)
    } else {
        interleaved_plan(&ctx, o.p, o.v, Some(bound)).expect("the option fitted when it was priced")
    }
}

/// Finds the optimal placement (see the crate docs for the model and the tie-break), or why
/// none exists. Never returns a plan that violates a constraint.
pub fn solve(prob: &Problem) -> Solution {
    if let Err(e) = prob.validate() {
        return Solution::Infeasible(Violation::new(ViolationKind::Input, e.message));
    }
    if !prob.global_batch.is_multiple_of(prob.micro_batch) {
        return Solution::Infeasible(Violation::new(
            ViolationKind::Batch,
            format!(
                "batch: global batch B = {} is not divisible by micro-batch b = {}",
                prob.global_batch, prob.micro_batch
            ),
        ));
    }
    if prob.tp * prob.cp > prob.devices {
        let what = if prob.cp > 1 {
            format!("t·c = {}·{}", prob.tp, prob.cp)
        } else {
            format!("t = {}", prob.tp)
        };
        return Solution::Infeasible(Violation::new(
            ViolationKind::Devices,
            format!("devices: {what} exceeds N = {}", prob.devices),
        ));
    }
    let preps = Preps::new(prob);
    // Every layer runs on exactly one rank, so max_k T_k >= Σ compute / p: a lower bound that
    // skips interleaved options that cannot win (the compute at the option's EP degree: the
    // expert GEMMs' time depends on it).
    let total_compute = |e: u64| {
        let prep = preps.at(e);
        prep.range(0, prep.n - 1).compute_s
    };
    let plain = prob.virtual_stages.is_none_or(|v| v == 1);
    let mut fronts = SuffixFronts::default();
    let mut best = f64::INFINITY;
    let mut options: Vec<Option5> = Vec::new();
    let bound_now = |best: f64| {
        if best.is_finite() {
            tie_bound(best)
        } else {
            f64::INFINITY
        }
    };
    // Largest d first: its tables are the smallest (p <= N / (d·t)) and it gives an incumbent
    // that prunes the expensive small-d runs.
    for d in dp_degrees(prob).into_iter().rev() {
        let pmax = p_max(prob, d);
        if pmax == 0 {
            continue;
        }
        let m = prob.global_batch / (prob.micro_batch * d);
        for shard in shard_options(prob, d) {
            if plain {
                for (rep_p, ps) in classes(prob, d, shard, pmax) {
                    let ctx = Ctx::new(&preps, d, rep_p, prob.hbm_bytes, shard);
                    run_dp(&ctx, *ps.last().unwrap(), bound_now(best), &mut fronts);
                    for &p in &ps {
                        if let Some(value) = best_value(&ctx, &fronts, p) {
                            options.push(Option5 {
                                d,
                                p,
                                v: 1,
                                shard,
                                value,
                            });
                            best = best.min(value);
                        }
                    }
                }
            }
            for p in 2..=pmax {
                for v in interleave_options(prob, p, m) {
                    let factor = m as f64 + (p - 1) as f64 / v as f64;
                    if factor * (total_compute(shard.e) / p as f64) > bound_now(best) {
                        continue;
                    }
                    let ctx = Ctx::new(&preps, d, p, prob.hbm_bytes, shard);
                    if let Ok(plan) = interleaved_plan(&ctx, p, v, None) {
                        let value = plan.time_per_batch_s;
                        options.push(Option5 {
                            d,
                            p,
                            v,
                            shard,
                            value,
                        });
                        best = best.min(value);
                    }
                }
            }
        }
    }
    if options.is_empty() {
        if let Some(e) = prob.expert_parallel.filter(|&e| {
            !dp_degrees(prob)
                .iter()
                .any(|&d| prob.expert_parallel_room(d).is_multiple_of(e))
        }) {
            return Solution::Infeasible(Violation::new(
                ViolationKind::Devices,
                format!(
                    "devices: expert parallel e = {e} {}; no allowed d is",
                    ep_group_words(prob)
                ),
            ));
        }
        return Solution::Infeasible(memory_violation(&preps));
    }
    let bound = tie_bound(best);
    let chosen = *options
        .iter()
        .filter(|o| o.value <= bound)
        .min_by_key(|o| o.tie_key())
        .unwrap();
    Solution::Feasible(plan_of(&preps, chosen, bound, &mut fronts))
}

/// Solves many problems in parallel (rayon); answers are in input order.
pub fn solve_many(problems: &[Problem]) -> Vec<Solution> {
    use rayon::prelude::*;
    problems.par_iter().map(solve).collect()
}

/// Evaluates one fixed placement (`pp` stages, DP degree `dp`) on many problems in parallel
/// (rayon); answers are in input order. A baseline prices the same placement on every
/// candidate chip: tens of thousands of problems per search.
pub fn evaluate_many(
    problems: &[Problem],
    pp: usize,
    dp: u64,
) -> Vec<Result<Evaluation, crate::InputError>> {
    use rayon::prelude::*;
    problems
        .par_iter()
        .map(|p| evaluate_fixed(p, pp, dp))
        .collect()
}

/// The least time per batch of `p` stages with `v` chunks per rank under `ctx` (None: nothing
/// fits its HBM).
fn fixed_value(ctx: &Ctx, p: usize, v: u64, fronts: &mut SuffixFronts) -> Option<f64> {
    if v == 1 {
        run_dp(ctx, p, f64::INFINITY, fronts);
        best_value(ctx, fronts, p)
    } else {
        interleaved_plan(ctx, p, v, None)
            .ok()
            .map(|plan| plan.time_per_batch_s)
    }
}

/// Evaluates a fixed placement: `pp` stages and DP degree `dp` (the split, the policies, and
/// the ZeRO stage and chunks per rank the problem leaves open are still chosen optimally).
/// Reports every violated constraint, and still returns the numbers where they exist: for a
/// memory violation, the plan that needs the least memory (fastest among those, at the
/// least-memory ZeRO stage allowed), with the bytes it needs. Errors only on a malformed
/// problem or `pp`/`dp` of 0.
pub fn evaluate_fixed(prob: &Problem, pp: usize, dp: u64) -> Result<Evaluation, crate::InputError> {
    prob.validate()?;
    if pp == 0 || dp == 0 {
        return Err(crate::InputError {
            message: format!("pp and dp must be >= 1, got pp = {pp}, dp = {dp}"),
        });
    }
    if !hsdp_divides(prob, dp) {
        return Err(crate::InputError {
            message: format!(
                "dp_shard = {}: HSDP's shard group must divide the {} ranks of DP x CP",
                prob.dp_shard.unwrap_or(1),
                dp * prob.cp
            ),
        });
    }
    let n = prob.layers.len();
    let t = prob.tp;
    let mut violations = Vec::new();
    if pp > n {
        violations.push(Violation::new(
            ViolationKind::Stages,
            format!("stages: p = {pp} exceeds the {n} layers"),
        ));
    }
    if let Some(ms) = prob.max_stages.filter(|&ms| pp > ms) {
        violations.push(Violation::new(
            ViolationKind::Stages,
            format!("stages: p = {pp} exceeds max_stages = {ms}"),
        ));
    }
    let c = prob.cp;
    let used = dp
        .checked_mul(pp as u64)
        .and_then(|x| x.checked_mul(t))
        .and_then(|x| x.checked_mul(c));
    if used.is_none_or(|u| u > prob.devices) {
        let shown = used.map_or_else(|| "more than 2^64".to_string(), |u| u.to_string());
        let product = if c > 1 {
            format!("d·p·t·c = {dp}·{pp}·{t}·{c}")
        } else {
            format!("d·p·t = {dp}·{pp}·{t}")
        };
        violations.push(Violation::new(
            ViolationKind::Devices,
            format!("devices: {product} = {shown} exceeds N = {}", prob.devices),
        ));
    }
    let divisible = prob
        .micro_batch
        .checked_mul(dp)
        .is_some_and(|bd| prob.global_batch.is_multiple_of(bd));
    if !divisible {
        violations.push(Violation::new(
            ViolationKind::Batch,
            format!(
                "batch: global batch B = {} is not divisible by b·d = {}·{dp}",
                prob.global_batch, prob.micro_batch
            ),
        ));
    }
    let m = if divisible {
        prob.global_batch / (prob.micro_batch * dp)
    } else {
        0
    };
    let mut unchunkable = false;
    if let Some(v) = prob.virtual_stages.filter(|&v| v >= 2) {
        if divisible && !interleave_allowed(prob, pp, v, m) {
            unchunkable = true;
            violations.push(Violation::new(
                ViolationKind::Stages,
                interleave_refusal(prob, pp, v, m),
            ));
        }
    }
    if pp > n || !divisible || used.is_none() || unchunkable {
        return Ok(Evaluation {
            feasible: false,
            violations,
            plan: None,
        });
    }
    let preps = Preps::new(prob);
    let mut fronts = SuffixFronts::default();
    let shards = shard_options(prob, dp);
    if shards.is_empty() {
        let e = prob.expert_parallel.unwrap_or(1);
        violations.push(Violation::new(
            ViolationKind::Devices,
            if prob.experts_folded() {
                format!(
                    "devices: expert parallel e = {e} at d = {dp} {}",
                    ep_group_words(prob)
                )
            } else {
                format!(
                    "devices: expert parallel e = {e} does not divide d = {dp} (the EP group is e \
                     of the d replicas)"
                )
            },
        ));
        return Ok(Evaluation {
            feasible: false,
            violations,
            plan: None,
        });
    }
    let vs: Vec<u64> = match prob.virtual_stages {
        Some(v) => vec![v],
        None => std::iter::once(1)
            .chain(interleave_options(prob, pp, m))
            .collect(),
    };
    // Every (v, z) that fits, priced; then the tie-break of `solve` among them.
    let mut options: Vec<Option5> = Vec::new();
    for &v in &vs {
        for &shard in &shards {
            let ctx = Ctx::new(&preps, dp, pp, prob.hbm_bytes, shard);
            let value = fixed_value(&ctx, pp, v, &mut fronts);
            if let Some(value) = value {
                options.push(Option5 {
                    d: dp,
                    p: pp,
                    v,
                    shard,
                    value,
                });
            }
        }
    }
    let plan = if let Some(best) = options.iter().map(|o| o.value).min_by(f64::total_cmp) {
        let bound = tie_bound(best);
        let chosen = *options
            .iter()
            .filter(|o| o.value <= bound)
            .min_by_key(|o| o.tie_key())
            .unwrap();
        plan_of(&preps, chosen, bound, &mut fronts)
    } else {
        // Least largest-stage memory for this (d, p) at the least-memory ZeRO stage and the
        // first chunk count allowed; then the fastest plan within it.
        // (The order does not change memory: the preferred one.)
        let least = Shard {
            o: shards[0].o,
            ..*shards.last().unwrap()
        };
        let v = vs[0];
        let ctx = Ctx::new(&preps, dp, pp, prob.hbm_bytes, least);
        let needed = if v == 1 {
            min_max_memory(&ctx, pp)[pp * n]
        } else {
            interleaved_plan(&ctx, pp, v, None).expect_err("no option fitted")
        };
        violations.push(Violation {
            kind: ViolationKind::Memory,
            message: format!(
                "memory: the largest stage needs at least {} per device (DP {dp}, PP {pp}, TP {t}{}), \
                 but HBM is {}",
                bytes_said(needed),
                fixed_settings(prob),
                bytes_said(prob.hbm_bytes)
            ),
            needed_bytes: Some(needed),
            dp: Some(dp),
            pp: Some(pp),
        });
        // The fastest within it over the rank orders allowed (the first on a tie).
        let mut chosen: Option<(f64, Shard)> = None;
        for &o in prob.rank_orders() {
            let shard = Shard { o, ..least };
            let ctx = Ctx::new(&preps, dp, pp, needed, shard);
            let value = fixed_value(&ctx, pp, v, &mut fronts)
                .expect("the least-memory plan fits its own memory");
            if chosen.is_none_or(|(best, _)| value < best) {
                chosen = Some((value, shard));
            }
        }
        let (value, shard) = chosen.expect("at least one order");
        let ctx = Ctx::new(&preps, dp, pp, needed, shard);
        if v == 1 {
            run_dp(&ctx, pp, f64::INFINITY, &mut fronts);
            reconstruct(&ctx, &fronts, pp, tie_bound(value))
        } else {
            interleaved_plan(&ctx, pp, v, None).expect("the least-memory plan fits its own memory")
        }
    };
    Ok(Evaluation {
        feasible: violations.is_empty(),
        violations,
        plan: Some(plan),
    })
}

#[cfg(test)]
mod tests {
    use super::interleave_split;

    /// The blocks per chunk as NeMo's DeepSeek-V3 table (`map_pp_vp_to_layout`) lists them.
    fn fill(per: usize, chunks: usize, last: usize) -> Vec<usize> {
        let mut sizes = vec![per; chunks - 1];
        sizes.push(last);
        sizes
    }

    #[test]
    fn deepseek_v3_61_blocks_take_nemos_layouts() {
        // NeMo 9244b1ec map_pp_vp_to_layout: (16, 1), (8, 2) and (4, 4) E + 4, 14 x 4, 1 + loss;
        // (8, 1) and (4, 2) E + 8, 6 x 8, 5 + loss; (4, 1) E + 16, 16, 16, 13 + loss.
        assert_eq!(interleave_split(61, 16), Some(fill(4, 16, 1)));
        assert_eq!(interleave_split(61, 8), Some(fill(8, 8, 5)));
        assert_eq!(interleave_split(61, 4), Some(vec![16, 16, 16, 13]));
    }

    #[test]
    fn sixty_one_blocks_over_32_chunks_keep_a_block_in_every_chunk() {
        // ⌈61/32⌉ = 2 each would leave the last chunk none: 29 chunks of 2, then 3 of 1.
        let mut want = vec![2; 29];
        want.extend([1, 1, 1]);
        assert_eq!(interleave_split(61, 32), Some(want));
    }

    #[test]
    fn even_and_counted_splits_are_unchanged() {
        assert_eq!(interleave_split(32, 8), Some(vec![4; 8]));
        // Llama 3.1 405B on PP 8 × VP 8: 126 + embedding + loss = 128 over 64 chunks.
        let mut want = vec![2; 64];
        want[0] = 1;
        want[63] = 1;
        assert_eq!(interleave_split(126, 64), Some(want));
        // Only the embedding counted: 7 + 1 over 4 chunks.
        assert_eq!(interleave_split(7, 4), Some(vec![1, 2, 2, 2]));
    }

    #[test]
    fn every_split_covers_the_blocks_with_a_block_a_chunk() {
        for blocks in 1..=70 {
            for chunks in 1..=blocks {
                let sizes = interleave_split(blocks, chunks).expect("blocks >= chunks splits");
                assert_eq!(sizes.len(), chunks);
                assert_eq!(sizes.iter().sum::<usize>(), blocks);
                assert!(
                    sizes.iter().all(|&n| n >= 1),
                    "{blocks} over {chunks}: {sizes:?}"
                );
            }
            assert_eq!(interleave_split(blocks, blocks + 1), None);
        }
    }
}
