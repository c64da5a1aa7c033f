//! Cross-check of the ZeRO stages, expert parallelism, interleaved 1F1B and context
//! parallelism against exhaustive enumeration: every d, p, ZeRO stage, EP degree e, chunk count
//! v, split (v = 1) and policy per rank, priced with this file's own copy of the formulas (crate
//! docs, `Problem::cp`), including a step-by-step simulation of Megatron's interleaved schedule
//! for the stash.
//!
//! Numbers are dyadic as in `brute_force.rs`, except the interleaved bubble (p − 1)/v for odd
//! v: so objectives are compared within the crate's tie tolerance, and the option chosen among
//! ties by the documented order (fewer devices, fewer stages, fewer chunks, lower ZeRO stage,
//! smaller EP degree, then the split, then the policies).

mod common;
use common::{level_for, p2p_bandwidth, random_layers, random_levels, ring_bandwidth, Rng};

use phaze_dp::{
    evaluate_fixed, solve, ExpertGemms, FsdpCopies, FsdpImplementation, Plan, Problem, RankOrder,
    Recompute, Solution, ViolationKind, Zero,
};

const TIE_REL: f64 = 1e-12;

fn random_problem(rng: &mut Rng) -> Problem {
    // Half of them: a prologue, 4 blocks and a head, which p = 2, v = 2 can interleave.
    let n = if rng.below(2) == 0 {
        6
    } else {
        1 + rng.below(7) as usize
    };
    let mut layers = random_layers(rng, n, 128);
    let levels = random_levels(rng);
    // Half of the problems are MoE models (2 or 4 experts in some layers), drawn from a
    // generator of their own so that the rest of each instance is as before.
    let mut moe = Rng(rng.0 ^ 0x6d6f_655f_6d6f_6465);
    let experts = [0, 0, 2, 4][moe.below(4) as usize];
    if experts > 0 {
        for l in &mut layers {
            if moe.below(2) == 0 {
                l.experts = experts;
                l.expert_param_bytes = moe.below(l.param_bytes + 1);
                l.expert_grad_bytes = moe.below(l.grad_bytes + 1);
                l.expert_optimizer_bytes = moe.below(l.optimizer_bytes + 1);
                l.dispatch_bytes = moe.below(64);
            }
        }
    }
    // The optimizer steps (a generator of their own again): none in a third of the problems,
    // up to 8 s or 64 s a layer in the others; an MoE layer's experts' part none, half or all.
    let mut opt = Rng(rng.0 ^ 0x6f70_745f_7374_6570);
    let scale = [0.0, 1.0, 8.0][opt.below(3) as usize];
    for l in &mut layers {
        l.opt_s = opt.time() * scale;
        if l.experts > 0 {
            l.expert_opt_s = l.opt_s * [0.0, 0.5, 1.0][opt.below(3) as usize];
        }
    }
    // The FP8 weight casts (a generator of their own again): none in half of the problems, up
    // to 1 s a layer in the others; an MoE layer's experts' part none, half or all.
    let mut fp8 = Rng(rng.0 ^ 0x6670_385f_6361_7374);
    let cast_scale = [0.0, 1.0][fp8.below(2) as usize];
    for l in &mut layers {
        l.cast_s = fp8.time() * cast_scale / 8.0;
        if l.experts > 0 {
            l.expert_cast_s = l.cast_s * [0.0, 0.5, 1.0][fp8.below(3) as usize];
        }
    }
    // The expert GEMMs at each EP degree (a generator of their own again): in half of the MoE
    // problems, an MoE layer's at every divisor e of its experts, each up to 8 s in the
    // forward, backward and recompute (not tied to the layer's times: the layer's at e are
    // clamped at 0).
    let mut gemm = Rng(rng.0 ^ 0x6570_5f67_656d_6d73);
    if gemm.below(2) == 0 {
        for l in &mut layers {
            if l.experts > 0 {
                l.expert_gemm_s = (1..=l.experts)
                    .filter(|e| l.experts.is_multiple_of(*e))
                    .map(|e| ExpertGemms {
                        e,
                        fwd_s: gemm.time(),
                        bwd_s: gemm.time(),
                        recompute_s: [0.0, gemm.time(), gemm.time()],
                    })
                    .collect();
            }
        }
    }
    // The rank order: auto for half, fixed for the rest (a generator of its own again).
    let mut ord = Rng(rng.0 ^ 0x7261_6e6b_5f6f_7264);
    let rank_order =
        [None, None, Some(RankOrder::TpDpPp), Some(RankOrder::TpPpDp)][ord.below(4) as usize];
    let experts = layers.iter().map(|l| l.experts).max().unwrap_or(0);
    let expert_parallel = match moe.below(4) {
        0 | 1 => None,
        2 => Some(1),
        _ if experts > 0 => Some(1 << (1 + moe.below(if experts == 4 { 2 } else { 1 }))),
        _ => Some(1),
    };
    // A prologue and a head around the blocks, or only blocks.
    let blocks = if n == 6 && rng.below(4) != 0 {
        Some((1, 4))
    } else if n >= 3 && rng.below(2) == 0 {
        Some((1, n - 2))
    } else {
        None
    };
    // Context parallelism in a third of the problems (a generator of its own again). Under
    // cp > 1 only tp-dp-pp is allowed (tp-pp-dp is an input error, checked in
    // hand_checked.rs): a fixed tp-pp-dp becomes tp-dp-pp. EP stays as drawn.
    let mut ctx = Rng(rng.0 ^ 0x6374_785f_7061_7261);
    let cp = [1, 1, 1, 1, 2, 4][ctx.below(6) as usize];
    let rank_order = if cp > 1 {
        rank_order.map(|_| RankOrder::TpDpPp)
    } else {
        rank_order
    };
    // FSDP's copies priced in two thirds of the problems, FSDP1's or FSDP2's, with bf16 or
    // fp32 parameters (a generator of its own again).
    let mut fc = Rng(rng.0 ^ 0x6673_6470_5f63_6f70);
    let fsdp_copies = match fc.below(3) {
        0 => None,
        i => Some(FsdpCopies {
            bandwidth_bps: [16.0, 64.0][fc.below(2) as usize],
            implementation: [FsdpImplementation::Fsdp1, FsdpImplementation::Fsdp2][i as usize - 1],
            master_scale: [1.0, 2.0][fc.below(2) as usize],
        }),
    };
    let mut prob = Problem {
        layers,
        devices: 1 + rng.below(32),
        hbm_bytes: 50 + rng.below(700),
        levels,
        global_batch: rng.pow2(5),
        micro_batch: rng.pow2(1),
        tp: rng.pow2(1),
        cp,
        dp_overlap: rng.below(2) == 0,
        max_stages: None,
        recompute: if rng.below(2) == 0 {
            None
        } else {
            Recompute::from_index(rng.below(3) as usize)
        },
        zero: if rng.below(2) == 0 {
            None
        } else {
            Zero::from_stage(rng.below(4) as u8)
        },
        virtual_stages: match rng.below(4) {
            0 | 1 => None,
            2 => Some(1),
            _ => Some(2 + rng.below(2)),
        },
        blocks,
        expert_parallel,
        rank_order,
        // Drawn last: the instances drawn before stay those of before.
        pipeline_split: rng.below(2) == 0,
        grads_freed: rng.below(2) == 0,
        grad_reduce_scale: [1.0, 2.0, 0.5][rng.below(3) as usize],
        dp_shard: None,
        fsdp_copies,
        expert_tensor_parallel: None,
    };
    // The experts folded at ETP 1 (Megatron-core's MoE parallel folding) in half of the MoE
    // problems at t = 2 (a generator of its own again): numbered tp-ep-dp-pp, so a fixed
    // tp-pp-dp becomes tp-dp-pp; the fixed EP degree may then exceed d.
    let mut fold = Rng(rng.0 ^ 0x6574_705f_666f_6c64);
    if experts > 0 && prob.tp == 2 && fold.below(2) == 0 {
        prob.expert_tensor_parallel = Some(1);
        prob.rank_order = prob.rank_order.map(|_| RankOrder::TpDpPp);
    }
    prob
}

/// The experts' own mesh: (whether folded, t/k: a device's expert bytes over the recorded).
fn folding(prob: &Problem) -> (bool, u64) {
    let k = prob.expert_tensor_parallel.unwrap_or(prob.tp);
    (k != prob.tp, prob.tp / k)
}

/// The block count of each of the p·v chunks as Megatron-LM builds them: evenly when p·v
/// divides the blocks; else with the embedding, the loss, or both counted as a block of the
/// first / last chunk (`--account-for-embedding-in-pipeline-split`,
/// `--account-for-loss-in-pipeline-split`), tried in that order; else as NeMo lays out
/// DeepSeek-V3 (`--pipeline-model-parallel-layout`): the first k chunks ⌈count/chunks⌉ blocks,
/// k the most that leave each later chunk one, the next chunk the rest less one for each after
/// it, those one each. `None` when some chunk would hold no block.
fn chunk_blocks(count: usize, chunks: usize) -> Option<Vec<usize>> {
    if count < chunks {
        return None;
    }
    for (embedding, loss) in [(false, false), (true, true), (true, false), (false, true)] {
        let units = count + usize::from(embedding) + usize::from(loss);
        if !units.is_multiple_of(chunks) {
            continue;
        }
        let mut sizes = vec![units / chunks; chunks];
        sizes[0] -= usize::from(embedding);
        sizes[chunks - 1] -= usize::from(loss);
        if sizes.iter().all(|&b| b >= 1) {
            return Some(sizes);
        }
    }
    let per = count.div_ceil(chunks);
    let full = (0..chunks)
        .rev()
        .find(|&k| k * per + (chunks - k) <= count)
        .unwrap_or(0);
    let mut sizes = vec![per; full];
    if full < chunks {
        sizes.push(count - full * per - (chunks - full - 1));
        sizes.resize(chunks, 1);
    }
    Some(sizes)
}

/// The layers (first, last) of each of the p·v chunks: the prologue with the first chunk's
/// blocks, the head with the last one's.
fn chunks(prob: &Problem, p: usize, v: usize) -> Vec<(usize, usize)> {
    let n = prob.layers.len();
    let (first, count) = prob.blocks.unwrap_or((0, n));
    let sizes = chunk_blocks(count, p * v).expect("an allowed interleaving");
    let mut out = Vec::with_capacity(sizes.len());
    let mut next = first;
    for (c, &size) in sizes.iter().enumerate() {
        let lo = if c == 0 { 0 } else { next };
        next += size;
        let hi = if c == sizes.len() - 1 {
            n - 1
        } else {
            next - 1
        };
        out.push((lo, hi));
    }
    out
}

/// Peak stash of rank k by simulating Megatron-LM's interleaved schedule unit by unit:
/// `warmup` forwards, then forward/backward pairs, then the remaining backwards.
fn simulated_stash(p: usize, v: usize, k: usize, m: u64, saved: &[u64]) -> (u64, u64) {
    let units = v as u64 * m;
    let warmup = ((2 * (p - k - 1) + (v - 1) * p) as u64).min(units);
    let chunk = |u: u64, forward: bool| {
        let c = ((u % (p * v) as u64) / p as u64) as usize;
        if forward {
            c
        } else {
            v - 1 - c
        }
    };
    let (mut now, mut peak, mut count, mut peak_count) = (0i128, 0i128, 0u64, 0u64);
    let forward = |u: u64, now: &mut i128, count: &mut u64| {
        *now += saved[chunk(u, true)] as i128;
        *count += 1;
    };
    for u in 0..warmup {
        forward(u, &mut now, &mut count);
        peak = peak.max(now);
        peak_count = peak_count.max(count);
    }
    for i in 0..units - warmup {
        forward(warmup + i, &mut now, &mut count);
        peak = peak.max(now);
        peak_count = peak_count.max(count);
        now -= saved[chunk(i, false)] as i128;
        count -= 1;
    }
    (peak as u64, peak_count)
}

/// One priced option: objective, max memory, per-rank times and optimizer steps, and its
/// tie-break key.
struct Priced {
    obj: f64,
    mem: u64,
    times: Vec<f64>,
    opts: Vec<f64>,
    key: Key,
}

/// The tie-break order: devices, stages, chunks, ZeRO stage, EP degree, rank order (tp-dp-pp
/// first), split, policies.
type Key = (u64, usize, usize, u8, u64, u8, Vec<usize>, Vec<usize>);

/// Prices one explicit plan: d, ZeRO stage z, EP degree e, rank order o (0: tp-dp-pp, 1:
/// tp-pp-dp), v chunks per rank over `ends` (the last layer of each stage, v = 1, or each
/// chunk, v >= 2), and `pol` per rank.
#[allow(clippy::too_many_arguments)]
fn price(
    prob: &Problem,
    d: u64,
    z: u8,
    e: u64,
    o: u8,
    v: usize,
    ends: &[usize],
    pol: &[usize],
) -> Priced {
    // A member of an EP group of e runs each layer with its expert GEMMs' time at e in place
    // of theirs at 1: time - expert(1) + expert(e), never below 0.
    let at_e = Problem {
        layers: prob
            .layers
            .iter()
            .map(|l| {
                let mut l = l.clone();
                let find = |e: u64| l.expert_gemm_s.iter().find(|x| x.e == e).cloned();
                if let (Some(one), Some(now)) = (find(1), find(e)) {
                    l.fwd_s = (l.fwd_s + (now.fwd_s - one.fwd_s)).max(0.0);
                    l.bwd_s = (l.bwd_s + (now.bwd_s - one.bwd_s)).max(0.0);
                    for r in 0..3 {
                        l.recompute_s[r] =
                            (l.recompute_s[r] + (now.recompute_s[r] - one.recompute_s[r])).max(0.0);
                    }
                }
                l
            })
            .collect(),
        ..prob.clone()
    };
    let prob = &at_e;
    let p = pol.len();
    let n = prob.layers.len();
    let t = prob.tp;
    // Every device of a CP group works on the same samples: c does not divide the batch.
    let m = prob.global_batch / (prob.micro_batch * d);
    // The devices sharing the gradients and the ZeRO shards: the DP×CP group of d·c.
    let dc = d * prob.cp;
    let lvl = |g: u64| level_for(prob, g);
    // tp-dp-pp (tp-cp-dp-pp under CP): DP×CP members t apart, pipeline neighbours d·c·t apart
    // (the level of the d·c·p·t devices); tp-pp-dp (c = 1 only): pipeline neighbours t apart
    // in a replica of p·t, DP members p·t apart.
    let pt = p as u64 * t;
    let (stride, pp_stride) = if o == 0 { (t, dc * t) } else { (pt, t) };
    let pp_span = p as u64 * pp_stride;
    let dp_l = lvl(dc * stride);
    // Ring bandwidth of the DP×CP group, its members `stride` apart.
    let bw = ring_bandwidth(prob, dc, dp_l, stride);
    let lat = prob.levels[dp_l].latency_s;
    let g = dc as f64;
    let dense_all_reduce = |bytes: u64| {
        if dc <= 1 {
            0.0
        } else {
            2.0 * (g - 1.0) / g * bytes as f64 / bw + 2.0 * (g - 1.0) * lat
        }
    };
    let dense_half = |bytes: u64| {
        if dc <= 1 {
            0.0
        } else {
            (g - 1.0) / g * bytes as f64 / bw + (g - 1.0) * lat
        }
    };
    // Under EP the experts' 1/e runs over the d·c/e devices holding them, e·stride apart;
    // folded at ETP k, a device's t/(k·e) of them over the t·d·c/(k·e) devices k·e apart.
    let (folded, scale) = folding(prob);
    let k = t / scale;
    let (edp, edp_stride) = if folded {
        (t * dc / (k * e), k * e)
    } else {
        (dc / e, e * stride)
    };
    let share_of = |x: u64| (x * scale).div_ceil(e);
    let ge = edp as f64;
    let bw_e = ring_bandwidth(prob, edp, dp_l, edp_stride);
    let expert_all_reduce = |bytes: u64| {
        if edp <= 1 {
            0.0
        } else {
            2.0 * (ge - 1.0) / ge * share_of(bytes) as f64 / bw_e + 2.0 * (ge - 1.0) * lat
        }
    };
    let expert_half = |bytes: u64| {
        if edp <= 1 {
            0.0
        } else {
            (ge - 1.0) / ge * share_of(bytes) as f64 / bw_e + (ge - 1.0) * lat
        }
    };
    let all_reduce = |bytes: u64, experts: u64| {
        if e == 1 && !folded {
            dense_all_reduce(bytes)
        } else {
            dense_all_reduce(bytes - experts) + expert_all_reduce(experts)
        }
    };
    let half = |bytes: u64, experts: u64| {
        if e == 1 && !folded {
            dense_half(bytes)
        } else {
            dense_half(bytes - experts) + expert_half(experts)
        }
    };
    // Gradient bytes as the DP collectives move them (grad_reduce_scale: the wire dtype's).
    let wire = |bytes: u64, experts: u64| {
        let s = prob.grad_reduce_scale;
        let b = (bytes as f64 * s).round() as u64;
        (b, ((experts as f64 * s).round() as u64).min(b))
    };
    let grads_half = |bytes: u64, experts: u64| {
        let (b, x) = wire(bytes, experts);
        half(b, x)
    };
    // One MoE layer's all-to-all over the EP group: e consecutive replicas at one CP rank,
    // c·`stride` apart (tp-cp-ep-dp-pp); folded, e devices k apart.
    let ep_stride = if folded { k } else { prob.cp * stride };
    let ep_l = lvl(e * ep_stride);
    let bw_a2a = ring_bandwidth(prob, e, ep_l, ep_stride);
    let a2a = |bytes: u64| {
        let ef = e as f64;
        (ef - 1.0) / ef * bytes as f64 / bw_a2a + (ef - 1.0) * prob.levels[ep_l].latency_s
    };
    // Overlapped, a DP collective still takes its level's share of the compute beside it.
    let share = prob.levels[dp_l].collective_compute_share;
    let hide = |c: f64, behind: f64| {
        if prob.dp_overlap {
            (c - behind).max(share * c.min(behind))
        } else {
            c
        }
    };
    // ZeRO-2/3 overlapped layer by layer (FSDP): each layer's collectives beside the compute
    // of the layer before it, the first all-gather of each pass and the last reduce-scatter
    // alone; a piece of layers lo..=hi, walked in its own order.
    // (Folded, the experts' group may shard at d·c = 1.)
    let sharded = dc > 1 || ((e > 1 || folded) && edp > 1);
    let windows = prob.dp_overlap && z >= 2 && sharded;
    let piece_windows = |lo: usize, hi: usize| {
        let ls = &prob.layers;
        let ag = |l: usize| half(ls[l].param_bytes, ls[l].expert_param_bytes);
        let rs = |l: usize| grads_half(ls[l].grad_bytes, ls[l].expert_grad_bytes);
        let mut bwd = 0.0;
        for l in (lo..=hi).rev() {
            let next_rs = if l < hi { rs(l + 1) } else { 0.0 };
            let prev_ag = if l > lo && z == 3 { ag(l - 1) } else { 0.0 };
            if l == hi && z == 3 {
                bwd += ag(hi);
            }
            bwd += hide(next_rs + prev_ag, ls[l].bwd_s);
        }
        bwd += rs(lo);
        if z == 2 {
            return bwd;
        }
        let mut fwd = ag(lo);
        for (l, layer) in ls.iter().enumerate().take(hi).skip(lo) {
            fwd += hide(ag(l + 1), layer.fwd_s);
        }
        fwd + bwd
    };
    let pp_l = lvl(pp_span);
    // A pipeline transfer: whole, or split over the TP group (1/t each, then the receiving
    // group's ring all-gather on the level of t); the node's uplink shared by the senders.
    let p2p_bw = p2p_bandwidth(prob, pp_l, pp_stride);
    let tp_l = lvl(t);
    let bw_t = ring_bandwidth(prob, t, tp_l, 1);
    let tf = t as f64;
    let p2p = |bytes: u64| {
        if prob.pipeline_split && t > 1 {
            (prob.levels[pp_l].latency_s + bytes as f64 / tf / p2p_bw)
                + ((tf - 1.0) / tf * bytes as f64 / bw_t + (tf - 1.0) * prob.levels[tp_l].latency_s)
        } else {
            prob.levels[pp_l].latency_s + bytes as f64 / p2p_bw
        }
    };
    // Layers of each rank, and the first/last layer of each of its stages or chunks.
    let mut pieces: Vec<Vec<(usize, usize)>> = vec![Vec::new(); p];
    let mut first = 0;
    for (c, &e) in ends.iter().enumerate() {
        pieces[c % p].push((first, e));
        first = e + 1;
    }
    assert_eq!(first, n);
    let (mut max_t, mut max_e, mut max_o, mut max_mem) = (0.0f64, 0.0f64, 0.0f64, 0u64);
    let (mut times, mut opts) = (Vec::new(), Vec::new());
    for k in 0..p {
        let r = pol[k];
        let (mut compute, mut rec, mut fwd, mut bwd, mut link) = (0.0, 0.0, 0.0, 0.0, 0.0);
        let mut fwd_send = 0.0;
        let (mut opt, mut expert_opt) = (0.0f64, 0.0f64);
        let (mut cast, mut expert_cast) = (0.0f64, 0.0f64);
        let (mut pb, mut gb, mut ob, mut maxp, mut ws) = (0u64, 0u64, 0u64, 0u64, 0u64);
        let (mut epb, mut egb, mut eob, mut alltoall) = (0u64, 0u64, 0u64, 0.0f64);
        let mut saved_per_chunk = Vec::new();
        let mut windows_s = 0.0;
        for &(lo, hi) in &pieces[k] {
            if windows {
                windows_s += piece_windows(lo, hi);
            }
            let mut saved = 0;
            for l in &prob.layers[lo..=hi] {
                compute += l.fwd_s + l.bwd_s;
                rec += l.recompute_s[r];
                opt += l.opt_s;
                expert_opt += l.expert_opt_s;
                cast += l.cast_s;
                expert_cast += l.expert_cast_s;
                fwd += l.fwd_s;
                bwd += l.bwd_s;
                pb += l.param_bytes;
                gb += l.grad_bytes;
                ob += l.optimizer_bytes;
                // ZeRO-3 gathers a layer's dense part whole and only the device's own experts.
                maxp =
                    maxp.max(l.param_bytes - l.expert_param_bytes + share_of(l.expert_param_bytes));
                // Under full recompute the re-run forward's activations are live in the backward.
                ws = ws.max(if r == 2 {
                    l.workspace_bytes.max(l.recompute_workspace_bytes)
                } else {
                    l.workspace_bytes
                });
                saved += l.saved_bytes[r];
                epb += l.expert_param_bytes;
                egb += l.expert_grad_bytes;
                eob += l.expert_optimizer_bytes;
                if e > 1 && l.dispatch_bytes > 0 {
                    alltoall += a2a(l.dispatch_bytes);
                }
            }
            saved_per_chunk.push(saved);
            if lo > 0 {
                link += 2.0 * p2p(prob.layers[lo - 1].boundary_bytes);
            }
            if hi < n - 1 {
                link += 2.0 * p2p(prob.layers[hi].boundary_bytes);
                fwd_send += p2p(prob.layers[hi].boundary_bytes);
            }
        }
        // FSDP's copies under ZeRO-3, per micro-batch (docs/design.md §6.5): a device's
        // gathered parameters and gradients (1/e of the experts'), and their 1/(d·c) shards.
        let copies = match &prob.fsdp_copies {
            Some(c) if z == 3 && sharded => {
                let on_device = |x: u64, ex: u64| (x - ex + share_of(ex)) as f64;
                let (params, grads) = (on_device(pb, epb), on_device(gb, egb));
                let (param_shard, grad_shard) = (pb as f64 / g, gb as f64 / g);
                let (s, k) = (prob.grad_reduce_scale, c.master_scale);
                let cast =
                    |x: f64, from: f64, to: f64| if from == to { 0.0 } else { (from + to) * x };
                let gather_in = (k + 1.0) * param_shard;
                let bytes = match c.implementation {
                    // Cast, copy in, copy out twice; chunk-cat the gradients in; cast the shard.
                    FsdpImplementation::Fsdp2 => {
                        2.0 * (gather_in + 2.0 * param_shard + 2.0 * params)
                            + (1.0 + s) * grads
                            + cast(grad_shard, s, k)
                    }
                    // Cast twice; flatten the gradients, cast, pre-divide; post-divide and cast
                    // the shard.
                    FsdpImplementation::Fsdp1 => {
                        2.0 * gather_in
                            + 2.0 * grads
                            + cast(grads, 1.0, s)
                            + 2.0 * s * grads
                            + 2.0 * s * grad_shard
                            + cast(grad_shard, s, k)
                    }
                };
                bytes / c.bandwidth_bps
            }
            _ => 0.0,
        };
        // Dispatch and combine in forward and backward, and again in a full recompute.
        let mb = copies
            + match z {
                0 | 1 => 0.0,
                _ if windows => windows_s,
                2 => hide(grads_half(gb, egb), bwd),
                _ => hide(half(pb, epb), fwd) + hide(half(pb, epb) + grads_half(gb, egb), bwd),
            }
            + 4.0 * alltoall;
        // A device casts its weights to FP8 (its own experts' under EP): in every forward under
        // ZeRO-3 with something to shard (a full recompute's again), once a step beside the
        // optimizer otherwise.
        let casts = (cast - expert_cast) + expert_cast * scale as f64 / e as f64;
        let (compute, step_casts) = if z == 3 && sharded {
            (compute + casts, 0.0)
        } else {
            (compute, casts)
        };
        let rec = rec
            + if r == 2 {
                2.0 * alltoall + if z == 3 && sharded { casts } else { 0.0 }
            } else {
                0.0
            };
        let exposed = match z {
            0 => hide(all_reduce(wire(gb, egb).0, wire(gb, egb).1), bwd),
            1 => hide(grads_half(gb, egb), bwd) + hide(half(pb, epb), fwd),
            2 => hide(half(pb, epb), fwd),
            _ => 0.0,
        };
        // Interleaved: Megatron-LM overlaps the chunks' receives and backward sends with their
        // compute (`overlap_p2p_comm`), which they slow by the pipeline level's share of the
        // SMs; it waits on each forward send at once (`deallocate_pipeline_outputs`).
        let link = if v > 1 && link > 0.0 {
            let share = prob.levels[pp_l].collective_compute_share;
            let over = link - fwd_send;
            fwd_send + (over - (compute + rec)).max(share * over.min(compute + rec))
        } else {
            link
        };
        let time = compute + rec + link + mb;
        // The optimizer step after the flush: each device of the DP×CP group updates 1/(d·c)
        // of the state from ZeRO-1 on (the experts' 1/e over their d/e replicas: 1/d too);
        // without ZeRO, a device updates all of the dense state and 1/e of the experts'.
        let optimizer = if z >= 1 {
            opt / dc as f64
        } else {
            (opt - expert_opt) + expert_opt * scale as f64 / e as f64
        } + step_casts;
        let sh = |x: u64, experts: u64, on: bool| {
            let over = |y: u64, g: u64| if on { y.div_ceil(g) } else { y };
            if e == 1 && !folded {
                over(x, dc)
            } else {
                over(x - experts, dc) + over(share_of(experts), edp)
            }
        };
        let state = sh(pb, epb, z >= 3)
            + sh(gb, egb, z >= 2)
            + sh(ob, eob, z >= 1)
            + if z >= 3 && sharded { 2 * maxp } else { 0 };
        let stash = if v == 1 {
            ((p - k) as u64).min(m) * saved_per_chunk[0]
        } else {
            simulated_stash(p, v, k, m, &saved_per_chunk).0
        };
        let mut mem = state + stash + ws;
        if prob.grads_freed && m == 1 && z < 2 && e == 1 && !folded && v == 1 {
            // Gradients made by the backward, freed after the step: while layer l's backward
            // runs, the activations of the stage's layers up to l and the gradients of l and
            // the layers after it.
            let (lo, hi) = pieces[k][0];
            let ls = &prob.layers[lo..=hi];
            let peak = (0..ls.len())
                .map(|c| {
                    let held: u64 = ls[..=c].iter().map(|l| l.saved_bytes[r]).sum();
                    let made: u64 = ls[c..].iter().map(|l| l.grad_bytes).sum();
                    held + made
                })
                .max()
                .unwrap();
            mem = mem - gb - stash + peak;
        }
        max_t = max_t.max(time);
        max_e = max_e.max(exposed);
        max_o = max_o.max(optimizer);
        max_mem = max_mem.max(mem);
        times.push(time);
        opts.push(optimizer);
    }
    let factor = m as f64 + (p - 1) as f64 / v as f64;
    let devices = dc * p as u64 * t;
    Priced {
        obj: factor * max_t + max_e + max_o,
        mem: max_mem,
        times,
        opts,
        key: (devices, p, v, z, e, o, ends.to_vec(), pol.to_vec()),
    }
}

/// The ZeRO stages, chunk counts and policies a problem allows.
fn zero_stages(prob: &Problem) -> Vec<u8> {
    match prob.zero {
        None => vec![0, 1, 2, 3],
        Some(z) => vec![z.stage()],
    }
}

/// The EP degrees allowed at d: the fixed one if it divides d, else every e dividing d and the
/// experts (d, not d·c, under context parallelism); folded at ETP k, t·c·d/k in place of d.
fn expert_degrees(prob: &Problem, d: u64) -> Vec<u64> {
    let (folded, scale) = folding(prob);
    let d = if folded { prob.cp * d * scale } else { d };
    let experts = prob
        .layers
        .iter()
        .map(|l| l.experts)
        .max()
        .unwrap_or(0)
        .max(1);
    match prob.expert_parallel {
        Some(e) => [e].into_iter().filter(|&e| d.is_multiple_of(e)).collect(),
        None => (1..=d.min(experts))
            .filter(|&e| d.is_multiple_of(e) && experts.is_multiple_of(e))
            .collect(),
    }
}

/// The rank orders allowed (0: tp-dp-pp, 1: tp-pp-dp); tp-dp-pp alone under context
/// parallelism (numbered tp-cp-dp-pp).
fn rank_orders(prob: &Problem) -> Vec<u8> {
    if prob.cp > 1 || folding(prob).0 {
        return vec![0];
    }
    match prob.rank_order {
        None => vec![0, 1],
        Some(RankOrder::TpDpPp) => vec![0],
        Some(RankOrder::TpPpDp) => vec![1],
    }
}

fn policies(prob: &Problem) -> Vec<usize> {
    match prob.recompute {
        None => vec![0, 1, 2],
        Some(r) => vec![r.index()],
    }
}

/// Every plan of (d, p) the problem allows, priced.
fn all_plans(prob: &Problem, d: u64, p: usize) -> Vec<Priced> {
    let n = prob.layers.len();
    let m = prob.global_batch / (prob.micro_batch * d);
    let blocks = prob.blocks.map_or(n, |b| b.1);
    let mut vs = Vec::new();
    if prob.virtual_stages.is_none_or(|v| v == 1) {
        vs.push(1);
    }
    for v in 2..=n {
        let ok = p >= 2 && chunk_blocks(blocks, p * v).is_some() && m.is_multiple_of(p as u64);
        if ok && prob.virtual_stages.is_none_or(|x| x == v as u64) {
            vs.push(v);
        }
    }
    let pols = policies(prob);
    let mut out = Vec::new();
    for &v in &vs {
        let splits: Vec<Vec<usize>> = if v == 1 {
            let mut all = Vec::new();
            for mask in 0u32..(1 << (n - 1)) {
                if mask.count_ones() as usize == p - 1 {
                    let mut ends: Vec<usize> = (0..n - 1).filter(|g| mask >> g & 1 == 1).collect();
                    ends.push(n - 1);
                    all.push(ends);
                }
            }
            all
        } else {
            vec![chunks(prob, p, v).iter().map(|c| c.1).collect()]
        };
        for ends in &splits {
            for code in 0..pols.len().pow(p as u32) {
                let pol: Vec<usize> = (0..p)
                    .map(|k| pols[code / pols.len().pow((p - 1 - k) as u32) % pols.len()])
                    .collect();
                for &z in &zero_stages(prob) {
                    for &e in &expert_degrees(prob, d) {
                        for &o in &rank_orders(prob) {
                            out.push(price(prob, d, z, e, o, v, ends, &pol));
                        }
                    }
                }
            }
        }
    }
    out
}

/// The documented choice among fitting plans: least objective, then, within the tie
/// tolerance, the smallest key.
fn choose(plans: &[Priced], hbm: u64) -> Option<&Priced> {
    let best = plans
        .iter()
        .filter(|x| x.mem <= hbm)
        .map(|x| x.obj)
        .min_by(f64::total_cmp)?;
    let bound = best + best.abs() * TIE_REL;
    plans
        .iter()
        .filter(|x| x.mem <= hbm && x.obj <= bound)
        .min_by(|a, b| a.key.cmp(&b.key))
}

fn key_of(plan: &Plan) -> Key {
    let p = plan.pp;
    (
        plan.devices_used,
        p,
        plan.virtual_stages as usize,
        plan.zero.stage(),
        plan.expert_parallel,
        match plan.rank_order {
            RankOrder::TpDpPp => 0,
            RankOrder::TpPpDp => 1,
        },
        plan.stages.iter().map(|s| s.last_layer).collect(),
        plan.stages[..p]
            .iter()
            .map(|s| s.recompute.index())
            .collect(),
    )
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1e-9)
}

fn check_plan(plan: &Plan, prob: &Problem, want: &Priced, case: usize) {
    assert_eq!(key_of(plan), want.key, "case {case}");
    assert_eq!(plan.cp, prob.cp, "case {case}");
    assert_eq!(
        plan.devices_used,
        plan.dp * plan.pp as u64 * prob.tp * prob.cp,
        "case {case}"
    );
    assert_eq!(
        plan.num_micro_batches,
        prob.global_batch / (prob.micro_batch * plan.dp),
        "case {case}"
    );
    assert!(close(plan.time_per_batch_s, want.obj), "case {case}");
    assert_eq!(plan.max_memory_bytes, want.mem, "case {case}");
    let times: Vec<f64> = plan.stages[..plan.pp].iter().map(|s| s.time_s).collect();
    assert!(
        times.iter().zip(&want.times).all(|(a, b)| close(*a, *b)),
        "case {case}"
    );
    let opts: Vec<f64> = plan.stages[..plan.pp]
        .iter()
        .map(|s| s.optimizer_s)
        .collect();
    assert!(
        opts.iter().zip(&want.opts).all(|(a, b)| close(*a, *b)),
        "case {case}: optimizer steps {opts:?}, want {:?}",
        want.opts
    );
    let max_o = want.opts.iter().copied().fold(0.0, f64::max);
    assert!(close(plan.max_optimizer_s, max_o), "case {case}");
    // A stage's time by part adds up to its time.
    for s in &plan.stages {
        assert!(close(s.time_parts.total(), s.time_s), "case {case}");
    }
    // Each chunk reports its rank's numbers.
    for (c, s) in plan.stages.iter().enumerate() {
        assert_eq!(s.rank, c % plan.pp, "case {case}");
    }
}

#[test]
fn settings_equal_brute_force() {
    let mut rng = Rng(0x51_7cc1_b727_220a);
    let (mut feasible, mut interleaved, mut sharded, mut infeasible) = (0, 0, 0, 0);
    let mut expert_parallel = 0;
    // Folded experts (ETP 1): feasible plans, and those whose EP group is wider than d.
    let (mut folded, mut wider) = (0, 0);
    // Context parallelism: feasible plans with c > 1, those of them sharded at d = 1 (the
    // DP×CP group alone shares the state), and the problems refused for t·c > N.
    let (mut context, mut context_d1_sharded, mut context_refused) = (0, 0, 0);
    for case in 0..2000 {
        let prob = random_problem(&mut rng);
        let got = solve(&prob);
        let b = prob.micro_batch;
        let n = prob.layers.len();
        let c = prob.cp;
        if !prob.global_batch.is_multiple_of(b) {
            assert!(
                matches!(got, Solution::Infeasible(ref v) if v.kind == ViolationKind::Batch),
                "case {case}"
            );
            continue;
        }
        if prob.tp * c > prob.devices {
            assert!(
                matches!(got, Solution::Infeasible(ref v) if v.kind == ViolationKind::Devices),
                "case {case}"
            );
            context_refused += usize::from(c > 1 && prob.tp <= prob.devices);
            continue;
        }
        let mut plans = Vec::new();
        let q = prob.global_batch / b;
        for d in (1..=q).filter(|&d| q.is_multiple_of(d)) {
            for p in 1..=n {
                if d * p as u64 * prob.tp * c <= prob.devices {
                    plans.extend(all_plans(&prob, d, p));
                }
            }
        }
        match (got, choose(&plans, prob.hbm_bytes)) {
            (Solution::Feasible(plan), Some(want)) => {
                feasible += 1;
                interleaved += usize::from(plan.virtual_stages > 1);
                sharded += usize::from(plan.zero != Zero::Off);
                expert_parallel += usize::from(plan.expert_parallel > 1);
                folded += usize::from(folding(&prob).0);
                wider += usize::from(folding(&prob).0 && plan.expert_parallel > plan.dp);
                context += usize::from(c > 1);
                context_d1_sharded += usize::from(c > 1 && plan.dp == 1 && plan.zero != Zero::Off);
                check_plan(&plan, &prob, want, case);
            }
            (Solution::Infeasible(v), None) => {
                infeasible += 1;
                if plans.is_empty() {
                    // No (d, p) allows the fixed interleaving, or the fixed EP degree.
                    assert!(
                        matches!(v.kind, ViolationKind::Stages | ViolationKind::Devices),
                        "case {case}"
                    );
                } else {
                    assert_eq!(v.kind, ViolationKind::Memory, "case {case}");
                    // The report names the CP degree the least memory was found under.
                    assert_eq!(
                        v.message.contains(&format!(", CP {c}")),
                        c > 1,
                        "case {case}: {}",
                        v.message
                    );
                }
            }
            (got, want) => panic!(
                "case {case}: solve {got:?} vs brute force {:?}\n{prob:?}",
                want.map(|w| (w.obj, w.key.clone()))
            ),
        }
    }
    eprintln!(
        "feasible {feasible} (interleaved {interleaved}, ZeRO > 0 {sharded}, EP > 1 \
         {expert_parallel}, CP > 1 {context}, of them ZeRO > 0 at d = 1 {context_d1_sharded}, \
         ETP 1 {folded}, of them EP > d {wider}), infeasible {infeasible}, refused for t·c > N \
         {context_refused}"
    );
    assert!(
        feasible > 400
            && interleaved > 40
            && sharded > 40
            && expert_parallel > 40
            && folded > 40
            && wider > 10
            && context > 100
            && context_d1_sharded > 20
            && context_refused > 10
            && infeasible > 100,
        "feasible {feasible}, interleaved {interleaved}, sharded {sharded}, EP {expert_parallel}, \
         ETP 1 {folded} (EP > d {wider}), CP {context}, CP sharded at d = 1 {context_d1_sharded}, CP refused {context_refused}, \
         infeasible {infeasible}"
    );
}

#[test]
fn evaluate_fixed_with_settings_equals_brute_force() {
    let mut rng = Rng(0x2f1e_9d3c_4b5a_6978);
    let (mut checked, mut context_over) = (0, 0);
    for case in 0..800 {
        let prob = random_problem(&mut rng);
        let n = prob.layers.len();
        let p = 1 + rng.below(n as u64) as usize;
        let d = rng.pow2(3);
        let ev = evaluate_fixed(&prob, p, d).unwrap();
        if !prob.global_batch.is_multiple_of(prob.micro_batch * d) {
            assert!(ev.plan.is_none());
            continue;
        }
        // The devices counted are d·p·t·c.
        let over = d * p as u64 * prob.tp * prob.cp > prob.devices;
        assert_eq!(
            over,
            ev.violations.iter().any(
                |v| v.kind == ViolationKind::Devices && v.message.starts_with("devices: d·p·t")
            ),
            "case {case}"
        );
        context_over += usize::from(prob.cp > 1 && over && d * p as u64 * prob.tp <= prob.devices);
        let plans = all_plans(&prob, d, p);
        if plans.is_empty() {
            // Only a fixed interleaving that (p, m, blocks) does not allow, or a fixed EP
            // degree that d does not allow, leaves nothing.
            assert!(ev.plan.is_none(), "case {case}");
            assert!(ev
                .violations
                .iter()
                .any(|v| matches!(v.kind, ViolationKind::Stages | ViolationKind::Devices)));
            continue;
        }
        let plan = ev.plan.as_ref().unwrap();
        checked += 1;
        match choose(&plans, prob.hbm_bytes) {
            Some(want) => {
                assert!(
                    !ev.violations
                        .iter()
                        .any(|v| v.kind == ViolationKind::Memory),
                    "case {case}"
                );
                check_plan(plan, &prob, want, case);
            }
            None => {
                let v = ev
                    .violations
                    .iter()
                    .find(|v| v.kind == ViolationKind::Memory)
                    .unwrap();
                // The least memory at the least-memory ZeRO stage and EP degree and the first
                // chunk count.
                let zmax = *zero_stages(&prob).last().unwrap();
                let zmax = if d * prob.cp == 1 && !folding(&prob).0 {
                    zero_stages(&prob)[0]
                } else {
                    zmax
                };
                let emax = *expert_degrees(&prob, d).last().unwrap();
                let vfirst = plans.iter().map(|x| x.key.2).min().unwrap();
                let least = plans
                    .iter()
                    .filter(|x| x.key.3 == zmax && x.key.4 == emax && x.key.2 == vfirst)
                    .map(|x| x.mem)
                    .min()
                    .unwrap();
                assert_eq!(v.needed_bytes, Some(least), "case {case}");
                assert!(plan.max_memory_bytes <= least, "case {case}");
            }
        }
    }
    eprintln!("checked {checked}, over the devices by c alone {context_over}");
    assert!(checked > 300, "checked {checked}");
    // Some fixed placements fit d·p·t but not d·p·t·c.
    assert!(
        context_over > 10,
        "over the devices by c alone {context_over}"
    );
}

#[test]
fn the_simulated_stash_matches_the_closed_form_for_equal_chunks() {
    // Korthikanti et al. 2022, §4.2.3: rank 0 holds (1 + (p−1)/(p·v)) · p micro-batches of a
    // plain stage's stash, i.e. p·v + p − 1 chunk-micro-batches, when m is large enough.
    for p in 2..6 {
        for v in 2..5 {
            let saved = vec![1u64; v];
            let (bytes, count) = simulated_stash(p, v, 0, 64, &saved);
            assert_eq!(count, (p * v + p - 1) as u64);
            assert_eq!(bytes, (p * v + p - 1) as u64);
        }
    }
}
