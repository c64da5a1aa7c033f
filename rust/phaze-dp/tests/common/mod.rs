//! What the brute-force tests share: a seeded generator and random layers and networks.

use phaze_dp::{Layer, NetLevel, Problem};

/// xorshift64*: deterministic, seeded per test.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    pub fn time(&mut self) -> f64 {
        // 0, or a multiple of 1/64 below 8 s.
        if self.below(5) == 0 {
            0.0
        } else {
            self.below(512) as f64 / 64.0
        }
    }
    pub fn pow2(&mut self, max_exp: u64) -> u64 {
        1 << self.below(max_exp + 1)
    }
}

/// `n` random layers: times in 1/64 s, byte counts below 64 (optimizer state below
/// `optimizer_below`).
pub fn random_layers(rng: &mut Rng, n: usize, optimizer_below: u64) -> Vec<Layer> {
    // The recompute workspaces from a generator of their own: the instances drawn stay those
    // of before.
    let mut remat = Rng(rng.0 ^ 0x7265_6d61_745f_7773);
    let mut layers: Vec<Layer> = (0..n)
        .map(|_| Layer {
            fwd_s: rng.time(),
            bwd_s: rng.time(),
            recompute_s: [rng.time() / 4.0, rng.time(), rng.time()],
            saved_bytes: [rng.below(64), rng.below(64), rng.below(64)],
            param_bytes: rng.below(64),
            grad_bytes: rng.below(64),
            optimizer_bytes: rng.below(optimizer_below),
            workspace_bytes: rng.below(32),
            boundary_bytes: rng.below(64),
            ..Default::default()
        })
        .collect();
    for l in &mut layers {
        l.recompute_workspace_bytes = remat.below(48);
    }
    layers
}

/// One to three network levels, groups growing by 2 or 4, power-of-two bandwidths.
pub fn random_levels(rng: &mut Rng) -> Vec<NetLevel> {
    let mut levels = Vec::new();
    let mut g = 1u64;
    for i in 0..1 + rng.below(3) {
        g *= 1 << (1 + rng.below(2));
        let bandwidth_bps = (1u64 << rng.below(8)) as f64;
        // An outer level of 2, 8, 32 ... devices has an uplink of one to four links' worth
        // (from the sizes, not the generator: the instances drawn stay those of before).
        let uplink_bps =
            (i > 0 && g % 3 == 2).then(|| bandwidth_bps * (1 + g.trailing_zeros() % 4) as f64);
        // Some levels' collectives take a share of the compute (from the sizes too).
        let collective_compute_share = if g.is_multiple_of(4) {
            0.125 * (g.trailing_zeros() % 3) as f64
        } else {
            0.0
        };
        levels.push(NetLevel {
            group_size: g,
            bandwidth_bps,
            latency_s: rng.below(8) as f64 / 64.0,
            uplink_bps,
            collective_compute_share,
            ..NetLevel::default()
        });
    }
    levels
}

/// The innermost level whose group holds `g` devices, else the last one.
pub fn level_for(prob: &Problem, g: u64) -> usize {
    prob.levels
        .iter()
        .position(|l| l.group_size >= g)
        .unwrap_or(prob.levels.len() - 1)
}

/// Per-device bandwidth of a ring over `g` devices, consecutive members `stride` apart, on
/// level `l`. Rail-aware: with k members inside each group of the level below, the ring drives
/// k of its links at once, up to that level's own bandwidth and the group's share of the
/// level's uplink.
pub fn ring_bandwidth(prob: &Problem, g: u64, l: usize, stride: u64) -> f64 {
    let mut bw = prob.levels[l].bandwidth_bps;
    if l > 0 {
        let below = &prob.levels[l - 1];
        let k = std::cmp::max(1, std::cmp::min(g, below.group_size / stride));
        if k > 1 {
            bw = f64::min(k as f64 * bw, below.bandwidth_bps);
        }
        // The node's uplink, shared by the inner / k groups with members in it.
        if let Some(up) = prob.levels[l].uplink_bps {
            bw = f64::min(bw, up * k as f64 / below.group_size as f64);
        }
    }
    bw
}

/// Per-device bandwidth of a pipeline transfer on level `l`, neighbours `stride` apart: the
/// level's own, at most the uplink over the min(stride, inner) devices of a node that send at
/// once.
pub fn p2p_bandwidth(prob: &Problem, l: usize, stride: u64) -> f64 {
    let bw = prob.levels[l].bandwidth_bps;
    match prob.levels[l].uplink_bps {
        Some(up) if l > 0 => {
            let senders = std::cmp::max(1, std::cmp::min(stride, prob.levels[l - 1].group_size));
            f64::min(bw, up / senders as f64)
        }
        _ => bw,
    }
}
