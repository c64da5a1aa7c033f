//! Cross-check against exhaustive enumeration (every d, p, split and policy per stage) with
//! its own copy of the formulas, the optimizer step after the flush included.
//!
//! Every number is dyadic and small (times in 1/64 s, bandwidths powers of two, batch, b, t
//! and so d powers of two), so every float operation in both codes is exact: the optimum and
//! the whole documented tie-break can be compared with `==`.

use phaze_dp::{
    evaluate_fixed, solve, Plan, Problem, RankOrder, Recompute, Solution, ViolationKind, Zero,
};

mod common;
use common::{level_for, p2p_bandwidth, random_layers, random_levels, ring_bandwidth, Rng};

fn random_problem(rng: &mut Rng) -> Problem {
    let n = 1 + rng.below(6) as usize;
    let mut layers = random_layers(rng, n, 64);
    // The optimizer steps, from a generator of their own (the rest of each instance is as
    // before): none in a third of the problems, in the others up to 8 s or up to 64 s a layer,
    // as much as a stage's time per micro-batch or the whole pipeline's.
    let mut opt = Rng(rng.0 ^ 0x6f70_745f_7374_6570);
    let scale = [0.0, 1.0, 8.0][opt.below(3) as usize];
    for l in &mut layers {
        l.opt_s = opt.time() * scale;
    }
    let devices = 1 + rng.below(32);
    let levels = random_levels(rng);
    Problem {
        layers,
        devices,
        // Tight enough that a good share is infeasible or forced into recompute / more stages.
        hbm_bytes: 50 + rng.below(700),
        levels,
        global_batch: rng.pow2(5),
        micro_batch: rng.pow2(2),
        tp: rng.pow2(2),
        cp: 1,
        dp_overlap: rng.below(2) == 0,
        max_stages: if rng.below(3) == 0 {
            Some(1 + rng.below(n as u64) as usize)
        } else {
            None
        },
        // Half auto, half one fixed policy.
        recompute: if rng.below(2) == 0 {
            None
        } else {
            Recompute::from_index(rng.below(3) as usize)
        },
        zero: Some(Zero::Off),
        virtual_stages: Some(1),
        blocks: None,
        expert_parallel: Some(1),
        expert_tensor_parallel: None,
        rank_order: Some(RankOrder::TpPpDp),
        pipeline_split: false,
        grads_freed: false,
        grad_reduce_scale: 1.0,
        dp_shard: None,
        fsdp_copies: None,
    }
}

/// Cost of one explicit plan, from scratch. Returns (objective, max memory, stage times).
fn price(prob: &Problem, d: u64, ends: &[usize], pol: &[usize]) -> (f64, u64, Vec<f64>) {
    let p = ends.len();
    let n = prob.layers.len();
    let t = prob.tp;
    let m = prob.global_batch / (prob.micro_batch * d);
    let lvl = |g: u64| level_for(prob, g);
    // Ring over g devices, consecutive members `stride` apart, on level l.
    let ring = |bytes: f64, g: u64, l: usize, stride: u64| {
        if g <= 1 {
            0.0
        } else {
            let lv = &prob.levels[l];
            let bw = ring_bandwidth(prob, g, l, stride);
            2.0 * (g - 1) as f64 / g as f64 * bytes / bw + 2.0 * (g - 1) as f64 * lv.latency_s
        }
    };
    let pp_l = lvl(p as u64 * t);
    let dp_l = lvl(d * p as u64 * t);
    // tp-pp-dp: pipeline neighbours t apart; whole transfers.
    let p2p_bw = p2p_bandwidth(prob, pp_l, t);
    let p2p = |bytes: u64| prob.levels[pp_l].latency_s + bytes as f64 / p2p_bw;
    let (mut max_t, mut max_e, mut max_o, mut max_mem) = (0.0f64, 0.0f64, 0.0f64, 0u64);
    let mut times = Vec::new();
    let mut first = 0;
    for k in 0..p {
        let (i, j, r) = (first, ends[k], pol[k]);
        let mut time = 0.0;
        let (mut fixed, mut saved, mut ws, mut grad, mut bwd) = (0u64, 0u64, 0u64, 0u64, 0.0);
        // The stage's optimizer step, once per batch (no ZeRO, no experts here: all of it).
        let mut opt = 0.0;
        for l in &prob.layers[i..=j] {
            time += l.fwd_s + l.bwd_s + l.recompute_s[r];
            opt += l.opt_s;
            fixed += l.param_bytes + l.grad_bytes + l.optimizer_bytes;
            saved += l.saved_bytes[r];
            // Under full recompute the re-run forward's activations are live in the backward.
            ws = ws.max(if r == 2 {
                l.workspace_bytes.max(l.recompute_workspace_bytes)
            } else {
                l.workspace_bytes
            });
            grad += l.grad_bytes;
            bwd += l.bwd_s;
        }
        if k > 0 {
            time += 2.0 * p2p(prob.layers[i - 1].boundary_bytes);
        }
        if k < p - 1 {
            time += 2.0 * p2p(prob.layers[j].boundary_bytes);
        }
        let f = ((p - k) as u64).min(m);
        let mem = fixed + f * saved + ws;
        let ar = ring(grad as f64, d, dp_l, p as u64 * t);
        // Overlapped, the all-reduce still takes its level's share of the compute beside it.
        let e = if prob.dp_overlap {
            (ar - bwd).max(prob.levels[dp_l].collective_compute_share * ar.min(bwd))
        } else {
            ar
        };
        max_t = max_t.max(time);
        max_e = max_e.max(e);
        max_o = max_o.max(opt);
        max_mem = max_mem.max(mem);
        times.push(time);
        first = j + 1;
    }
    assert_eq!(first, n);
    (
        (m + p as u64 - 1) as f64 * max_t + max_e + max_o,
        max_mem,
        times,
    )
}

type Key = (f64, u64, usize, Vec<usize>, Vec<usize>);

/// Best plan for one (d, p) under a memory cap by the documented order, and the least max
/// memory of any plan for it. Every stage takes any policy, or the problem's fixed one.
fn brute_dp(prob: &Problem, d: u64, p: usize, hbm: u64) -> (Option<Key>, u64) {
    let n = prob.layers.len();
    let mut best: Option<Key> = None;
    let mut least_mem = u64::MAX;
    // Cuts: a (p−1)-subset of the n−1 gaps, in increasing order of the ends vector.
    let mut all_ends: Vec<Vec<usize>> = Vec::new();
    for mask in 0u32..(1 << (n - 1)) {
        if mask.count_ones() as usize != p - 1 {
            continue;
        }
        let mut ends: Vec<usize> = (0..n - 1).filter(|g| mask >> g & 1 == 1).collect();
        ends.push(n - 1);
        all_ends.push(ends);
    }
    all_ends.sort();
    for ends in &all_ends {
        for code in 0..3usize.pow(p as u32) {
            let pol: Vec<usize> = (0..p)
                .map(|k| code / 3usize.pow((p - 1 - k) as u32) % 3)
                .collect();
            if prob
                .recompute
                .is_some_and(|r| pol.iter().any(|&x| x != r.index()))
            {
                continue;
            }
            let (obj, mem, _) = price(prob, d, ends, &pol);
            least_mem = least_mem.min(mem);
            if mem > hbm {
                continue;
            }
            let key = (obj, d * p as u64 * prob.tp, p, ends.clone(), pol);
            if best
                .as_ref()
                .is_none_or(|b| key.partial_cmp(b) == Some(std::cmp::Ordering::Less))
            {
                best = Some(key);
            }
        }
    }
    (best, least_mem)
}

fn plan_key(plan: &Plan) -> Key {
    (
        plan.time_per_batch_s,
        plan.devices_used,
        plan.pp,
        plan.stages.iter().map(|s| s.last_layer).collect(),
        plan.stages.iter().map(|s| s.recompute.index()).collect(),
    )
}

#[test]
fn dp_equals_brute_force_including_tie_break() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut feasible, mut memory) = (0, 0);
    for case in 0..3000 {
        let prob = random_problem(&mut rng);
        let n = prob.layers.len();
        let got = solve(&prob);
        let b = prob.micro_batch;
        if !prob.global_batch.is_multiple_of(b) {
            assert!(
                matches!(got, Solution::Infeasible(ref v) if v.kind == ViolationKind::Batch),
                "case {case}"
            );
            continue;
        }
        if prob.tp > prob.devices {
            assert!(
                matches!(got, Solution::Infeasible(ref v) if v.kind == ViolationKind::Devices),
                "case {case}"
            );
            continue;
        }
        let mut best: Option<Key> = None;
        let mut least: Option<(u64, u64, usize)> = None;
        for d in (1..=prob.global_batch / b).filter(|&d| (prob.global_batch / b).is_multiple_of(d))
        {
            for p in 1..=n.min(prob.max_stages.unwrap_or(n)) {
                if d * p as u64 * prob.tp > prob.devices {
                    continue;
                }
                let (k, lm) = brute_dp(&prob, d, p, prob.hbm_bytes);
                if let Some(k) = k {
                    if best
                        .as_ref()
                        .is_none_or(|b| k.partial_cmp(b) == Some(std::cmp::Ordering::Less))
                    {
                        best = Some(k);
                    }
                }
                let lk = (lm, d * p as u64 * prob.tp, p);
                if least.is_none_or(|l| lk < l) {
                    least = Some(lk);
                }
            }
        }
        match (got, best) {
            (Solution::Feasible(plan), Some(k)) => {
                feasible += 1;
                assert_eq!(plan_key(&plan), k, "case {case}: {prob:?}");
                let ends: Vec<usize> = plan.stages.iter().map(|s| s.last_layer).collect();
                let pol: Vec<usize> = plan.stages.iter().map(|s| s.recompute.index()).collect();
                let (obj, mem, times) = price(&prob, plan.dp, &ends, &pol);
                assert_eq!(
                    (obj, mem),
                    (plan.time_per_batch_s, plan.max_memory_bytes),
                    "case {case}"
                );
                assert_eq!(
                    times,
                    plan.stages.iter().map(|s| s.time_s).collect::<Vec<_>>()
                );
                // The parts of a stage's time add up to it (dyadic: exactly), and each stage's
                // optimizer step is its layers' (no ZeRO, no experts).
                for s in &plan.stages {
                    assert_eq!(s.time_parts.total(), s.time_s, "case {case}");
                    let opt: f64 = prob.layers[s.first_layer..=s.last_layer]
                        .iter()
                        .map(|l| l.opt_s)
                        .sum();
                    assert_eq!(s.optimizer_s, opt, "case {case}");
                }
                let max_o = plan
                    .stages
                    .iter()
                    .map(|s| s.optimizer_s)
                    .fold(0.0, f64::max);
                assert_eq!(plan.max_optimizer_s, max_o, "case {case}");
            }
            (Solution::Infeasible(v), None) => {
                memory += 1;
                assert_eq!(v.kind, ViolationKind::Memory, "case {case}");
                assert_eq!(v.needed_bytes, least.map(|l| l.0), "case {case}: {prob:?}");
                assert!(v.needed_bytes.unwrap() > prob.hbm_bytes);
            }
            (got, best) => panic!("case {case}: solve {got:?} vs brute force {best:?}\n{prob:?}"),
        }
    }
    eprintln!("feasible {feasible}, memory-infeasible {memory}");
    // The generator must exercise both outcomes.
    assert!(
        feasible > 600 && memory > 200,
        "feasible {feasible}, memory-infeasible {memory}"
    );
}

#[test]
fn evaluate_fixed_equals_brute_force() {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for case in 0..600 {
        let prob = random_problem(&mut rng);
        let n = prob.layers.len();
        let p = 1 + rng.below(n as u64) as usize;
        let d = rng.pow2(3);
        let ev = evaluate_fixed(&prob, p, d).unwrap();
        if !prob.global_batch.is_multiple_of(prob.micro_batch * d) {
            assert!(
                ev.plan.is_none() && ev.violations.iter().any(|v| v.kind == ViolationKind::Batch)
            );
            continue;
        }
        let over = d * p as u64 * prob.tp > prob.devices;
        assert_eq!(
            over,
            ev.violations
                .iter()
                .any(|v| v.kind == ViolationKind::Devices),
            "case {case}"
        );
        let (best, least) = brute_dp(&prob, d, p, prob.hbm_bytes);
        let plan = ev.plan.as_ref().unwrap();
        match best {
            Some(k) => {
                assert!(!ev
                    .violations
                    .iter()
                    .any(|v| v.kind == ViolationKind::Memory));
                assert_eq!(plan_key(plan), k, "case {case}");
            }
            None => {
                let v = ev
                    .violations
                    .iter()
                    .find(|v| v.kind == ViolationKind::Memory)
                    .unwrap();
                assert_eq!(v.needed_bytes, Some(least), "case {case}");
                // The best-effort plan is the best one within the least memory.
                let (k, _) = brute_dp(&prob, d, p, least);
                assert_eq!(plan_key(plan), k.unwrap(), "case {case}");
                assert_eq!(plan.max_memory_bytes, least);
            }
        }
        assert_eq!(ev.feasible, ev.violations.is_empty());
    }
}
