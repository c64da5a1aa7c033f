//! Small cases whose answers are worked out by hand in the comments.

use phaze_dp::{
    evaluate_fixed, solve, solve_many, ExpertGemms, FsdpCopies, FsdpImplementation, Layer,
    NetLevel, Problem, RankOrder, Recompute, Solution, ViolationKind, Zero,
};

/// fwd 1 s, bwd 2 s, nothing else: c = 3 s per layer.
fn layer() -> Layer {
    Layer {
        fwd_s: 1.0,
        bwd_s: 2.0,
        ..Default::default()
    }
}

fn level(group_size: u64, bandwidth_bps: f64, latency_s: f64) -> NetLevel {
    NetLevel {
        group_size,
        bandwidth_bps,
        latency_s,
        ..NetLevel::default()
    }
}

fn problem(layers: Vec<Layer>, devices: u64, global_batch: u64) -> Problem {
    Problem {
        layers,
        devices,
        hbm_bytes: u64::MAX,
        levels: vec![level(devices, 1e9, 0.1)],
        global_batch,
        micro_batch: 1,
        tp: 1,
        cp: 1,
        dp_overlap: false,
        max_stages: None,
        recompute: None,
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

fn feasible(s: Solution) -> phaze_dp::Plan {
    match s {
        Solution::Feasible(p) => p,
        Solution::Infeasible(v) => panic!("expected a plan, got {v:?}"),
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * b.abs().max(1.0)
}

#[test]
fn one_layer_one_device() {
    let mut l = layer();
    l.param_bytes = 10;
    l.grad_bytes = 10;
    l.optimizer_bytes = 20;
    l.saved_bytes = [7, 5, 3];
    l.workspace_bytes = 4;
    let plan = feasible(solve(&problem(vec![l], 1, 4)));
    // d = 1, p = 1, m = 4: time = (4 + 1 − 1) · 3 = 12; memory = 40 + min(1, 4)·7 + 4 = 51.
    assert_eq!(
        (plan.dp, plan.pp, plan.num_micro_batches, plan.devices_used),
        (1, 1, 4, 1)
    );
    assert!(close(plan.time_per_batch_s, 12.0));
    assert!(close(plan.throughput_samples_per_s, 4.0 / 12.0));
    let s = &plan.stages[0];
    assert_eq!(
        (s.first_layer, s.last_layer, s.memory_bytes, s.in_flight),
        (0, 0, 51, 1)
    );
    assert_eq!(s.recompute, Recompute::None);
    assert_eq!(s.exposed_dp_s, 0.0);
}

#[test]
fn two_stages_beat_one() {
    // Two layers, N = 2, B = 8. Heavy gradients make DP expensive:
    //   d=1,p=1: 8 · 6 = 48
    //   d=1,p=2: T = 3 + 2·p2p(0) = 3 + 2·0.1 = 3.2 → (8 + 1) · 3.2 = 28.8
    //   d=2,p=1: m = 4 → 4 · 6 + AR, AR = 1 · 2e10/1e9 + 2 · 0.1 = 20.2 → 44.2
    let mut l = layer();
    l.grad_bytes = 10_000_000_000;
    let plan = feasible(solve(&problem(vec![l.clone(), l], 2, 8)));
    assert_eq!((plan.dp, plan.pp), (1, 2));
    assert!(
        close(plan.time_per_batch_s, 28.8),
        "{}",
        plan.time_per_batch_s
    );
    assert_eq!(
        (plan.stages[0].first_layer, plan.stages[0].last_layer),
        (0, 0)
    );
    assert_eq!(
        (plan.stages[1].first_layer, plan.stages[1].last_layer),
        (1, 1)
    );
    assert!(close(plan.stages[0].time_s, 3.2) && close(plan.stages[1].time_s, 3.2));
    // 1F1B: the first of two stages holds 2 micro-batches, the last one.
    assert_eq!((plan.stages[0].in_flight, plan.stages[1].in_flight), (2, 1));
}

#[test]
fn memory_forces_recompute() {
    let mut l = layer();
    l.saved_bytes = [100, 50, 10];
    l.recompute_s = [0.0, 0.5, 1.0];
    let mut prob = problem(vec![l], 1, 1);
    // m = 1: one micro-batch in flight. HBM 60 → selective (50 fits, 100 does not).
    prob.hbm_bytes = 60;
    let plan = feasible(solve(&prob));
    assert_eq!(plan.stages[0].recompute, Recompute::Selective);
    assert!(close(plan.time_per_batch_s, 3.5));
    assert_eq!(plan.stages[0].memory_bytes, 50);
    // HBM 20 → full.
    prob.hbm_bytes = 20;
    let plan = feasible(solve(&prob));
    assert_eq!(plan.stages[0].recompute, Recompute::Full);
    assert!(close(plan.time_per_batch_s, 4.0));
    // HBM 5 → nothing fits; the least it could need is 10 bytes.
    prob.hbm_bytes = 5;
    match solve(&prob) {
        Solution::Infeasible(v) => {
            assert_eq!(v.kind, ViolationKind::Memory);
            assert_eq!(v.needed_bytes, Some(10));
            assert!(
                v.message.starts_with("memory:") && v.message.contains("10 bytes"),
                "{}",
                v.message
            );
        }
        s => panic!("{s:?}"),
    }
}

#[test]
fn memory_forces_more_stages() {
    // Two layers of 100 weight bytes each, HBM 150, very slow p2p: p = 1 would be faster,
    // but needs 200 bytes; d = 2, p = 1 replicates the 200 bytes. Only p = 2 fits.
    let mut l = layer();
    l.param_bytes = 100;
    let mut prob = problem(vec![l.clone(), l], 2, 2);
    prob.levels = vec![level(2, 1e9, 10.0)];
    prob.hbm_bytes = 150;
    let plan = feasible(solve(&prob));
    assert_eq!((plan.dp, plan.pp), (1, 2));
    assert_eq!(plan.max_memory_bytes, 100);
    // T = 3 + 2·10 = 23, m = 2: (2 + 1) · 23 = 69.
    assert!(close(plan.time_per_batch_s, 69.0));
    // With room for both layers, d = 1, p = 1 wins: (2 + 0) · 6 = 12 (d = 2: 6 + 2·10 = 26).
    prob.hbm_bytes = 200;
    let plan = feasible(solve(&prob));
    assert_eq!((plan.dp, plan.pp), (1, 1));
    assert!(close(plan.time_per_batch_s, 12.0));
}

#[test]
fn in_flight_counts_drive_the_split() {
    // Three equal layers with 10 stash bytes each, 2 stages, m = 4, HBM 20: the first stage
    // holds 2 micro-batches (one layer: 20 bytes), the last holds 1 (two layers: 20 bytes).
    let mut l = layer();
    l.saved_bytes = [10, 10, 10];
    let mut prob = problem(vec![l.clone(), l.clone(), l], 2, 4);
    prob.hbm_bytes = 20;
    prob.max_stages = Some(2);
    prob.levels = vec![level(2, 1e9, 0.0)];
    let plan = feasible(solve(&prob));
    assert_eq!(plan.pp, 2);
    assert_eq!(plan.stages[0].last_layer, 0);
    assert_eq!(
        plan.stages
            .iter()
            .map(|s| s.memory_bytes)
            .collect::<Vec<_>>(),
        vec![20, 20]
    );
}

#[test]
fn infeasible_reasons() {
    let mut prob = problem(vec![layer()], 4, 6);
    prob.micro_batch = 4;
    match solve(&prob) {
        Solution::Infeasible(v) => {
            assert_eq!(v.kind, ViolationKind::Batch);
            assert!(
                v.message.contains("B = 6") && v.message.contains("b = 4"),
                "{}",
                v.message
            );
        }
        s => panic!("{s:?}"),
    }
    let mut prob = problem(vec![layer()], 4, 8);
    prob.tp = 8;
    match solve(&prob) {
        Solution::Infeasible(v) => {
            assert_eq!(v.kind, ViolationKind::Devices);
            assert_eq!(v.message, "devices: t = 8 exceeds N = 4");
        }
        s => panic!("{s:?}"),
    }
    let mut prob = problem(vec![layer()], 4, 8);
    prob.layers.clear();
    assert!(matches!(solve(&prob), Solution::Infeasible(v) if v.kind == ViolationKind::Input));
}

#[test]
fn memory_infeasible_reports_the_least_needed() {
    // Four layers of 100 bytes, 2 devices, HBM 99: the best option is p = 2 (200 per stage).
    let mut l = layer();
    l.param_bytes = 100;
    let mut prob = problem(vec![l; 4], 2, 2);
    prob.hbm_bytes = 99;
    match solve(&prob) {
        Solution::Infeasible(v) => {
            assert_eq!(v.kind, ViolationKind::Memory);
            assert_eq!((v.needed_bytes, v.dp, v.pp), (Some(200), Some(1), Some(2)));
        }
        s => panic!("{s:?}"),
    }
}

#[test]
fn overlap_on_and_off() {
    // One layer, N = 2, B = 2. d = 1: m = 2 → 6. d = 2: m = 1 → 3 + E, with
    // AR = 1 · 1e9/1e9 + 2 · 0.1 = 1.2. Off: 4.2. On: max(0, 1.2 − bwd 2) = 0 → 3.
    let mut l = layer();
    l.grad_bytes = 1_000_000_000;
    let mut prob = problem(vec![l], 2, 2);
    let plan = feasible(solve(&prob));
    assert_eq!(plan.dp, 2);
    assert!(close(plan.time_per_batch_s, 4.2));
    assert!(close(plan.stages[0].dp_comm_s, 1.2) && close(plan.stages[0].exposed_dp_s, 1.2));
    prob.dp_overlap = true;
    let plan = feasible(solve(&prob));
    assert_eq!(plan.dp, 2);
    assert!(close(plan.time_per_batch_s, 3.0));
    assert_eq!(plan.stages[0].exposed_dp_s, 0.0);
    // Partly hidden: bwd 0.5 → E = 0.7; d = 2 gives (1 + 0)·1.5 + 0.7 = 2.2 vs d = 1: 2·1.5 = 3.
    prob.layers[0].bwd_s = 0.5;
    let plan = feasible(solve(&prob));
    assert!(
        close(plan.time_per_batch_s, 2.2),
        "{}",
        plan.time_per_batch_s
    );
}

#[test]
fn an_overlapped_collective_takes_its_share_of_the_compute() {
    // overlap_on_and_off's d = 2 (AR 1.2 s beside bwd 2 s) on a level whose collectives take
    // a quarter of the compute: E = max(1.2 − 2, 0.25 · min(1.2, 2)) = 0.3 → 3.3. Partly
    // hidden (bwd 0.5): E = max(1.2 − 0.5, 0.25 · 0.5) = 0.7, as without the share.
    let mut l = layer();
    l.grad_bytes = 1_000_000_000;
    let mut prob = problem(vec![l], 2, 2);
    prob.dp_overlap = true;
    prob.levels[0].collective_compute_share = 0.25;
    let plan = feasible(solve(&prob));
    assert_eq!(plan.dp, 2);
    assert!(
        close(plan.stages[0].exposed_dp_s, 0.3),
        "{}",
        plan.stages[0].exposed_dp_s
    );
    assert!(
        close(plan.time_per_batch_s, 3.3),
        "{}",
        plan.time_per_batch_s
    );
    prob.layers[0].bwd_s = 0.5;
    let plan = feasible(solve(&prob));
    assert!(
        close(plan.time_per_batch_s, 2.2),
        "{}",
        plan.time_per_batch_s
    );
    // Not a fraction: refused.
    prob.levels[0].collective_compute_share = 1.5;
    assert!(matches!(solve(&prob), Solution::Infeasible(v)
        if v.kind == ViolationKind::Input && v.message.contains("collective_compute_share")));
}

/// Three layers (fwd 1 s, bwd 2 s) of 1.8 GB of parameters and gradients each, ZeRO-3
/// overlapped, in one stage.
fn three_fsdp_layers() -> Problem {
    let mut l = layer();
    l.param_bytes = 1_800_000_000;
    l.grad_bytes = 1_800_000_000;
    let mut prob = problem(vec![l; 3], 2, 2);
    prob.zero = Some(Zero::Parameters);
    prob.dp_overlap = true;
    prob.max_stages = Some(1);
    prob
}

#[test]
fn fsdp_overlaps_each_layer_with_the_one_beside_it() {
    // Three layers (fwd 1 s, bwd 2 s), ZeRO-3 over d = 2, one stage: each layer's all-gather
    // and reduce-scatter is 0.5 · 1.8e9 / 1e9 + 0.1 = 1 s. Forward: the first all-gather alone
    // (1), the next two beside layers 0 and 1 (hidden). Backward: the last layer's all-gather
    // alone (1), layer 1's beside layer 2's backward, layer 2's reduce-scatter and layer 0's
    // all-gather (2 s) beside layer 1's (2 s), layer 1's reduce-scatter beside layer 0's, and
    // layer 0's reduce-scatter alone (1): 3 s a micro-batch, T = 9 + 3 = 12 (d = 1: 2 · 9).
    // Summed over the stage, all of it hid behind the compute (T = 9).
    let mut prob = three_fsdp_layers();
    let plan = feasible(solve(&prob));
    assert_eq!((plan.dp, plan.pp), (2, 1));
    assert!(
        close(plan.time_per_batch_s, 12.0),
        "{}",
        plan.time_per_batch_s
    );
    assert!(close(plan.stages[0].time_parts.zero_comm_s, 3.0));
    // Each collective beside compute also takes a quarter of it: forward 1 + 2 · 0.25, backward
    // 1 + 0.25 + 0.25 · 2 + 0.25 + 1: 4.5 s, T = 13.5.
    prob.levels[0].collective_compute_share = 0.25;
    let plan = feasible(solve(&prob));
    assert!(
        close(plan.time_per_batch_s, 13.5),
        "{}",
        plan.time_per_batch_s
    );
    // Without overlap: the stage's bytes in one collective per pass, 0.5 · 5.4 + 0.1 = 2.8 s
    // each, three of them: T = 9 + 8.4.
    prob.dp_overlap = false;
    let plan = feasible(solve(&prob));
    assert!(
        close(plan.time_per_batch_s, 17.4),
        "{}",
        plan.time_per_batch_s
    );
}

#[test]
fn fsdp_copies_add_their_bytes_at_the_memory_bound_rate() {
    // The case above at d = 2 (T = 12: 9 s of compute, 3 s of collectives a micro-batch,
    // m = 1) with FSDP's copies at 1e9 B/s, bf16 parameters (an fp32 master: k = 2) reduced in bf16
    // (s = 1). P = G = 5.4e9 over the stage, their shards over d = 2 2.7e9 each.
    let mut prob = three_fsdp_layers();
    let priced = |prob: &Problem, implementation| {
        let mut with = prob.clone();
        with.fsdp_copies = Some(FsdpCopies {
            bandwidth_bps: 1e9,
            implementation,
            master_scale: 2.0,
        });
        evaluate_fixed(&with, 1, 2).unwrap().plan.unwrap()
    };
    // FSDP2, per gather (twice): the shard cast (2 + 1) · 2.7 and copied in 2 · 2.7, the copy
    // out 2 · 5.4: 24.3; the gradients chunk-cat into the reduce-scatter input (1 + 1) · 5.4;
    // the reduced bf16 shard cast to fp32 (1 + 2) · 2.7: 48.6 + 10.8 + 8.1 = 67.5 s.
    let plan = priced(&prob, FsdpImplementation::Fsdp2);
    assert!(
        close(plan.time_per_batch_s, 12.0 + 67.5),
        "{}",
        plan.time_per_batch_s
    );
    assert!(close(plan.stages[0].time_parts.zero_comm_s, 3.0 + 67.5));
    // FSDP1: the shard cast twice, 2 · 3 · 2.7; the flat gradient's concatenation 2 · 5.4, its
    // pre-divide 2 · 5.4, the shard's post-divide 2 · 2.7 and cast (1 + 2) · 2.7: 51.3 s.
    let plan = priced(&prob, FsdpImplementation::Fsdp1);
    assert!(
        close(plan.time_per_batch_s, 12.0 + 51.3),
        "{}",
        plan.time_per_batch_s
    );
    // Reduced in fp32 (s = 2, the master's dtype): FSDP2's chunk-cat writes twice the bytes,
    // (1 + 2) · 5.4, and the shard needs no cast: 48.6 + 16.2 = 64.8 s.
    prob.grad_reduce_scale = 2.0;
    let base = evaluate_fixed(&prob, 1, 2)
        .unwrap()
        .plan
        .unwrap()
        .time_per_batch_s;
    let plan = priced(&prob, FsdpImplementation::Fsdp2);
    assert!(
        close(plan.time_per_batch_s, base + 64.8),
        "{} {base}",
        plan.time_per_batch_s
    );
    // Below ZeRO-3 nothing is FSDP's: the plan is the same to the bit.
    prob.zero = Some(Zero::Gradients);
    let plain = evaluate_fixed(&prob, 1, 2).unwrap().plan.unwrap();
    assert_eq!(priced(&prob, FsdpImplementation::Fsdp2), plain);
}

#[test]
fn tp_groups_take_t_devices_and_add_no_time() {
    // t = 2 inside nodes of 2 (level 0: 1e9 B/s, 1e-3 s), the cluster of 4 on level 1
    // (1e8 B/s, 1e-2 s). A layer's TP collectives are in its fwd_s/bwd_s: one stage of one
    // replica on 2 devices costs the layer's 3 s, nothing more.
    let mut prob = problem(vec![layer()], 4, 1);
    prob.tp = 2;
    prob.levels = vec![level(2, 1e9, 1e-3), level(4, 1e8, 1e-2)];
    let plan = feasible(solve(&prob));
    assert_eq!((plan.dp, plan.pp, plan.devices_used), (1, 1, 2));
    assert_eq!(plan.time_per_batch_s, 3.0);
}

#[test]
fn tie_break_prefers_fewer_devices_then_smaller_split_then_lower_policy() {
    // Everything free: every option costs 0; the smallest one wins.
    let zero = Layer::default();
    let mut prob = problem(vec![zero; 3], 8, 8);
    prob.levels = vec![level(8, 1e9, 0.0)];
    let plan = feasible(solve(&prob));
    assert_eq!((plan.dp, plan.pp, plan.time_per_batch_s), (1, 1, 0.0));
    assert_eq!(plan.stages[0].recompute, Recompute::None);

    // Three unit layers, memory forces 2 stages, max 2 stages, free p2p, m = 1:
    // [0][1,2] and [0,1][2] both cost (1 + 1)·6 = 12: the earlier cut wins.
    let mut l = layer();
    l.param_bytes = 100;
    let mut prob = problem(vec![l; 3], 2, 1);
    prob.levels = vec![level(2, 1e9, 0.0)];
    prob.hbm_bytes = 200;
    prob.max_stages = Some(2);
    let plan = feasible(solve(&prob));
    assert!(close(plan.time_per_batch_s, 12.0));
    assert_eq!(plan.stages[0].last_layer, 0);

    // A non-critical stage takes the lowest policy index that keeps the optimum, even when a
    // higher index would be faster (odd data: "none" costs recompute time here).
    let mut heavy = layer();
    heavy.fwd_s = 10.0;
    let mut light = layer();
    light.recompute_s = [0.5, 0.0, 0.0];
    heavy.recompute_s = [0.5, 0.0, 0.0];
    let mut prob = problem(vec![heavy, light], 2, 1);
    prob.levels = vec![level(2, 1e9, 0.0)];
    prob.max_stages = Some(2);
    prob.devices = 2;
    let ev = evaluate_fixed(&prob, 2, 1).unwrap();
    let plan = ev.plan.unwrap();
    assert_eq!(plan.stages[0].recompute, Recompute::Selective); // critical: fastest
    assert_eq!(plan.stages[1].recompute, Recompute::None); // slack: lowest index
    assert!(close(plan.time_per_batch_s, 2.0 * 12.0));
}

#[test]
fn evaluate_fixed_reports_and_still_prices() {
    let mut l = layer();
    l.param_bytes = 100;
    let mut prob = problem(vec![l; 4], 4, 4);
    prob.hbm_bytes = 150;
    // p = 2 needs 200 bytes per stage: memory violation, but the plan is still priced.
    let ev = evaluate_fixed(&prob, 2, 1).unwrap();
    assert!(!ev.feasible);
    assert_eq!(ev.violations.len(), 1);
    assert_eq!(ev.violations[0].kind, ViolationKind::Memory);
    assert_eq!(ev.violations[0].needed_bytes, Some(200));
    let plan = ev.plan.unwrap();
    assert_eq!(plan.max_memory_bytes, 200);
    assert_eq!(
        (plan.stages[0].last_layer, plan.stages[1].last_layer),
        (1, 3)
    );
    // p = 4 fits.
    let ev = evaluate_fixed(&prob, 4, 1).unwrap();
    assert!(ev.feasible && ev.violations.is_empty());
    assert_eq!(ev.plan.unwrap().pp, 4);
    // Too many devices: reported, still priced.
    let ev = evaluate_fixed(&prob, 4, 2).unwrap();
    assert!(!ev.feasible);
    assert_eq!(ev.violations[0].kind, ViolationKind::Devices);
    assert!(ev.plan.is_some());
    // More stages than layers and an indivisible batch: reported, no numbers.
    let ev = evaluate_fixed(&prob, 5, 3).unwrap();
    let kinds: Vec<_> = ev.violations.iter().map(|v| v.kind).collect();
    assert!(kinds.contains(&ViolationKind::Stages) && kinds.contains(&ViolationKind::Batch));
    assert!(ev.plan.is_none());
    assert!(evaluate_fixed(&prob, 0, 1).is_err());
}

#[test]
fn solve_many_keeps_order() {
    let probs: Vec<Problem> = (1..=6).map(|b| problem(vec![layer(); 2], 2, b)).collect();
    let sols = solve_many(&probs);
    assert_eq!(sols.len(), 6);
    for (p, s) in probs.iter().zip(&sols) {
        assert_eq!(*s, solve(p));
    }
}

#[test]
fn a_fixed_recompute_setting_is_the_only_policy() {
    // The layer of `memory_forces_recompute`: stash 100/50/10 bytes, extra 0/0.5/1 s.
    let mut l = layer();
    l.saved_bytes = [100, 50, 10];
    l.recompute_s = [0.0, 0.5, 1.0];
    let mut prob = problem(vec![l], 1, 1);
    prob.hbm_bytes = 1000; // everything fits: auto takes none (3 s)
    assert_eq!(feasible(solve(&prob)).stages[0].recompute, Recompute::None);
    // Fixed full: full although none fits and is faster; 3 + 1 = 4 s, 10 bytes.
    prob.recompute = Some(Recompute::Full);
    let plan = feasible(solve(&prob));
    assert_eq!(plan.stages[0].recompute, Recompute::Full);
    assert!(close(plan.time_per_batch_s, 4.0));
    assert_eq!(plan.stages[0].memory_bytes, 10);
    let ev = evaluate_fixed(&prob, 1, 1).unwrap();
    assert_eq!(ev.plan.unwrap().stages[0].recompute, Recompute::Full);
    // Fixed none with HBM 60: auto would take selective; none does not fit, and the report
    // needs none's 100 bytes (not selective's 50) and names the setting.
    prob.hbm_bytes = 60;
    prob.recompute = Some(Recompute::None);
    match solve(&prob) {
        Solution::Infeasible(v) => {
            assert_eq!(v.kind, ViolationKind::Memory);
            assert_eq!(v.needed_bytes, Some(100));
            assert!(v.message.contains("recompute none"), "{}", v.message);
        }
        s => panic!("{s:?}"),
    }
    let ev = evaluate_fixed(&prob, 1, 1).unwrap();
    assert!(!ev.feasible);
    assert_eq!(ev.violations[0].needed_bytes, Some(100));
    assert!(ev.violations[0].message.contains("recompute none"));
    assert_eq!(ev.plan.unwrap().stages[0].recompute, Recompute::None);
    // Auto: no mention of a setting.
    prob.recompute = None;
    prob.hbm_bytes = 5;
    match solve(&prob) {
        Solution::Infeasible(v) => assert!(!v.message.contains("recompute"), "{}", v.message),
        s => panic!("{s:?}"),
    }
}

#[test]
fn recompute_settings_by_name() {
    assert_eq!(Recompute::setting("auto"), Ok(None));
    for r in Recompute::ALL {
        assert_eq!(Recompute::setting(r.as_str()), Ok(Some(r)));
    }
    let e = Recompute::setting("most").unwrap_err();
    assert_eq!(
        e.message,
        "recompute must be one of auto, none, selective, full, got \"most\""
    );
}

/// The a100 preset's levels: nodes of 8 GPUs (216.5e9 B/s, 6.34 µs), the cluster over one
/// 25e9 B/s NIC per GPU (5 µs).
fn a100_levels() -> Vec<NetLevel> {
    vec![level(8, 216.5e9, 6.34e-6), level(4096, 25e9, 5e-6)]
}

#[test]
fn dp_all_reduce_is_rail_aware() {
    // One stage per layer, 1e9 gradient bytes per layer, 32 GPUs in 4 nodes of 8. The device
    // order is TP, then PP, then DP: a DP group's members lie p·t apart, so k = min(d, 8 / (p·t))
    // of them share a node and drive k NICs: bw = min(k · 25e9, 216.5e9).
    let ar = |d: u64, p: usize, t: u64, levels: Vec<NetLevel>| {
        let mut l = layer();
        l.grad_bytes = 1_000_000_000;
        let mut prob = problem(vec![l; p], 32, d);
        prob.tp = t;
        prob.levels = levels;
        let ev = evaluate_fixed(&prob, p, d).unwrap();
        assert!(ev.feasible, "{:?}", ev.violations);
        ev.plan.unwrap().stages[0].dp_comm_s
    };
    let expect = |d: f64, bw: f64, lat: f64| 2.0 * (d - 1.0) / d * 1e9 / bw + 2.0 * (d - 1.0) * lat;
    // t = 8: one GPU per node, one NIC: 25e9.
    assert_eq!(ar(4, 1, 8, a100_levels()), expect(4.0, 25e9, 5e-6));
    // t = 4: two per node: 50e9.
    assert_eq!(ar(8, 1, 4, a100_levels()), expect(8.0, 50e9, 5e-6));
    // t = 1, p = 2: stride 2, four per node: 100e9.
    assert_eq!(ar(16, 2, 1, a100_levels()), expect(16.0, 100e9, 5e-6));
    // t = 1, p = 1: eight per node: 200e9 (below NVLink's 216.5e9).
    assert_eq!(ar(16, 1, 1, a100_levels()), expect(16.0, 200e9, 5e-6));
    // t = 1, p = 3: stride 3, two per node (8 / 3); d·p·t = 30 <= 32.
    assert_eq!(ar(10, 3, 1, a100_levels()), expect(10.0, 50e9, 5e-6));
    // Inside a node: the node level, unchanged.
    assert_eq!(ar(8, 1, 1, a100_levels()), expect(8.0, 216.5e9, 6.34e-6));
    // Capped by the inner level: 8 · 25e9 > 150e9.
    let slow_node = vec![level(8, 150e9, 6.34e-6), level(4096, 25e9, 5e-6)];
    assert_eq!(ar(16, 1, 1, slow_node), expect(16.0, 150e9, 5e-6));
}

#[test]
fn rank_order_places_dp_and_pipeline_groups() {
    // 1e9 gradient bytes and 1e9 boundary bytes per layer, t = 1, on the a100 levels (nodes of
    // 8). d = 4, p = 4: 16 GPUs in 2 nodes.
    let run_on = |order: RankOrder, uplink_bps: Option<f64>| {
        let mut l = layer();
        l.grad_bytes = 1_000_000_000;
        l.boundary_bytes = 1_000_000_000;
        let mut prob = problem(vec![l; 4], 16, 4);
        prob.levels = a100_levels();
        prob.levels[1].uplink_bps = uplink_bps;
        prob.rank_order = Some(order);
        let ev = evaluate_fixed(&prob, 4, 4).unwrap();
        assert!(ev.feasible, "{:?}", ev.violations);
        let plan = ev.plan.unwrap();
        assert_eq!(plan.rank_order, order);
        plan
    };
    let run = |order: RankOrder| run_on(order, None);
    let expect = |d: f64, bw: f64, lat: f64| 2.0 * (d - 1.0) / d * 1e9 / bw + 2.0 * (d - 1.0) * lat;
    // tp-dp-pp (Megatron-LM's default): the DP group is 4 contiguous GPUs in a node.
    let pp_out = run(RankOrder::TpDpPp);
    assert_eq!(pp_out.stages[0].dp_comm_s, expect(4.0, 216.5e9, 6.34e-6));
    // ... and pipeline neighbours lie 4 apart: stages 1 and 2 straddle the nodes, so every
    // transfer is priced on the cluster level (the slowest pair sets the pace).
    let p2p_cluster = 5e-6 + 1e9 / 25e9;
    assert_eq!(
        pp_out.stages[1].time_s,
        (3.0 + 2.0 * p2p_cluster) + 2.0 * p2p_cluster
    );
    // tp-pp-dp: a replica's 4 GPUs are contiguous (p2p on NVLink); the DP group's members lie
    // 4 apart, two per node: two NICs, 50e9.
    let dp_out = run(RankOrder::TpPpDp);
    assert_eq!(dp_out.stages[0].dp_comm_s, expect(4.0, 50e9, 5e-6));
    let p2p_node = 6.34e-6 + 1e9 / 216.5e9;
    assert_eq!(
        dp_out.stages[1].time_s,
        (3.0 + 2.0 * p2p_node) + 2.0 * p2p_node
    );
    // With a node uplink of 50e9 the groups that leave a node share it. tp-dp-pp: the 4
    // GPUs of the boundary stage send across at once, 50e9 / 4 each (below a NIC's 25e9).
    let p2p_shared = 5e-6 + 1e9 / 12.5e9;
    let pp_out = run_on(RankOrder::TpDpPp, Some(50e9));
    assert_eq!(
        pp_out.stages[1].time_s,
        (3.0 + 2.0 * p2p_shared) + 2.0 * p2p_shared
    );
    // tp-pp-dp: the node's 8 GPUs are in 4 DP groups (2 members each, two NICs, 50e9
    // without the uplink), which share its 50e9: 12.5e9 each.
    let dp_out = run_on(RankOrder::TpPpDp, Some(50e9));
    assert_eq!(dp_out.stages[0].dp_comm_s, expect(4.0, 12.5e9, 5e-6));
    // The names users write.
    assert_eq!(RankOrder::setting("auto"), Ok(None));
    for o in RankOrder::ALL {
        assert_eq!(RankOrder::setting(o.name()), Ok(Some(o)));
    }
    assert!(RankOrder::setting("pp-dp-tp").is_err());
}

/// NCCL's tree on the cluster level: the search's classes of p must tell the trees apart.
#[test]
fn the_search_tells_trees_apart() {
    // 4 layers of 8 + 8 bytes, HBM for 2 of them: p >= 2. d = 8, m = 1: p = 2 and 4 take 12 s
    // of compute (p = 3, 2 + 1 + 1 layers, 18 s); the DP all-reduce and the pipeline's
    // transfers (1 ms each) decide. tp-pp-dp puts the DP group's members p apart: nodes of 8
    // hold k = 4 of them at p = 2 (m = 2 nodes), k = 2 at p = 3 and 4 (m = 4); the rails cap
    // at the node's 2e9 either way and the ring has 7 steps either way (14 ms of latency), so
    // only the tree tells them apart: p = 2 pays 2·3 node and 2·1 cluster latencies (8 ms),
    // p = 3 and 4 2·1 and 2·2 (6 ms). With p = 2 in p = 4's class (a key without the tree)
    // the search priced p = 2 with p = 4's tree and found no plan to rebuild.
    let mut l = layer();
    l.param_bytes = 8;
    l.grad_bytes = 8;
    let mut prob = problem(vec![l; 4], 32, 8);
    prob.hbm_bytes = 40;
    prob.levels = vec![
        level(8, 2e9, 1e-3),
        NetLevel {
            tree: true,
            ..level(4096, 1e9, 1e-3)
        },
    ];
    // A stage's gradients: 8 bytes per layer.
    let tree = |s: &phaze_dp::Stage, chain: f64, depth: f64| {
        let n = 8.0 * (s.last_layer - s.first_layer + 1) as f64;
        2.0 * n / 2e9 + 2.0 * chain * 1e-3 + 2.0 * depth * 1e-3
    };
    let plan = feasible(solve(&prob));
    assert_eq!((plan.dp, plan.pp), (8, 2));
    for s in &plan.stages {
        assert_eq!(s.dp_comm_s, tree(s, 3.0, 1.0));
    }
    for p in 2..=4 {
        let fixed = evaluate_fixed(&prob, p, 8).unwrap().plan.unwrap();
        let (chain, depth) = if p == 2 { (3.0, 1.0) } else { (1.0, 2.0) };
        for s in &fixed.stages {
            assert_eq!(s.dp_comm_s, tree(s, chain, depth));
        }
        assert!(plan.time_per_batch_s <= fixed.time_per_batch_s);
    }
    assert_eq!(
        plan.time_per_batch_s,
        evaluate_fixed(&prob, 2, 8)
            .unwrap()
            .plan
            .unwrap()
            .time_per_batch_s
    );
}

#[test]
fn the_optimizer_step_follows_the_flush() {
    // Four layers of c = 3 s with an optimizer step of 4 s each, N = 4, B = 4, no gradient
    // bytes (a DP all-reduce over g costs its latency, 2(g − 1) · 0.1 s):
    //   d=1,p=1: m = 4, 4 · 12 + 16 = 64
    //   d=1,p=2: T = 6 + 2·0.1 = 6.2, (4 + 1) · 6.2 + 8 = 39
    //   d=1,p=4: T = 3.4 (a middle stage: p2p in and out), (4 + 3) · 3.4 + 4 = 27.8
    //   d=2,p=2: m = 2, (2 + 1) · 6.2 + 0.2 + 8 = 26.8
    //   d=4,p=1: m = 1, 12 + 0.6 + 16 = 28.6: every replica steps the whole model
    //   d=2,p=1: m = 2, 24 + 0.2 + 16 = 40.2
    // Without the optimizer step d = 4 would win (12.6 against 18.8).
    let mut l = layer();
    l.opt_s = 4.0;
    let mut prob = problem(vec![l; 4], 4, 4);
    let plan = feasible(solve(&prob));
    assert_eq!((plan.dp, plan.pp), (2, 2));
    assert!(
        close(plan.time_per_batch_s, 26.8),
        "{}",
        plan.time_per_batch_s
    );
    assert!(close(plan.max_optimizer_s, 8.0));
    assert!(plan.stages.iter().all(|s| close(s.optimizer_s, 8.0)));
    // ZeRO-1 splits the optimizer step over the d replicas: d = 4, p = 1 updates 16 / 4 = 4 s
    // of it on each device, after a reduce-scatter and before an all-gather of 3 · 0.1 s
    // each: 12 + 0.6 + 4 = 16.6, the best (d = 2, p = 2: 18.6 + 0.2 + 8 / 2 = 22.8).
    prob.zero = Some(Zero::Optimizer);
    let plan = feasible(solve(&prob));
    assert_eq!((plan.dp, plan.pp, plan.zero), (4, 1, Zero::Optimizer));
    assert!(
        close(plan.time_per_batch_s, 16.6),
        "{}",
        plan.time_per_batch_s
    );
    assert!(close(plan.stages[0].optimizer_s, 4.0));
    // The stage's time by part: all of it compute here.
    let parts = plan.stages[0].time_parts;
    assert_eq!(
        (parts.compute_s, parts.recompute_s, parts.pp_comm_s),
        (12.0, 0.0, 0.0)
    );
}

#[test]
fn context_parallelism_shares_the_state_over_the_dp_cp_group() {
    // Two layers of 3 s (fwd 1, bwd 2, as priced for one device of a CP group), each with 1e9
    // weight and 1e9 gradient bytes, 4e9 optimizer bytes and a 4 s optimizer step. N = 4 on
    // one level (1e9 B/s, 0.1 s), B = 2, b = 1, t = 1, c = 2, ZeRO-1, no overlap.
    //
    // Devices d·p·t·c <= 4, so d·p <= 2; m = B / (b·d), c does not divide the batch. The
    // DP×CP group has g = d·c devices, t = 1 apart. ZeRO-1 per step: a reduce-scatter of the
    // stage's gradients and an all-gather of its weights, each (g − 1)/g · bytes / 1e9 +
    // (g − 1) · 0.1; the optimizer step and state divided by g.
    //   d=1,p=1: 2 devices, m = 2, g = 2: T = 6; RS = AG = 1/2 · 2 + 0.1 = 1.1 → E = 2.2;
    //            O = 8 / 2 = 4; (2 + 0) · 6 + 2.2 + 4 = 18.2
    //   d=1,p=2: 4 devices, m = 2, g = 2: T = 3 + 2 · p2p(0) = 3.2; RS = AG = 1/2 + 0.1 = 0.6
    //            → E = 1.2; O = 4 / 2 = 2; (2 + 1) · 3.2 + 1.2 + 2 = 12.8
    //   d=2,p=1: 4 devices, m = 1, g = 4: T = 6; RS = AG = 3/4 · 2 + 3 · 0.1 = 1.8 → E = 3.6;
    //            O = 8 / 4 = 2; (1 + 0) · 6 + 3.6 + 2 = 11.6, the best
    // Memory of d=2,p=1: weights 2e9 + gradients 2e9 + optimizer 8e9 / 4 = 6e9.
    let mut l = layer();
    l.param_bytes = 1_000_000_000;
    l.grad_bytes = 1_000_000_000;
    l.optimizer_bytes = 4_000_000_000;
    l.opt_s = 4.0;
    let mut prob = problem(vec![l; 2], 4, 2);
    prob.cp = 2;
    prob.rank_order = None;
    prob.zero = Some(Zero::Optimizer);
    prob.recompute = Some(Recompute::None);
    let plan = feasible(solve(&prob));
    assert_eq!(
        (
            plan.dp,
            plan.pp,
            plan.cp,
            plan.num_micro_batches,
            plan.devices_used
        ),
        (2, 1, 2, 1, 4)
    );
    assert_eq!(plan.rank_order, RankOrder::TpDpPp);
    assert!(
        close(plan.time_per_batch_s, 11.6),
        "{}",
        plan.time_per_batch_s
    );
    assert!(close(plan.throughput_samples_per_s, 2.0 / 11.6));
    let s = &plan.stages[0];
    assert!(close(s.time_s, 6.0), "{}", s.time_s);
    assert!(
        close(s.dp_comm_s, 3.6) && close(s.exposed_dp_s, 3.6),
        "{s:?}"
    );
    assert!(close(s.optimizer_s, 2.0), "{}", s.optimizer_s);
    assert_eq!(
        (s.memory.params, s.memory.grads, s.memory.optimizer),
        (2_000_000_000, 2_000_000_000, 2_000_000_000)
    );
    assert_eq!(s.memory_bytes, 6_000_000_000);
    // The other two placements, fixed.
    let ev = evaluate_fixed(&prob, 1, 1).unwrap();
    assert!(ev.feasible, "{:?}", ev.violations);
    let one = ev.plan.unwrap();
    assert_eq!((one.num_micro_batches, one.devices_used), (2, 2));
    assert!(
        close(one.time_per_batch_s, 18.2),
        "{}",
        one.time_per_batch_s
    );
    assert!(close(one.stages[0].dp_comm_s, 2.2) && close(one.stages[0].optimizer_s, 4.0));
    assert_eq!(one.stages[0].memory.optimizer, 4_000_000_000);
    let ev = evaluate_fixed(&prob, 2, 1).unwrap();
    assert!(ev.feasible, "{:?}", ev.violations);
    let two = ev.plan.unwrap();
    assert_eq!((two.num_micro_batches, two.devices_used), (2, 4));
    assert!(
        close(two.time_per_batch_s, 12.8),
        "{}",
        two.time_per_batch_s
    );
    for s in &two.stages {
        assert!(close(s.time_s, 3.2) && close(s.dp_comm_s, 1.2) && close(s.optimizer_s, 2.0));
    }
    // d = 2, p = 2 needs d·p·t·c = 8 devices: reported, still priced.
    let ev = evaluate_fixed(&prob, 2, 2).unwrap();
    assert!(!ev.feasible);
    assert_eq!(ev.violations[0].kind, ViolationKind::Devices);
    assert_eq!(
        ev.violations[0].message,
        "devices: d·p·t·c = 2·2·1·2 = 8 exceeds N = 4"
    );
    assert_eq!(ev.plan.unwrap().devices_used, 8);

    // At d = 1 the CP group alone shares the state, so every ZeRO stage is on offer. Auto
    // ZeRO at d = 1, p = 1 (m = 2, g = 2):
    //   ZeRO-0: all-reduce 2 · 1/2 · 2 + 2 · 0.1 = 2.2, O = 8: 12 + 2.2 + 8 = 22.2
    //   ZeRO-1: 18.2 (above)
    //   ZeRO-2: the reduce-scatter (1.1) each micro-batch: 2 · 7.1 + AG 1.1 + 4 = 19.3
    //   ZeRO-3: RS and two AGs each micro-batch: 2 · 9.3 + 4 = 22.6
    prob.zero = None;
    let one = evaluate_fixed(&prob, 1, 1).unwrap().plan.unwrap();
    assert_eq!((one.dp, one.zero), (1, Zero::Optimizer));
    assert!(
        close(one.time_per_batch_s, 18.2),
        "{}",
        one.time_per_batch_s
    );
    for (zero, time) in [
        (Zero::Off, 22.2),
        (Zero::Gradients, 19.3),
        (Zero::Parameters, 22.6),
    ] {
        prob.zero = Some(zero);
        let plan = evaluate_fixed(&prob, 1, 1).unwrap().plan.unwrap();
        assert_eq!(plan.zero, zero);
        assert!(
            close(plan.time_per_batch_s, time),
            "{zero:?}: {}",
            plan.time_per_batch_s
        );
    }
}

#[test]
fn context_parallelism_input_errors_and_refusals() {
    let mut prob = problem(vec![layer(); 2], 4, 2);
    prob.cp = 2;
    // problem() fixes tp-pp-dp: under CP the devices are numbered tp-cp-dp-pp.
    let refused = |prob: &Problem, said: &str| {
        match solve(prob) {
            Solution::Infeasible(v) => {
                assert_eq!(v.kind, ViolationKind::Input);
                assert_eq!(v.message, said);
            }
            s => panic!("{s:?}"),
        }
        assert_eq!(evaluate_fixed(prob, 1, 1).unwrap_err().message, said);
    };
    refused(
        &prob,
        "rank_order tp-pp-dp with cp = 2: context parallelism is numbered tp-cp-dp-pp",
    );
    prob.rank_order = Some(RankOrder::TpDpPp);
    assert_eq!(feasible(solve(&prob)).cp, 2);
    // c = 0.
    let mut zero = prob.clone();
    zero.cp = 0;
    refused(&zero, "cp must be >= 1");
    // t·c > N: refused before any search, t alone fitting or not.
    prob.cp = 8;
    match solve(&prob) {
        Solution::Infeasible(v) => {
            assert_eq!(v.kind, ViolationKind::Devices);
            assert_eq!(v.message, "devices: t·c = 1·8 exceeds N = 4");
        }
        s => panic!("{s:?}"),
    }
    prob.cp = 4;
    prob.tp = 2;
    match solve(&prob) {
        Solution::Infeasible(v) => {
            assert_eq!(v.kind, ViolationKind::Devices);
            assert_eq!(v.message, "devices: t·c = 2·4 exceeds N = 4");
        }
        s => panic!("{s:?}"),
    }
    // t·c = N: one stage, one replica, all 4 devices.
    prob.cp = 2;
    let plan = feasible(solve(&prob));
    assert_eq!((plan.dp, plan.pp, plan.devices_used), (1, 1, 4));
}

#[test]
fn fp8_parameters_are_gathered_at_their_own_bytes() {
    // fsdp_overlaps_each_layer_with_the_one_beside_it's three layers without overlap, their
    // parameters gathered at half their bytes (FP8 weights, 1 byte an element for 2):
    // ZeRO-3's all-gathers of the stage's 2.7e9 bytes take 0.5 · 2.7 + 0.1 = 1.45 s each where
    // 2.8 before, its reduce-scatter 2.8 still: T = 9 + 1.45 + 1.45 + 2.8 = 14.7 (17.4).
    let mut l = layer();
    l.param_bytes = 1_800_000_000;
    l.grad_bytes = 1_800_000_000;
    l.param_gather_bytes = 900_000_000;
    let mut prob = problem(vec![l; 3], 2, 2);
    prob.zero = Some(Zero::Parameters);
    prob.max_stages = Some(1);
    let plan = feasible(solve(&prob));
    assert!(
        close(plan.time_per_batch_s, 14.7),
        "{}",
        plan.time_per_batch_s
    );
    // ZeRO-1: once a step, the gradients' reduce-scatter (2.8 s) and the parameters'
    // all-gather (1.45 s): T = 9 + 4.25.
    prob.zero = Some(Zero::Optimizer);
    let plan = feasible(solve(&prob));
    assert!(
        close(plan.time_per_batch_s, 13.25),
        "{}",
        plan.time_per_batch_s
    );
    // 0 is the parameters' own bytes; more than them is refused.
    prob.layers[0].param_gather_bytes = 0;
    prob.layers[1].param_gather_bytes = 1_800_000_000;
    prob.layers[2].param_gather_bytes = 1_800_000_000;
    let plan = feasible(solve(&prob));
    assert!(
        close(plan.time_per_batch_s, 14.6),
        "{}",
        plan.time_per_batch_s
    );
    prob.layers[0].param_gather_bytes = 1_800_000_001;
    assert!(matches!(solve(&prob), Solution::Infeasible(v)
        if v.kind == ViolationKind::Input && v.message.contains("param_gather_bytes")));
}

#[test]
fn hsdp_shards_in_the_node_and_all_reduces_across_replicas() {
    // One layer (fwd 1 s, bwd 2 s), 1.8 GB of parameters and gradients, ZeRO-3 over d = 4 as
    // HSDP with shard groups of 2 (a node of 2 at 1 GB/s, latency 0.1 s) and 2 replicas
    // across nodes (0.9 GB/s, 0.1 s). In the node each all-gather and reduce-scatter is
    // 0.5 · 1.8e9 / 1e9 + 0.1 = 1 s; across the replicas the all-reduce of each device's
    // 0.9 GB shard is 2 · 0.5 · 0.9e9 / 0.9e9 + 2 · 0.1 = 1.2 s (one member per node: one
    // NIC's rate). Forward: one all-gather; backward: the all-gather, the reduce-scatter and
    // the all-reduce: 4.2 s, T = 3 + 4.2 = 7.2 (m = 1), the same overlapped (one layer: nothing
    // beside it). Memory: the 0.9 GB shard of the parameters, the two gathered layers (3.6 GB)
    // and the gradients' 0.9 GB shard: 5.4 GB, where FSDP over all 4 holds 4.5 GB.
    let mut l = layer();
    l.param_bytes = 1_800_000_000;
    l.grad_bytes = 1_800_000_000;
    let mut prob = problem(vec![l], 4, 4);
    prob.levels = vec![level(2, 1e9, 0.1), level(4, 0.9e9, 0.1)];
    prob.zero = Some(Zero::Parameters);
    prob.max_stages = Some(1);
    prob.dp_shard = Some(2);
    for overlap in [false, true] {
        prob.dp_overlap = overlap;
        let plan = feasible(solve(&prob));
        assert_eq!((plan.dp, plan.pp), (4, 1));
        assert!(
            close(plan.time_per_batch_s, 7.2),
            "{}",
            plan.time_per_batch_s
        );
        assert_eq!(plan.stages[0].memory_bytes, 5_400_000_000);
    }
    prob.dp_shard = None;
    let plan = feasible(solve(&prob));
    assert_eq!(plan.stages[0].memory_bytes, 4_500_000_000);
    // A shard group that does not divide DP is refused; HSDP needs ZeRO 2 or 3.
    prob.dp_shard = Some(3);
    let e = evaluate_fixed(&prob, 1, 4).unwrap_err();
    assert!(e.message.contains("dp_shard = 3"), "{}", e.message);
    prob.dp_shard = Some(2);
    prob.zero = Some(Zero::Optimizer);
    let e = evaluate_fixed(&prob, 1, 4).unwrap_err();
    assert!(
        e.message.contains("zero must be fixed at 2 or 3"),
        "{}",
        e.message
    );
}

/// Three layers of 1.8 GB under ZeRO-3 over d = 4 as HSDP (shard groups of 2 on `node`, 2
/// replicas across on `across`), one stage, DP overlap on: the HSDP tests' problem.
fn hsdp_problem(node: NetLevel, across: NetLevel) -> Problem {
    let mut l = layer();
    l.param_bytes = 1_800_000_000;
    l.grad_bytes = 1_800_000_000;
    let mut prob = problem(vec![l; 3], 4, 4);
    prob.levels = vec![node, across];
    prob.zero = Some(Zero::Parameters);
    prob.max_stages = Some(1);
    prob.dp_shard = Some(2);
    prob.dp_overlap = true;
    prob
}

#[test]
fn hsdp_all_reduces_run_beside_the_backward() {
    // Three layers as in `fsdp_overlaps_each_layer_with_the_one_beside_it`, ZeRO-3 over d = 4
    // as HSDP (shard groups of 2 in a node at 1 GB/s, 2 replicas across at 0.9 GB/s). In the
    // node each layer's all-gather and reduce-scatter is 1 s and they hide as under FSDP over 2
    // (3 s a micro-batch); each layer's all-reduce across the replicas is 1.2 s, layers 1 and
    // 2's (2.4 s) beside the backward of layers 0 and 1 (4 s), hidden, layer 0's after its
    // reduce-scatter, alone: 4.2 s, T = 9 + 4.2 = 13.2. Not overlapped: the stage's bytes in
    // one collective each, 2.8 s the all-gathers and reduce-scatter (0.5 · 5.4 + 0.1) and
    // 3.2 s the all-reduce of the 2.7 GB shard (0.5 · 2 · 2.7e9 / 0.9e9 + 0.2): T = 9 + 11.6.
    let mut prob = hsdp_problem(level(2, 1e9, 0.1), level(4, 0.9e9, 0.1));
    let plan = feasible(solve(&prob));
    assert!(
        close(plan.time_per_batch_s, 13.2),
        "{}",
        plan.time_per_batch_s
    );
    prob.dp_overlap = false;
    let plan = feasible(solve(&prob));
    assert!(
        close(plan.time_per_batch_s, 20.6),
        "{}",
        plan.time_per_batch_s
    );
}

#[test]
fn hsdp_all_reduces_take_the_replicas_level_share_of_the_compute() {
    // `hsdp_all_reduces_run_beside_the_backward` with a compute share on each level: 0.25 in
    // the node (the shard group's all-gathers and reduce-scatters), 0.5 across nodes (the
    // replicas' all-reduces). In the node, forward: layer 0's all-gather alone (1 s), layer 1's
    // and 2's beside the forward of layers 0 and 1 (0.25 · 1 s each); backward: layer 2's
    // all-gather alone (1 s), layer 1's beside layer 2's backward (0.25 · 1 s), layer 2's
    // reduce-scatter and layer 0's all-gather beside layer 1's (0.25 · 2 s), layer 1's
    // reduce-scatter beside layer 0's (0.25 · 1 s), layer 0's alone (1 s): 4.5 s. Across:
    // layers 1 and 2's all-reduces (2.4 s) beside the backward of layers 0 and 1 (4 s) take
    // 0.5 · 2.4 = 1.2 s of it, layer 0's alone 1.2 s: T = 9 + 4.5 + 2.4 = 15.9 (at the node's
    // 0.25 the all-reduces would add 1.2 + 0.6 s: 15.3).
    let mut node = level(2, 1e9, 0.1);
    node.collective_compute_share = 0.25;
    let mut across = level(4, 0.9e9, 0.1);
    across.collective_compute_share = 0.5;
    let prob = hsdp_problem(node, across);
    let plan = feasible(solve(&prob));
    assert!(
        close(plan.time_per_batch_s, 15.9),
        "{}",
        plan.time_per_batch_s
    );
}

#[test]
fn expert_parallelism_under_context_parallelism_spans_the_cp_ranks() {
    // 4 devices, c = 2, d = 2, t = 1, e = 2: numbered tp-cp-ep-dp-pp (Megatron-core 0.9), the
    // EP group is the two replicas at one CP rank, c·t = 2 apart, so it spans 4 devices and
    // crosses the 2-device level: its all-to-all runs at level 1's 1e8 B/s, not level 0's.
    let moe = Layer {
        experts: 2,
        dispatch_bytes: 100_000_000,
        ..layer()
    };
    let mut prob = problem(vec![moe], 4, 2);
    prob.levels = vec![level(2, 1e9, 0.0), level(4, 1e8, 0.0)];
    prob.cp = 2;
    prob.rank_order = Some(RankOrder::TpDpPp);
    prob.expert_parallel = Some(2);
    let plan = evaluate_fixed(&prob, 1, 2).unwrap().plan.unwrap();
    assert_eq!((plan.dp, plan.cp, plan.expert_parallel), (2, 2, 2));
    // One micro-batch (2 samples over d = 2): fwd 1 + bwd 2, and four all-to-alls of
    // (e − 1)/e · 1e8 B at 1e8 B/s = 0.5 s each: 3 + 2 = 5 s.
    assert!(
        close(plan.time_per_batch_s, 5.0),
        "{}",
        plan.time_per_batch_s
    );
    // e must divide d (2), not d·c (4): a fixed e = 4 leaves no degree at d = 2.
    let mut four = prob.clone();
    for l in &mut four.layers {
        l.experts = 4;
    }
    four.expert_parallel = Some(4);
    assert!(four.expert_parallel_degrees(2).is_empty());
}

/// One MoE layer as traced at TP 8 (a device's 1/8 of everything): 2 MB dense weights beside
/// 8 MB of the 8 experts' (each expert 8 MB whole), the same in gradients, 12 + 48 MB of Adam
/// state, 80 MB dispatched a micro-batch (a device's own 1/8 of the routed tokens).
fn moe_at_tp8() -> Layer {
    Layer {
        experts: 8,
        param_bytes: 10_000_000,
        expert_param_bytes: 8_000_000,
        grad_bytes: 10_000_000,
        expert_grad_bytes: 8_000_000,
        optimizer_bytes: 60_000_000,
        expert_optimizer_bytes: 48_000_000,
        dispatch_bytes: 80_000_000,
        ..layer()
    }
}

#[test]
fn expert_tensor_parallelism_folds_the_experts_over_the_tp_ranks() {
    // TP 8, DP 1, EP 8 at ETP 1 on one 8-device node (Megatron-core 0.10's MoE parallel
    // folding: the expert mesh ETP 1 × EP 8 × EDP 1 over the node's 8 TP ranks).
    let mut prob = problem(vec![moe_at_tp8()], 8, 1);
    prob.tp = 8;
    prob.levels = vec![level(8, 1e9, 0.0), level(16, 1e8, 0.0)];
    prob.rank_order = Some(RankOrder::TpDpPp);
    prob.expert_parallel = Some(8);
    // Without folding EP 8 needs 8 replicas (d = 1 has none).
    assert!(prob.expert_parallel_degrees(1).is_empty());
    prob.expert_tensor_parallel = Some(1);
    assert_eq!(prob.expert_parallel_degrees(1), vec![8]);
    let plan = evaluate_fixed(&prob, 1, 1).unwrap().plan.unwrap();
    assert_eq!((plan.dp, plan.tp, plan.expert_parallel), (1, 8, 8));
    // A device holds one expert whole, 8 MB · 8/(1·8) = 8 MB, beside the 2 MB dense part; the
    // gradients alike; no ZeRO: 12 + 48 MB of state. The EDP group is 1 device: no reduction.
    let mem = &plan.stages[0].memory;
    assert_eq!(
        (mem.params, mem.grads, mem.optimizer),
        (10_000_000, 10_000_000, 60_000_000)
    );
    // Four all-to-alls of 7/8 · 80 MB over the 8 devices 1 apart inside the node at 1e9 B/s,
    // 0.07 s each: 3 + 0.28 s.
    assert!(
        close(plan.time_per_batch_s, 3.28),
        "{}",
        plan.time_per_batch_s
    );

    // EP 1 at ETP 1: every device holds all 8 experts whole (64 MB), their gradients
    // all-reduced over the 8 devices holding the same experts (EDP 8, 1 apart):
    // 2 · 7/8 · 64 MB at 1e9 B/s = 0.112 s after the step's 3 s; the dense 2 MB over d = 1: none.
    let mut one = prob.clone();
    one.expert_parallel = Some(1);
    let plan = evaluate_fixed(&one, 1, 1).unwrap().plan.unwrap();
    let mem = &plan.stages[0].memory;
    assert_eq!((mem.params, mem.grads), (66_000_000, 66_000_000));
    assert!(
        close(plan.time_per_batch_s, 3.112),
        "{}",
        plan.time_per_batch_s
    );

    // ETP 2 × EP 8 on TP 8 × DP 2 (two nodes): the EP group is 8 devices 2 apart, spanning
    // both nodes (4 in each: a rail-aware bandwidth of min(4 · 1e8, 1e9) = 4e8 B/s), so each
    // all-to-all takes 7/8 · 80 MB / 4e8 = 0.175 s; a device holds 8 MB · 8/(2·8) = 4 MB of
    // experts, their gradients reduced over EDP = 16/(2·8) = 1 device: none. The dense part's
    // all-reduce over d = 2 (8 apart, one in each node: 1e8 B/s): 2 · 1/2 · 2 MB / 1e8 =
    // 0.02 s. Two samples, one a replica: 3 + 4 · 0.175 + 0.02 s.
    let mut two = prob.clone();
    two.devices = 16;
    two.global_batch = 2;
    two.expert_tensor_parallel = Some(2);
    let plan = evaluate_fixed(&two, 1, 2).unwrap().plan.unwrap();
    assert_eq!((plan.dp, plan.expert_parallel), (2, 8));
    let mem = &plan.stages[0].memory;
    assert_eq!((mem.params, mem.grads), (6_000_000, 6_000_000));
    assert!(
        close(plan.time_per_batch_s, 3.72),
        "{}",
        plan.time_per_batch_s
    );
}

#[test]
fn expert_tensor_parallelism_refuses_what_megatron_refuses() {
    let mut prob = problem(vec![moe_at_tp8()], 8, 1);
    prob.tp = 8;
    prob.rank_order = Some(RankOrder::TpDpPp);
    let refused = |prob: &Problem, said: &str| {
        assert_eq!(evaluate_fixed(prob, 1, 1).unwrap_err().message, said);
    };
    prob.expert_tensor_parallel = Some(3);
    refused(
        &prob,
        "expert_tensor_parallel = 3 must divide the TP width 8",
    );
    prob.expert_tensor_parallel = Some(0);
    refused(
        &prob,
        "expert_tensor_parallel = 0 must divide the TP width 8",
    );
    prob.expert_tensor_parallel = Some(2);
    prob.rank_order = Some(RankOrder::TpPpDp);
    refused(
        &prob,
        "expert_tensor_parallel = 2 with rank_order tp-pp-dp: the expert mesh is numbered \
         tp-ep-dp-pp (Megatron-LM refuses EP under tp-pp-dp mapping)",
    );
    prob.rank_order = Some(RankOrder::TpDpPp);
    let mut dense = prob.clone();
    dense.layers = vec![layer()];
    refused(
        &dense,
        "expert_tensor_parallel = 2: the model has no experts (no MoE layer)",
    );
    // ETP 2 × EP 8 = 16 does not divide the stage's 8 devices (Megatron-core: "decoder
    // world_size is not divisible by expert_tensor_model_pipeline_parallel size").
    prob.expert_parallel = Some(8);
    let eval = evaluate_fixed(&prob, 1, 1).unwrap();
    assert!(!eval.feasible);
    assert_eq!(
        eval.violations[0].message,
        "devices: expert parallel e = 8 at d = 1 needs e·2 (ETP) to divide a stage's t·c·d \
         devices (Megatron-core's expert mesh ETP × EP × EDP)"
    );
    match solve(&prob) {
        Solution::Infeasible(v) => assert_eq!(
            v.message,
            "devices: expert parallel e = 8 needs e·2 (ETP) to divide a stage's t·c·d devices \
             (Megatron-core's expert mesh ETP × EP × EDP); no allowed d is"
        ),
        s => panic!("{s:?}"),
    }
}

/// One layer of fwd 1 s, bwd 2 s whose forward casts its weights to FP8 in 0.5 s, on d = 2
/// replicas, B = 8: m = 4 micro-batches of one sample each.
fn fp8_cast_problem(zero: Zero, recompute: Option<Recompute>) -> Problem {
    let mut l = layer();
    l.cast_s = 0.5;
    l.recompute_s = [0.0, 0.0, 1.0];
    let mut prob = problem(vec![l], 2, 8);
    prob.levels = vec![level(2, 1e9, 0.0)];
    prob.zero = Some(zero);
    prob.recompute = recompute;
    prob
}

#[test]
fn fp8_weight_casts_once_a_step_below_zero3_and_every_forward_under_it() {
    // ZeRO-1: the cast copies are kept for the step, cast once beside the optimizer step:
    // 4 · 3 + 0.5 = 12.5 (not 4 · 3.5 = 14).
    let plan = feasible(solve(&fp8_cast_problem(Zero::Optimizer, None)));
    assert_eq!((plan.dp, plan.pp, plan.num_micro_batches), (2, 1, 4));
    assert!(
        close(plan.time_per_batch_s, 12.5),
        "{}",
        plan.time_per_batch_s
    );
    assert!(close(plan.stages[0].optimizer_s, 0.5));
    // ZeRO-3: no cache, every forward casts: 4 · (3 + 0.5) = 14, nothing once a step.
    let plan = feasible(solve(&fp8_cast_problem(Zero::Parameters, None)));
    assert_eq!((plan.dp, plan.num_micro_batches), (2, 4));
    assert!(
        close(plan.time_per_batch_s, 14.0),
        "{}",
        plan.time_per_batch_s
    );
    assert!(close(plan.stages[0].optimizer_s, 0.0));
    // ZeRO-3 under full recompute: the re-run forward casts again, 4 · (3.5 + 1 + 0.5) = 20;
    // ZeRO-1's re-run reads the kept copies: 4 · (3 + 1) + 0.5 = 16.5.
    let full = Some(Recompute::Full);
    let plan = feasible(solve(&fp8_cast_problem(Zero::Parameters, full)));
    assert!(
        close(plan.time_per_batch_s, 20.0),
        "{}",
        plan.time_per_batch_s
    );
    let plan = feasible(solve(&fp8_cast_problem(Zero::Optimizer, full)));
    assert!(
        close(plan.time_per_batch_s, 16.5),
        "{}",
        plan.time_per_batch_s
    );
}

#[test]
fn expert_parallelism_leaves_a_device_its_own_experts_casts() {
    // 0.4 s of the 0.5 s casts the layer's 2 experts; EP 2 leaves each device one of them:
    // 0.1 + 0.4 / 2 = 0.3 s once a step under ZeRO-1, 4 · 3 + 0.3 = 12.3.
    let mut prob = fp8_cast_problem(Zero::Optimizer, None);
    prob.layers[0].experts = 2;
    prob.layers[0].expert_cast_s = 0.4;
    prob.expert_parallel = Some(2);
    let plan = feasible(solve(&prob));
    assert_eq!((plan.dp, plan.expert_parallel), (2, 2));
    assert!(
        close(plan.time_per_batch_s, 12.3),
        "{}",
        plan.time_per_batch_s
    );
}

#[test]
fn expert_parallelism_prices_the_expert_gemms_at_the_members_shape() {
    // The layer's 2 experts' GEMMs take 0.6 s of its 1 s forward, 1.2 s of its 2 s backward
    // and 0.6 s of full recompute's 1 s at the traced shape, and 0.2, 0.4, 0.2 s at EP 2's:
    // EP 1, 4 · (1 + 2 + 1) = 16; EP 2, 4 · (0.6 + 1.2 + 0.6) = 9.6.
    let mut prob = fp8_cast_problem(Zero::Optimizer, Some(Recompute::Full));
    prob.layers[0].cast_s = 0.0;
    prob.layers[0].experts = 2;
    prob.layers[0].expert_gemm_s = vec![
        ExpertGemms {
            e: 1,
            fwd_s: 0.6,
            bwd_s: 1.2,
            recompute_s: [0.0, 0.0, 0.6],
        },
        ExpertGemms {
            e: 2,
            fwd_s: 0.2,
            bwd_s: 0.4,
            recompute_s: [0.0, 0.0, 0.2],
        },
    ];
    for (e, want) in [(1, 16.0), (2, 9.6)] {
        prob.expert_parallel = Some(e);
        let plan = feasible(solve(&prob));
        assert_eq!((plan.dp, plan.expert_parallel), (2, e));
        assert!(
            close(plan.time_per_batch_s, want),
            "EP {e}: {}",
            plan.time_per_batch_s
        );
    }
    // Auto chooses EP 2, and evaluating the fixed placement prices it alike.
    prob.expert_parallel = None;
    let plan = feasible(solve(&prob));
    assert_eq!(plan.expert_parallel, 2);
    let eval = evaluate_fixed(&prob, 1, 2).unwrap();
    assert!(close(eval.plan.unwrap().time_per_batch_s, 9.6));
    // An entry for an e that does not divide the experts, or none for e = 1, is refused.
    prob.layers[0].expert_gemm_s[1].e = 3;
    assert!(prob.validate().is_err());
    prob.layers[0].expert_gemm_s.remove(0);
    prob.layers[0].expert_gemm_s[0].e = 2;
    assert!(prob.validate().is_err());
}

#[test]
fn zero3_under_expert_parallelism_gathers_a_devices_own_experts() {
    // A dense layer (4 MB of weights) and an MoE layer (10 MB: 2 MB dense beside 8 MB of its 8
    // experts) on d = 8 under ZeRO-3, one stage. A device holds its 1/8 shard and two gathered
    // layers, each its dense part whole and its own experts (torchtitan's FSDP2 shards the
    // experts over the devices holding the same ones, so a gather brings back those alone).
    let dense = Layer {
        param_bytes: 4_000_000,
        ..layer()
    };
    let moe = Layer {
        experts: 8,
        param_bytes: 10_000_000,
        expert_param_bytes: 8_000_000,
        ..layer()
    };
    let mut prob = problem(vec![dense, moe], 8, 8);
    prob.zero = Some(Zero::Parameters);
    let params = |e: u64| {
        let mut at = prob.clone();
        at.expert_parallel = Some(e);
        let plan = evaluate_fixed(&at, 1, 8).unwrap().plan.unwrap();
        assert_eq!((plan.dp, plan.expert_parallel), (8, e));
        plan.stages[0].memory.params
    };
    // EP 1: 14 MB / 8 = 1.75 MB of shard, and the larger layer, 10 MB, twice: 21.75 MB.
    assert_eq!(params(1), 21_750_000);
    // EP 2: the dense 6 MB / 8 = 0.75 MB and the device's 4 MB of experts over the 4 devices
    // holding them, 1 MB; gathered, the MoE layer's 2 + 4 MB is the larger: 0.75 + 1 + 12 MB.
    assert_eq!(params(2), 13_750_000);
    // EP 8: 0.75 MB and the device's one 1 MB expert alone (EDP 1); gathered, the MoE layer is
    // 2 + 1 = 3 MB, the dense layer's 4 MB the larger: 0.75 + 1 + 8 MB. (The larger dense part
    // plus the larger experts' share, 4 + 1 MB, would overcount: the max is of each layer's.)
    assert_eq!(params(8), 9_750_000);

    // Folded (TP 8, ETP 1, EP 4; moe_at_tp8's layer: 2 MB dense beside 8 MB traced at TP 8):
    // a device's experts are 8 MB · 8/(1·4) = 16 MB, sharded over the EDP of 8/(1·4) = 2
    // devices, 8 MB; the dense 2 MB whole (d = 1); gathered, 2 + 16 MB twice: 2 + 8 + 36 MB.
    let mut folded = problem(vec![moe_at_tp8()], 8, 1);
    folded.tp = 8;
    folded.rank_order = Some(RankOrder::TpDpPp);
    folded.expert_tensor_parallel = Some(1);
    folded.expert_parallel = Some(4);
    folded.zero = Some(Zero::Parameters);
    let plan = evaluate_fixed(&folded, 1, 1).unwrap().plan.unwrap();
    assert_eq!((plan.dp, plan.expert_parallel), (1, 4));
    assert_eq!(plan.stages[0].memory.params, 46_000_000);
}
