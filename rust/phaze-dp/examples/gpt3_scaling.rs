//! Times one solve of a GPT-3-like problem (prologue, identical blocks, head) as the cluster
//! and the layer count grow. `cargo run --release -p phaze-dp --example gpt3_scaling`.
//! (The Python benchmark `benchmarks/bench_placement_dp.py` measures the same through the
//! binding.)

use phaze_dp::{solve, solve_many, Layer, NetLevel, Problem, RankOrder};
use std::time::Instant;

/// GPT-3 175B-like numbers at s = 2048, h = 12288, b = 1, t = 8, fp16 with mixed-precision
/// Adam, on a 150 TFLOP/s-effective device (the TP all-reduces, ops of the layers priced into
/// `fwd_s`/`bwd_s` by the compiler, are left out).
fn gpt3(blocks: usize, devices: u64) -> Problem {
    let (s, h, v, t) = (2048.0f64, 12288.0f64, 50257.0f64, 8.0f64);
    let flops = 150e12;
    let block_fwd = 24.0 * s * h * h * (1.0 + s / (6.0 * h)) / t / flops;
    let block_params = 12.0 * h * h / t;
    let act = s * h * 2.0; // one fp16 activation of the block's input
    let block = Layer {
        fwd_s: block_fwd,
        bwd_s: 2.0 * block_fwd,
        recompute_s: [0.0, 0.05 * block_fwd, block_fwd],
        saved_bytes: [
            (s * h * 114.0 / t) as u64,
            (s * h * 34.0 / t) as u64,
            act as u64,
        ],
        param_bytes: (2.0 * block_params) as u64,
        grad_bytes: (2.0 * block_params) as u64,
        optimizer_bytes: (12.0 * block_params) as u64,
        workspace_bytes: (4.0 * act) as u64,
        boundary_bytes: act as u64,
        ..Default::default()
    };
    let emb_params = v * h / t;
    let prologue = Layer {
        fwd_s: 1e-4,
        bwd_s: 2e-4,
        recompute_s: [0.0, 0.0, 1e-4],
        saved_bytes: [act as u64, act as u64, act as u64],
        param_bytes: (2.0 * emb_params) as u64,
        grad_bytes: (2.0 * emb_params) as u64,
        optimizer_bytes: (12.0 * emb_params) as u64,
        workspace_bytes: act as u64,
        boundary_bytes: act as u64,
        ..Default::default()
    };
    let head_fwd = 2.0 * s * h * v / t / flops;
    let head = Layer {
        fwd_s: head_fwd,
        bwd_s: 2.0 * head_fwd,
        recompute_s: [0.0, 0.0, head_fwd],
        saved_bytes: [
            (s * v / t * 4.0) as u64,
            (s * v / t * 4.0) as u64,
            act as u64,
        ],
        param_bytes: (2.0 * emb_params) as u64,
        grad_bytes: (2.0 * emb_params) as u64,
        optimizer_bytes: (12.0 * emb_params) as u64,
        workspace_bytes: (s * v / t * 4.0) as u64,
        boundary_bytes: 0,
        ..Default::default()
    };
    let mut layers = vec![prologue];
    layers.extend(std::iter::repeat_n(block, blocks));
    layers.push(head);
    Problem {
        layers,
        devices,
        hbm_bytes: 80_000_000_000,
        levels: vec![
            NetLevel {
                group_size: 8,
                bandwidth_bps: 300e9,
                latency_s: 5e-6,
                ..NetLevel::default()
            },
            NetLevel {
                group_size: devices,
                bandwidth_bps: 25e9,
                latency_s: 10e-6,
                ..NetLevel::default()
            },
        ],
        global_batch: 4096,
        micro_batch: 1,
        tp: 8,
        cp: 1,
        dp_overlap: true,
        max_stages: None,
        recompute: None,
        zero: None,
        virtual_stages: None,
        blocks: Some((1, blocks)),
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

fn main() {
    println!(
        "{:>7} {:>7} {:>10} {:>4} {:>4} {:>10} {:>12}",
        "layers", "N", "solve_ms", "d", "p", "time_s", "samples/s"
    );
    for &blocks in &[96usize, 198] {
        for &n in &[1024u64, 2048, 4096, 8192, 16384] {
            let prob = gpt3(blocks, n);
            let reps = 5;
            let start = Instant::now();
            let mut sol = None;
            for _ in 0..reps {
                sol = Some(solve(&prob));
            }
            let ms = start.elapsed().as_secs_f64() * 1e3 / reps as f64;
            let plan = sol.unwrap().plan().cloned().expect("GPT-3 fits");
            println!(
                "{:>7} {:>7} {:>10.2} {:>4} {:>4} {:>10.3} {:>12.1}",
                blocks + 2,
                n,
                ms,
                plan.dp,
                plan.pp,
                plan.time_per_batch_s,
                plan.throughput_samples_per_s
            );
        }
    }
    let batch: Vec<Problem> = (0..16).map(|_| gpt3(96, 1024)).collect();
    let start = Instant::now();
    let _ = solve_many(&batch);
    println!(
        "solve_many, 16 x (98 layers, N = 1024): {:.1} ms",
        start.elapsed().as_secs_f64() * 1e3
    );
}
