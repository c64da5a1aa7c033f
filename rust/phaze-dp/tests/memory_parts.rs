//! Each stage's memory by part (`Stage::memory`): the parts add up to `memory_bytes` in every
//! plan (each ZeRO stage, plain and interleaved 1F1B, solved and fixed), each part is what its
//! own formula gives from the plan's layers, and ZeRO-1 divides exactly the optimizer part by
//! the DP degree.

#[allow(dead_code)] // the helpers the other tests use
mod common;
use common::{random_layers, random_levels, Rng};

use phaze_dp::{
    evaluate_fixed, solve, Layer, MemoryParts, NetLevel, Plan, Problem, RankOrder, Recompute, Zero,
};

/// A random problem with a prologue, 4 blocks and a head (so p = 2 can interleave 2 chunks),
/// at ZeRO stage `zero` and chunk count `v`, with HBM large enough that most options fit.
fn random_problem(rng: &mut Rng, zero: Zero, v: Option<u64>) -> Problem {
    // FP8 weight copies from a generator of their own (the instances drawn stay those of before)
    let mut layers = random_layers(rng, 6, 128);
    let mut fp8 = Rng(rng.0 ^ 0x6670_385f_7765_6967);
    for l in &mut layers {
        l.fp8_weight_bytes = fp8.below(32);
    }
    Problem {
        layers,
        devices: 4 << rng.below(3),
        hbm_bytes: 400 + rng.below(2000),
        levels: random_levels(rng),
        global_batch: 8 << rng.below(2),
        micro_batch: 1,
        tp: 1,
        cp: 1,
        dp_overlap: rng.below(2) == 0,
        max_stages: None,
        recompute: None,
        zero: Some(zero),
        virtual_stages: v,
        blocks: Some((1, 4)),
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

/// The layers of each rank: a stage's under 1F1B, the union of its v chunks' when interleaved.
fn rank_layers(plan: &Plan) -> Vec<Vec<usize>> {
    let mut out = vec![Vec::new(); plan.pp];
    for s in &plan.stages {
        out[s.rank].extend(s.first_layer..=s.last_layer);
    }
    out
}

/// Checks every stage of `plan` against the problem: the parts add up to `memory_bytes`, the
/// state parts are the rank's layer sums sharded as its ZeRO stage says, the workspace is the
/// largest layer's, and under 1F1B the activations are `in_flight` stashes of the stage's policy.
/// Returns how many stages it checked.
fn check(prob: &Problem, plan: &Plan) -> usize {
    let d = plan.dp;
    let z = plan.zero.stage();
    let layers = rank_layers(plan);
    assert_eq!(
        plan.max_memory_bytes,
        plan.stages.iter().map(|s| s.memory.total()).max().unwrap()
    );
    for s in &plan.stages {
        let m = &s.memory;
        assert_eq!(m.total(), s.memory_bytes, "{plan:?}");
        let ls: Vec<&Layer> = layers[s.rank].iter().map(|&l| &prob.layers[l]).collect();
        let sum = |f: fn(&Layer) -> u64| ls.iter().map(|l| f(l)).sum::<u64>();
        let shard = |x: u64, on: bool| if on { x.div_ceil(d) } else { x };
        let gathered = if z >= 3 && d > 1 {
            2 * ls.iter().map(|l| l.param_bytes).max().unwrap()
        } else {
            0
        };
        // Transformer Engine's FP8 weight copies: kept beside the weights, none under ZeRO-3
        let fp8 = if z >= 3 {
            0
        } else {
            sum(|l| l.fp8_weight_bytes)
        };
        assert_eq!(
            m.params,
            shard(sum(|l| l.param_bytes), z >= 3) + gathered + fp8
        );
        assert_eq!(m.grads, shard(sum(|l| l.grad_bytes), z >= 2));
        assert_eq!(m.optimizer, shard(sum(|l| l.optimizer_bytes), z >= 1));
        let r = s.recompute.index();
        assert_eq!(
            m.workspace,
            ls.iter()
                .map(|l| if r == 2 {
                    l.workspace_bytes.max(l.recompute_workspace_bytes)
                } else {
                    l.workspace_bytes
                })
                .max()
                .unwrap()
        );
        if plan.virtual_stages == 1 {
            assert_eq!(
                m.activations,
                s.in_flight * ls.iter().map(|l| l.saved_bytes[r]).sum::<u64>()
            );
        }
    }
    // The chunks of one rank report that rank's memory.
    for a in &plan.stages {
        for b in plan.stages.iter().filter(|b| b.rank == a.rank) {
            assert_eq!(a.memory, b.memory);
        }
    }
    plan.stages.len()
}

#[test]
fn the_parts_add_up_to_memory_bytes_in_every_setting() {
    let mut rng = Rng(0x6d65_6d5f_7061_7274);
    let mut checked = [[0usize; 2]; 4];
    for _ in 0..300 {
        for z in 0..4u8 {
            for (vi, v) in [Some(1), Some(2)].into_iter().enumerate() {
                let prob = random_problem(&mut rng, Zero::from_stage(z).unwrap(), v);
                if let Some(plan) = solve(&prob).plan() {
                    checked[z as usize][vi] += check(&prob, plan);
                }
                // A fixed placement, also when it does not fit (the least-memory plan).
                if let Ok(e) = evaluate_fixed(&prob, 2, 2) {
                    if let Some(plan) = &e.plan {
                        checked[z as usize][vi] += check(&prob, plan);
                    }
                }
            }
        }
    }
    // Every ZeRO stage under both schedules was seen many times.
    assert!(checked.iter().flatten().all(|&c| c >= 100), "{checked:?}");
}

/// Two equal blocks' worth of state per layer, at DP 4, PP 2, fixed recompute none.
fn sharded_problem(zero: Zero, v: u64) -> Problem {
    let block = Layer {
        fwd_s: 1.0,
        bwd_s: 2.0,
        saved_bytes: [40, 20, 10],
        param_bytes: 100,
        grad_bytes: 100,
        optimizer_bytes: 1203, // not a multiple of d = 4: the shard is rounded up
        workspace_bytes: 7,
        boundary_bytes: 5,
        ..Default::default()
    };
    Problem {
        layers: vec![block; 8],
        devices: 8,
        hbm_bytes: u64::MAX,
        levels: vec![NetLevel {
            group_size: 8,
            bandwidth_bps: 1e9,
            latency_s: 1e-6,
            ..NetLevel::default()
        }],
        global_batch: 16,
        micro_batch: 1,
        tp: 1,
        cp: 1,
        dp_overlap: false,
        max_stages: None,
        recompute: Some(Recompute::None),
        zero: Some(zero),
        virtual_stages: Some(v),
        blocks: Some((0, 8)),
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

fn fixed_plan(zero: Zero, v: u64) -> Plan {
    let e = evaluate_fixed(&sharded_problem(zero, v), 2, 4).unwrap();
    assert!(e.feasible, "{:?}", e.violations);
    e.plan.unwrap()
}

#[test]
fn zero_1_divides_the_optimizer_part_by_the_dp_degree() {
    for v in [1, 2] {
        let (plain, sharded) = (fixed_plan(Zero::Off, v), fixed_plan(Zero::Optimizer, v));
        assert_eq!((plain.dp, sharded.dp, sharded.virtual_stages), (4, 4, v));
        assert_eq!(plain.stages.len(), sharded.stages.len());
        for (a, b) in plain.stages.iter().zip(&sharded.stages) {
            // Each rank holds 4 layers (one stage of 4, or two chunks of 2): 4 · 1203 bytes of
            // optimizer state, of which ZeRO-1 keeps ⌈4812 / 4⌉.
            assert_eq!(a.memory.optimizer, 4 * 1203);
            assert_eq!(b.memory.optimizer, (4u64 * 1203).div_ceil(4));
            // Nothing else moves.
            let rest = |m: &MemoryParts| MemoryParts { optimizer: 0, ..*m };
            assert_eq!(rest(&a.memory), rest(&b.memory));
            assert_eq!(a.memory_bytes - b.memory_bytes, 4 * 1203 - 1203);
        }
    }
}

#[test]
fn interleaved_activations_are_the_schedules_peak_stash() {
    // Equal chunks of 2 blocks (40 bytes each per micro-batch): the peak stash of a rank is its
    // in-flight chunk-micro-batches times one chunk's stash; rank 0 runs 2(p − 1) + (v − 1)p = 4
    // warm-up forwards, then one more before its first backward.
    let plan = fixed_plan(Zero::Off, 2);
    let ranks: Vec<(u64, u64)> = plan
        .stages
        .iter()
        .map(|s| (s.in_flight, s.memory.activations))
        .collect();
    assert_eq!(ranks, [(5, 5 * 80), (3, 3 * 80), (5, 5 * 80), (3, 3 * 80)]);
    // ZeRO-3 at d = 4: a quarter of each state part, and two gathered layers' parameters.
    let z3 = fixed_plan(Zero::Parameters, 2);
    let m = z3.stages[0].memory;
    assert_eq!(
        (m.params, m.grads, m.optimizer),
        (400 / 4 + 2 * 100, 400 / 4, (4u64 * 1203).div_ceil(4))
    );
}

#[test]
fn freed_gradients_overlap_the_activations_of_a_one_micro_batch_step() {
    // Three layers on one device, one micro-batch per step: (saved, grad) = (50, 10), (30, 20),
    // (5, 40). While layer k's backward runs, layers 0..=k's activations and k..'s gradients
    // are held: k = 0: 50 + 70 = 120, k = 1: 80 + 60 = 140, k = 2: 85 + 40 = 125; the peak is
    // 140 where holding both whole would be 85 + 70 = 155.
    let layer = |saved: u64, grad: u64| Layer {
        fwd_s: 1.0,
        bwd_s: 2.0,
        saved_bytes: [saved, saved, saved],
        param_bytes: 3,
        grad_bytes: grad,
        optimizer_bytes: 6,
        workspace_bytes: 1,
        ..Default::default()
    };
    let mut prob = Problem {
        layers: vec![layer(50, 10), layer(30, 20), layer(5, 40)],
        devices: 1,
        hbm_bytes: u64::MAX,
        levels: vec![NetLevel {
            group_size: 8,
            bandwidth_bps: 1e9,
            latency_s: 1e-6,
            ..NetLevel::default()
        }],
        global_batch: 1,
        micro_batch: 1,
        tp: 1,
        cp: 1,
        dp_overlap: false,
        max_stages: None,
        recompute: Some(Recompute::None),
        zero: None,
        virtual_stages: Some(1),
        blocks: None,
        expert_parallel: Some(1),
        expert_tensor_parallel: None,
        rank_order: None,
        pipeline_split: false,
        grads_freed: true,
        grad_reduce_scale: 1.0,
        dp_shard: None,
        fsdp_copies: None,
    };
    let state = 3 * 3 + 3 * 6 + 1;
    let m = evaluate_fixed(&prob, 1, 1).unwrap().plan.unwrap().stages[0].memory;
    // The activations stashed whole, and the gradients alive at the peak (140 − 85).
    assert_eq!((m.activations, m.grads), (85, 55));
    assert_eq!(m.total(), state + 140);
    // Two micro-batches per step: the first one's gradients are held through the second's
    // backward, so both are counted whole; so too when the runtime keeps a gradient buffer.
    prob.global_batch = 2;
    let two = evaluate_fixed(&prob, 1, 1).unwrap().plan.unwrap().stages[0].memory;
    assert_eq!((two.activations, two.grads), (85, 70));
    prob.global_batch = 1;
    prob.grads_freed = false;
    let kept = evaluate_fixed(&prob, 1, 1).unwrap().plan.unwrap().stages[0].memory;
    assert_eq!(kept.total(), state + 155);
    // HBM between the two: the DP fits the step only when the gradients are freed.
    prob.hbm_bytes = state + 150;
    assert!(solve(&prob).plan().is_none());
    prob.grads_freed = true;
    assert_eq!(solve(&prob).plan().unwrap().max_memory_bytes, state + 140);
}

/// The chunks (first layer, last layer) of a fixed interleaved plan of `blocks` blocks between a
/// one-layer prologue and a one-layer head, at p stages × v chunks (d = 1).
fn interleaved_chunks(blocks: usize, p: usize, v: u64) -> Result<Vec<(usize, usize)>, String> {
    let mut prob = sharded_problem(Zero::Off, v);
    prob.layers = vec![prob.layers[0].clone(); blocks + 2];
    prob.blocks = Some((1, blocks));
    prob.devices = p as u64;
    prob.global_batch = 4 * p as u64;
    let e = evaluate_fixed(&prob, p, 1).unwrap();
    if !e.feasible {
        return Err(format!("{:?}", e.violations));
    }
    Ok(e.plan
        .unwrap()
        .stages
        .iter()
        .map(|s| (s.first_layer, s.last_layer))
        .collect())
}

#[test]
fn interleaved_chunks_where_the_blocks_do_not_divide() {
    // 4 blocks over 2 × 2 chunks: one each, the prologue with the first, the head with the last.
    assert_eq!(
        interleaved_chunks(4, 2, 2).unwrap(),
        [(0, 1), (2, 2), (3, 3), (4, 5)]
    );
    // 6 blocks over 4 chunks: as Megatron-LM's account-for-embedding/loss flags split them,
    // 6 + 2 = 8 units of 2: the first and last chunks build one block beside the prologue / head.
    assert_eq!(
        interleaved_chunks(6, 2, 2).unwrap(),
        [(0, 1), (2, 3), (4, 5), (6, 7)]
    );
    // 7 blocks: 7 + 1 = 8 with the embedding counted: [1, 2, 2, 2] blocks.
    assert_eq!(
        interleaved_chunks(7, 2, 2).unwrap(),
        [(0, 1), (2, 3), (4, 5), (6, 8)]
    );
    // Llama 3.1 405B's 126 blocks on PP 8 × VP 8 and 94 on PP 8 × VP 4: 2 and 3 units a chunk,
    // the first and last chunk one block fewer.
    for (blocks, v, per) in [(126, 8, 2), (94, 4, 3)] {
        let chunks = interleaved_chunks(blocks, 8, v).unwrap();
        let sizes: Vec<usize> = chunks.iter().map(|&(lo, hi)| hi - lo + 1).collect();
        assert_eq!(sizes.len(), 8 * v as usize);
        assert_eq!((sizes[0], sizes[sizes.len() - 1]), (per, per)); // a block beside the prologue / head
        assert!(sizes[1..sizes.len() - 1].iter().all(|&s| s == per));
        assert_eq!(sizes.iter().sum::<usize>(), blocks + 2);
    }
    // 5 blocks over 4 chunks: no even or counted split; as NeMo lays out DeepSeek-V3,
    // ⌈5/4⌉ = 2 from the first chunk on while every later chunk keeps one: [2, 1, 1, 1].
    assert_eq!(
        interleaved_chunks(5, 2, 2).unwrap(),
        [(0, 2), (3, 3), (4, 4), (5, 6)]
    );
    // 3 blocks over 4 chunks leave a chunk without one.
    assert!(interleaved_chunks(3, 2, 2)
        .unwrap_err()
        .contains("interleaved:2"));
}
