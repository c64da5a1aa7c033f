//! The exact search: a suffix DP with Pareto fronts, then a lexicographic reconstruction.
//!
//! See the crate docs for the model. Implementation notes:
//!
//! * Range sums are accumulated left to right (layer i, i+1, ..., j), both in the DP and when
//!   a plan is rebuilt, so a stage's time is the *same float* everywhere; the reconstruction
//!   can therefore test `objective <= bound` against the DP's own numbers without slack.
//! * Memory is integer bytes (saturating), so feasibility never depends on rounding.

use crate::model::{Layer, Problem, Recompute};
use crate::plan::{Evaluation, Plan, Solution, Stage, Violation, ViolationKind};

/// Objectives within this relative distance of the optimum count as ties (they differ only
/// by the rounding of sums taken in different orders); ties are broken as documented.
pub(crate) const TIE_REL: f64 = 1e-12;

fn tie_bound(best: f64) -> f64 {
    best + best.abs() * TIE_REL
}

/// Running sums over a contiguous range of layers (a candidate stage).
#[derive(Clone, Copy, Default)]
struct RangeSums {
    /// Σ (fwd_s + bwd_s).
    compute_s: f64,
    /// Σ recompute_s[r] per policy.
    recompute_s: [f64; 3],
    /// Σ bwd_s (what a DP all-reduce can hide behind).
    bwd_s: f64,
    /// Σ (param + grad + optimizer) bytes.
    fixed_bytes: u64,
    /// Σ saved_bytes[r] per policy.
    saved_bytes: [u64; 3],
    /// max workspace_bytes.
    workspace_bytes: u64,
    /// Σ grad_bytes.
    grad_bytes: u64,
}

impl RangeSums {
    #[inline]
    fn push(&mut self, l: &Layer) {
        self.compute_s += l.fwd_s + l.bwd_s;
        for r in 0..3 {
            self.recompute_s[r] += l.recompute_s[r];
            self.saved_bytes[r] = self.saved_bytes[r].saturating_add(l.saved_bytes[r]);
        }
        self.bwd_s += l.bwd_s;
        self.fixed_bytes = self
            .fixed_bytes
            .saturating_add(l.param_bytes)
            .saturating_add(l.grad_bytes)
            .saturating_add(l.optimizer_bytes);
        self.workspace_bytes = self.workspace_bytes.max(l.workspace_bytes);
        self.grad_bytes = self.grad_bytes.saturating_add(l.grad_bytes);
    }
}

/// The problem and its layer count, shared by every DP run.
struct Prepared<'a> {
    prob: &'a Problem,
    n: usize,
}

impl<'a> Prepared<'a> {
    fn new(prob: &'a Problem) -> Self {
        Prepared {
            prob,
            n: prob.layers.len(),
        }
    }

    #[inline]
    fn push(&self, a: &mut RangeSums, l: usize) {
        a.push(&self.prob.layers[l]);
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

/// Everything that is fixed for one (d, network class of p, HBM): the DP's cost model.
struct Ctx<'p, 'a> {
    prep: &'p Prepared<'a>,
    d: u64,
    m: u64,
    hbm: u64,
    /// cut[l] = 2 · p2p(boundary_bytes[l]) on the pipeline level: the cost a stage pays on
    /// each side of a boundary after layer l (activation one way, its gradient back).
    cut: Vec<f64>,
    dp_level: usize,
    /// Devices between consecutive members of a DP group: p·t. The device order is TP
    /// innermost, then PP, then DP (a replica's p·t devices are contiguous; the p2p level is
    /// that of p·t, the DP level that of d·p·t), so a DP group's members lie p·t apart.
    dp_stride: u64,
    /// The policies a stage may use ([`Problem::policies`]): all three, or the fixed one.
    policies: &'static [usize],
}

impl<'p, 'a> Ctx<'p, 'a> {
    /// `pp_group` is p·t (the pipeline replica), which picks the p2p level and is the stride
    /// of a DP group (whose level is that of d·p·t).
    fn new(prep: &'p Prepared<'a>, d: u64, pp_group: u64, hbm: u64) -> Self {
        let prob = prep.prob;
        let pp_level = prob.level_for(pp_group);
        let cut = prob
            .layers
            .iter()
            .map(|l| 2.0 * prob.p2p_s(l.boundary_bytes as f64, pp_level))
            .collect();
        Ctx {
            prep,
            d,
            m: prob.global_batch / (prob.micro_batch * d),
            hbm,
            cut,
            dp_level: prob.level_for(d * pp_group),
            dp_stride: pp_group,
            policies: prob.policies(),
        }
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

    #[inline]
    fn mem(&self, a: &RangeSums, f: u64, r: usize) -> u64 {
        a.fixed_bytes
            .saturating_add(f.saturating_mul(a.saved_bytes[r]))
            .saturating_add(a.workspace_bytes)
    }

    /// The fastest allowed policy whose memory fits with `f` micro-batches in flight (ties:
    /// lower index). The fastest fitting policy is always optimal: the policy changes only T_k.
    #[inline]
    fn fastest_fit(&self, a: &RangeSums, f: u64) -> Option<usize> {
        let mut best: Option<usize> = None;
        for &r in self.policies {
            if self.mem(a, f, r) <= self.hbm
                && best.is_none_or(|b| a.recompute_s[r] < a.recompute_s[b])
            {
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
        ((a.compute_s + a.recompute_s[r]) + self.p2p_in(i)) + self.p2p_out(j)
    }

    fn allreduce(&self, a: &RangeSums) -> f64 {
        self.prep
            .prob
            .ring_allreduce_s(a.grad_bytes as f64, self.d, self.dp_level, self.dp_stride)
    }

    /// E_k: the DP all-reduce, less what hides behind the stage's backward when overlapped.
    #[inline]
    fn exposed(&self, a: &RangeSums) -> f64 {
        let ar = self.allreduce(a);
        if self.prep.prob.dp_overlap {
            (ar - a.bwd_s).max(0.0)
        } else {
            ar
        }
    }

    /// The objective's factor m + p − 1.
    #[inline]
    fn factor(&self, p: usize) -> f64 {
        (self.m + p as u64 - 1) as f64
    }
}

/// Pareto fronts F[s][i] of (max T, max E) over suffixes that start at layer i and are cut
/// into s stages, in one arena. Buffers are reused between DP runs.
#[derive(Default)]
struct SuffixFronts {
    n: usize,
    idx: Vec<(u32, u32)>,
    arena: Vec<(f64, f64)>,
    scratch: Vec<Vec<(f64, f64)>>,
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

    fn front(&self, s: usize, i: usize) -> &[(f64, f64)] {
        let (start, len) = self.idx[s * self.n + i];
        &self.arena[start as usize..(start + len) as usize]
    }
}

/// Adds (t, e) to a Pareto front (minimizing both), unless a member weakly dominates it.
#[inline]
fn insert(front: &mut Vec<(f64, f64)>, t: f64, e: f64) {
    if front.iter().any(|&(ft, fe)| ft <= t && fe <= e) {
        return;
    }
    front.retain(|&(ft, fe)| !(t <= ft && e <= fe));
    front.push((t, e));
}

/// Fills F[s][i] for s = 1..=s_max. Entries whose lower bound (m + s − 1)·T + E exceeds
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
            if ctx.factor(1) * t + e <= bound {
                arena.push((t, e));
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
            // Lower bound of this stage's time for every policy and every longer range.
            let t_lb = a.compute_s + t_in;
            let t_out = ctx.p2p_out(j);
            let e = ctx.exposed(&a);
            let mut alive = false;
            for s in 2..=s_top {
                // Memory grows with s (more in flight): once nothing fits, stop.
                let Some(r) = ctx.fastest_fit(&a, (s as u64).min(m)) else {
                    break;
                };
                let k = ctx.factor(s);
                if k * t_lb > bound {
                    break;
                }
                alive = true;
                let t = ((a.compute_s + a.recompute_s[r]) + t_in) + t_out;
                let (start, len) = idx[(s - 1) * n + j + 1];
                for &(ts, es) in &arena[start as usize..(start + len) as usize] {
                    let (ct, ce) = (t.max(ts), e.max(es));
                    if k * ct + ce <= bound {
                        insert(&mut scratch[s], ct, ce);
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
        .map(|&(t, e)| k * t + e)
        .min_by(f64::total_cmp)
}

/// One stage of a plan being rebuilt: layers `first..=last`, their sums, the micro-batches in
/// flight, the recompute policy, and the stage's time and exposed DP all-reduce.
struct StageChoice {
    first: usize,
    last: usize,
    sums: RangeSums,
    in_flight: u64,
    policy: usize,
    time_s: f64,
    exposed_s: f64,
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
    // The largest stage time and exposed all-reduce of the stages chosen so far.
    let (mut max_t, mut max_e) = (0.0f64, 0.0f64);
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
            let (ct, ce) = (max_t.max(t), max_e.max(e));
            let completes = if s == 1 {
                k_obj * ct + ce <= bound
            } else {
                fronts
                    .front(s - 1, last + 1)
                    .iter()
                    .any(|&(ts, es)| k_obj * ct.max(ts) + ce.max(es) <= bound)
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
                });
                break;
            }
        }
        let c = chosen.expect("phaze-dp: reconstruction found no stage the DP promised");
        max_t = max_t.max(c.time_s);
        max_e = max_e.max(c.exposed_s);
        first = c.last + 1;
        stages.push(c);
    }
    stages
}

/// The lowest policy index per stage, stage by stage, that keeps the objective within `bound`,
/// with the other stages at their current policy (the later ones still at their fastest: the
/// most permissive completion).
fn lower_policies(ctx: &Ctx, stages: &mut [StageChoice], p: usize, bound: f64) {
    let k_obj = ctx.factor(p);
    let max_e = stages.iter().map(|s| s.exposed_s).fold(0.0f64, f64::max);
    for k in 0..stages.len() {
        let rest_t = stages
            .iter()
            .enumerate()
            .filter(|&(q, _)| q != k)
            .map(|(_, s)| s.time_s)
            .fold(0.0f64, f64::max);
        let s = &stages[k];
        for &policy in ctx.policies {
            if policy == s.policy {
                break; // the current (fastest) policy is within bound by construction
            }
            if ctx.mem(&s.sums, s.in_flight, policy) > ctx.hbm {
                continue;
            }
            let t = ctx.stage_time(&s.sums, policy, s.first, s.last);
            if k_obj * rest_t.max(t) + max_e <= bound {
                let s = &mut stages[k];
                s.policy = policy;
                s.time_s = t;
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
        .map(|s| Stage {
            first_layer: s.first,
            last_layer: s.last,
            devices: prob.tp,
            time_s: s.time_s,
            memory_bytes: ctx.mem(&s.sums, s.in_flight, s.policy),
            recompute: Recompute::from_index(s.policy).unwrap(),
            in_flight: s.in_flight,
            dp_allreduce_s: ctx.allreduce(&s.sums),
            exposed_dp_s: s.exposed_s,
        })
        .collect();
    let max_t = stages.iter().map(|s| s.time_s).fold(0.0, f64::max);
    let max_e = stages.iter().map(|s| s.exposed_dp_s).fold(0.0, f64::max);
    let time = ctx.factor(p) * max_t + max_e;
    Plan {
        dp: ctx.d,
        pp: p,
        tp: prob.tp,
        micro_batch: prob.micro_batch,
        num_micro_batches: ctx.m,
        global_batch: prob.global_batch,
        time_per_batch_s: time,
        throughput_samples_per_s: prob.global_batch as f64 / time,
        devices_used: ctx.d * p as u64 * prob.tp,
        max_stage_time_s: max_t,
        max_exposed_dp_s: max_e,
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
    let limit = q.min(prob.devices / prob.tp);
    let mut ds = Vec::new();
    if limit <= 1 << 16 {
        ds.extend((1..=limit).filter(|&d| q.is_multiple_of(d)));
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
        ds.retain(|&d| d <= limit);
        ds.sort_unstable();
    }
    ds
}

/// Largest stage count for DP degree d.
fn p_max(prob: &Problem, d: u64) -> usize {
    let by_devices = prob.devices / (d * prob.tp);
    let mut pm = prob
        .layers
        .len()
        .min(usize::try_from(by_devices).unwrap_or(usize::MAX));
    if let Some(ms) = prob.max_stages {
        pm = pm.min(ms);
    }
    pm
}

/// Groups p = 1..=pmax by the network they use (p2p level of p·t; DP level of d·p·t and the
/// DP ring's bandwidth, which depends on p through the stride p·t of a DP group); one DP run
/// serves a whole group. p = 1 has no p2p, so it joins p = 2's group when it can.
fn classes(prob: &Problem, d: u64, pmax: usize) -> Vec<(u64, Vec<usize>)> {
    let t = prob.tp;
    // (p2p level, DP level, DP ring bandwidth's bits).
    type Key = (usize, usize, u64);
    let key = |p: usize| -> Key {
        let pp = prob.level_for(p.max(2) as u64 * t);
        if d > 1 {
            let pt = p as u64 * t;
            let level = prob.level_for(d * pt);
            (pp, level, prob.ring_bandwidth_bps(d, level, pt).to_bits())
        } else {
            (pp, 0, 0)
        }
    };
    let mut out: Vec<(Key, u64, Vec<usize>)> = Vec::new();
    for p in 1..=pmax {
        let k = key(p);
        match out.iter_mut().find(|(kk, _, _)| *kk == k) {
            Some((_, _, ps)) => ps.push(p),
            None => out.push((k, p as u64 * t, vec![p])),
        }
    }
    // Representative p·t of a group: the largest p (all p in it share both levels and the
    // DP bandwidth).
    out.into_iter()
        .map(|(_, _, ps)| (*ps.last().unwrap() as u64 * t, ps))
        .collect()
}

/// `, recompute = POLICY` when the problem fixes the policy (for memory messages), else ''.
fn fixed_policy(prob: &Problem) -> String {
    prob.recompute
        .map_or_else(String::new, |r| format!(", recompute = {}", r.as_str()))
}

/// Why every option of the problem is infeasible, given that batch and devices are fine:
/// the least largest-stage memory over every allowed (d, p).
fn memory_violation(prep: &Prepared) -> Violation {
    let prob = prep.prob;
    let mut best: Option<(u64, u64, usize)> = None; // (bytes, d, p)
    for d in dp_degrees(prob) {
        let pmax = p_max(prob, d);
        if pmax == 0 {
            continue;
        }
        // Memory does not depend on the network: one table per d serves every p.
        let ctx = Ctx::new(prep, d, prob.tp, prob.hbm_bytes);
        let g = min_max_memory(&ctx, pmax);
        for p in 1..=pmax {
            let v = g[p * prep.n];
            let better = match best {
                None => true,
                Some((bv, bd, bp)) => (v, d * p as u64, p) < (bv, bd * bp as u64, bp),
            };
            if better {
                best = Some((v, d, p));
            }
        }
    }
    let (needed, d, p) = best.expect("d = 1, p = 1 is always allowed here");
    Violation {
        kind: ViolationKind::Memory,
        message: format!(
            "memory: no placement fits: the least memory any option needs is {needed} bytes \
             per device on its largest stage (d = {d}, p = {p}, t = {}{}), but HBM is {} bytes",
            prob.tp,
            fixed_policy(prob),
            prob.hbm_bytes
        ),
        needed_bytes: Some(needed),
        dp: Some(d),
        pp: Some(p),
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
    if prob.tp > prob.devices {
        return Solution::Infeasible(Violation::new(
            ViolationKind::Devices,
            format!("devices: t = {} exceeds N = {}", prob.tp, prob.devices),
        ));
    }
    let prep = Prepared::new(prob);
    let mut fronts = SuffixFronts::default();
    let mut best = f64::INFINITY;
    let mut results: Vec<(u64, usize, f64)> = Vec::new(); // (d, p, objective)
                                                          // Largest d first: its tables are the smallest (p <= N / (d·t)) and it gives an incumbent
                                                          // that prunes the expensive small-d runs.
    for d in dp_degrees(prob).into_iter().rev() {
        let pmax = p_max(prob, d);
        if pmax == 0 {
            continue;
        }
        for (group, ps) in classes(prob, d, pmax) {
            let ctx = Ctx::new(&prep, d, group, prob.hbm_bytes);
            let bound = if best.is_finite() {
                tie_bound(best)
            } else {
                f64::INFINITY
            };
            run_dp(&ctx, *ps.last().unwrap(), bound, &mut fronts);
            for &p in &ps {
                if let Some(v) = best_value(&ctx, &fronts, p) {
                    results.push((d, p, v));
                    best = best.min(v);
                }
            }
        }
    }
    if results.is_empty() {
        return Solution::Infeasible(memory_violation(&prep));
    }
    // Tie-break among options within TIE_REL of the optimum: fewer devices, then fewer stages.
    let bound = tie_bound(best);
    let &(d, p, _) = results
        .iter()
        .filter(|r| r.2 <= bound)
        .min_by_key(|&&(d, p, _)| (d * p as u64, p))
        .unwrap();
    let ctx = Ctx::new(&prep, d, p as u64 * prob.tp, prob.hbm_bytes);
    run_dp(&ctx, p, bound, &mut fronts);
    Solution::Feasible(reconstruct(&ctx, &fronts, p, bound))
}

/// Solves many problems in parallel (rayon); answers are in input order.
pub fn solve_many(problems: &[Problem]) -> Vec<Solution> {
    use rayon::prelude::*;
    problems.par_iter().map(solve).collect()
}

/// Evaluates a fixed placement: `pp` stages and DP degree `dp` (the split and the policies
/// are still chosen optimally). Reports every violated constraint, and still returns the
/// numbers where they exist: for a memory violation, the plan that needs the least memory
/// (fastest among those), with the bytes it needs. Errors only on a malformed problem or
/// `pp`/`dp` of 0.
pub fn evaluate_fixed(prob: &Problem, pp: usize, dp: u64) -> Result<Evaluation, crate::InputError> {
    prob.validate()?;
    if pp == 0 || dp == 0 {
        return Err(crate::InputError {
            message: format!("pp and dp must be >= 1, got pp = {pp}, dp = {dp}"),
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
    let used = dp.checked_mul(pp as u64).and_then(|x| x.checked_mul(t));
    if used.is_none_or(|u| u > prob.devices) {
        let shown = used.map_or_else(|| "more than 2^64".to_string(), |u| u.to_string());
        violations.push(Violation::new(
            ViolationKind::Devices,
            format!(
                "devices: d·p·t = {dp}·{pp}·{t} = {shown} exceeds N = {}",
                prob.devices
            ),
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
    if pp > n || !divisible || used.is_none() {
        return Ok(Evaluation {
            feasible: false,
            violations,
            plan: None,
        });
    }
    let prep = Prepared::new(prob);
    let mut fronts = SuffixFronts::default();
    let group = pp as u64 * t;
    let ctx = Ctx::new(&prep, dp, group, prob.hbm_bytes);
    run_dp(&ctx, pp, f64::INFINITY, &mut fronts);
    let plan = match best_value(&ctx, &fronts, pp) {
        Some(v) => reconstruct(&ctx, &fronts, pp, tie_bound(v)),
        None => {
            // Least largest-stage memory for this (d, p); then the fastest plan within it.
            let needed = min_max_memory(&ctx, pp)[pp * n];
            violations.push(Violation {
                kind: ViolationKind::Memory,
                message: format!(
                    "memory: the largest stage needs at least {needed} bytes per device \
                     (d = {dp}, p = {pp}, t = {t}{}), but HBM is {} bytes",
                    fixed_policy(prob),
                    prob.hbm_bytes
                ),
                needed_bytes: Some(needed),
                dp: Some(dp),
                pp: Some(pp),
            });
            let ctx = Ctx::new(&prep, dp, group, needed);
            run_dp(&ctx, pp, f64::INFINITY, &mut fronts);
            let v =
                best_value(&ctx, &fronts, pp).expect("the least-memory plan fits its own memory");
            reconstruct(&ctx, &fronts, pp, tie_bound(v))
        }
    };
    Ok(Evaluation {
        feasible: violations.is_empty(),
        violations,
        plan: Some(plan),
    })
}
