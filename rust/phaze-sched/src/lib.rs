//! The warm start of phaze's operator scheduling (`passes/algorithms/schedule/warm_start.py`): the
//! heuristics that give SCIP its first schedule, and the answer when the MILP is too large.
//!
//! A problem ([`Instance`]) is a DAG of ops that take time, each with one or two *modes*
//! (duration, cores held: on one core, or split over all cores of its kind), on unit kinds with
//! a core count each.  Everything here is a serial schedule-generation scheme with insertion
//! over a usage profile per kind ([`Profile`]), driven by:
//!
//! - [`best_list`]: a portfolio of list schedules (priority rule × mode rule), each improved by
//!   [`justify`] (double justification, Valls et al., EJOR 2005);
//! - [`improve`]: a local search over op lists (move one op, sometimes flip its mode, decode,
//!   justify; keep when not worse), seeded and counted in decodes, so deterministic.
//!
//! It lives in Rust because the search schedules thousands of layer problems and this local
//! search was most of their time in Python.  Times are seconds (any unit works).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// One scheduling problem, ops in topological order (every predecessor index is smaller).
#[derive(Clone, Debug)]
pub struct Instance {
    /// Unit kind of each op (index into `caps`).
    pub kind: Vec<usize>,
    /// Cores of each kind.
    pub caps: Vec<i64>,
    /// Per op: `(duration, cores held)`; mode 0 on one core, mode 1 (if any) split.
    pub modes: Vec<Vec<(f64, i64)>>,
    /// Direct predecessors of each op (indices < the op's).
    pub preds: Vec<Vec<usize>>,
}

/// A schedule: start time and mode of each op, and the makespan.
#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    pub start: Vec<f64>,
    pub mode: Vec<usize>,
    pub makespan: f64,
}

impl Instance {
    /// The instance of these lists, if [`Instance::validate`] accepts it.
    pub fn new(
        kind: Vec<usize>,
        caps: Vec<i64>,
        modes: Vec<Vec<(f64, i64)>>,
        preds: Vec<Vec<usize>>,
    ) -> Result<Instance, String> {
        let inst = Instance {
            kind,
            caps,
            modes,
            preds,
        };
        inst.validate().map(|()| inst)
    }

    /// Checks the shape: kinds, modes and predecessors in range, topological order.
    pub fn validate(&self) -> Result<(), String> {
        let m = self.kind.len();
        if self.modes.len() != m || self.preds.len() != m {
            return Err(format!(
                "{} kinds, {} mode lists, {} predecessor lists: expected one of each per op",
                m,
                self.modes.len(),
                self.preds.len()
            ));
        }
        for k in 0..m {
            let cap = *self
                .caps
                .get(self.kind[k])
                .ok_or_else(|| format!("op {k}: kind {} has no core count", self.kind[k]))?;
            if self.modes[k].is_empty() || self.modes[k].len() > 2 {
                return Err(format!(
                    "op {k}: {} modes, expected 1 or 2",
                    self.modes[k].len()
                ));
            }
            for &(d, h) in &self.modes[k] {
                if !(d.is_finite() && d > 0.0) || h < 1 || h > cap {
                    return Err(format!("op {k}: mode ({d}, {h}) on a kind of {cap} cores"));
                }
            }
            if let Some(&p) = self.preds[k].iter().find(|&&p| p >= k) {
                return Err(format!("op {k}: predecessor {p} is not before it"));
            }
        }
        Ok(())
    }

    /// Checks that a schedule to improve has a start per op and gives each op one of its modes
    /// (its makespan is taken as given): a caller's bad list is an error here, not an index out
    /// of bounds in the search (so are [`Instance::check_mode`] and [`Instance::check_order`]).
    pub fn check_schedule(&self, s: &Schedule) -> Result<(), String> {
        self.check_len("start", s.start.len())?;
        self.check_mode(&s.mode)
    }

    /// Checks that `mode` gives each op one of its modes.
    pub fn check_mode(&self, mode: &[usize]) -> Result<(), String> {
        self.check_len("mode", mode.len())?;
        match (0..mode.len()).find(|&k| mode[k] >= self.modes[k].len()) {
            Some(k) => Err(format!(
                "op {k}: mode {} of {}",
                mode[k],
                self.modes[k].len()
            )),
            None => Ok(()),
        }
    }

    /// Checks that `order` lists every op once (an op list to decode).
    pub fn check_order(&self, order: &[usize]) -> Result<(), String> {
        self.check_len("order", order.len())?;
        let mut seen = vec![false; order.len()];
        for &k in order {
            if k >= seen.len() || seen[k] {
                return Err("order: not a permutation of the ops".into());
            }
            seen[k] = true;
        }
        Ok(())
    }

    fn check_len(&self, what: &str, got: usize) -> Result<(), String> {
        match got == self.len() {
            true => Ok(()),
            false => Err(format!("{what}: {got} values for {} ops", self.len())),
        }
    }

    fn len(&self) -> usize {
        self.kind.len()
    }

    fn succs(&self) -> Vec<Vec<usize>> {
        let mut s = vec![Vec::new(); self.len()];
        for k in 0..self.len() {
            for &p in &self.preds[k] {
                s[p].push(k);
            }
        }
        s
    }

    fn dur(&self, k: usize, mode: usize) -> f64 {
        self.modes[k][mode].0
    }

    fn pmin(&self) -> Vec<f64> {
        self.modes
            .iter()
            .map(|ms| ms.iter().map(|m| m.0).fold(f64::INFINITY, f64::min))
            .collect()
    }

    /// Longest path to each op's start and after its end, with the shortest modes.
    pub fn head_tail(&self) -> (Vec<f64>, Vec<f64>) {
        let m = self.len();
        let pmin = self.pmin();
        let mut head = vec![0.0; m];
        for k in 0..m {
            head[k] = self.preds[k]
                .iter()
                .map(|&p| head[p] + pmin[p])
                .fold(0.0, f64::max);
        }
        let succs = self.succs();
        let mut tail = vec![0.0; m];
        for k in (0..m).rev() {
            tail[k] = succs[k]
                .iter()
                .map(|&s| tail[s] + pmin[s])
                .fold(0.0, f64::max);
        }
        (head, tail)
    }

    /// The makespan of start times `start` in modes `mode`.
    pub fn makespan(&self, start: &[f64], mode: &[usize]) -> f64 {
        (0..self.len())
            .map(|k| start[k] + self.dur(k, mode[k]))
            .fold(0.0, f64::max)
    }
}

/// Cores in use over time on one kind: breakpoints `times` and the usage from each breakpoint
/// to the next (the last segment runs to infinity).
#[derive(Clone, Debug)]
pub struct Profile {
    cap: i64,
    times: Vec<f64>,
    usage: Vec<i64>,
}

impl Profile {
    pub fn new(cap: i64) -> Self {
        Profile {
            cap,
            times: vec![0.0],
            usage: vec![0],
        }
    }

    /// Index of the segment holding `t` (the last breakpoint at or before it).
    fn segment(&self, t: f64) -> usize {
        self.times.partition_point(|&x| x <= t).saturating_sub(1)
    }

    /// The earliest start at or after `est` where `demand` cores are free for `dur`.
    pub fn earliest(&self, est: f64, dur: f64, demand: i64) -> f64 {
        let mut i = self.segment(est);
        let mut t = est;
        loop {
            let seg_end = self.times.get(i + 1).copied().unwrap_or(f64::INFINITY);
            if self.usage[i] + demand > self.cap {
                t = seg_end;
            } else if seg_end >= t + dur {
                return t;
            }
            i += 1;
        }
    }

    fn cut(&mut self, t: f64) -> usize {
        let i = self.segment(t);
        if self.times[i] == t {
            return i;
        }
        self.times.insert(i + 1, t);
        self.usage.insert(i + 1, self.usage[i]);
        i + 1
    }

    /// Hold `demand` cores over `[start, start + dur)`.
    pub fn add(&mut self, start: f64, dur: f64, demand: i64) {
        let a = self.cut(start);
        let b = self.cut(start + dur);
        for u in &mut self.usage[a..b] {
            *u += demand;
        }
    }
}

fn profiles(inst: &Instance) -> Vec<Profile> {
    inst.caps.iter().map(|&c| Profile::new(c)).collect()
}

/// Priority rules of [`list_schedule`] (smaller goes first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Priority {
    /// Longest remaining critical path.
    CriticalPath,
    /// Earliest possible start.
    EarliestStart,
    /// Latest start on one core given the makespan bound.
    LatestStart,
}

impl Priority {
    /// Every rule, in the order [`best_list`] tries them.
    pub const ALL: [Priority; 3] = [
        Priority::CriticalPath,
        Priority::EarliestStart,
        Priority::LatestStart,
    ];
}

/// Mode rules of [`list_schedule`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModeRule {
    /// The mode that finishes first.
    Best,
    /// Never split.
    One,
    /// Split whenever splitting is faster.
    Split,
    /// One core when that still finishes by the op's latest finish (`ub − tail`), else `Best`.
    Slack,
}

impl ModeRule {
    /// Every rule, in the order [`best_list`] tries them.
    pub const ALL: [ModeRule; 4] = [
        ModeRule::Best,
        ModeRule::One,
        ModeRule::Split,
        ModeRule::Slack,
    ];
}

/// `(key, op)` ordered by key then op, smallest first out of a [`BinaryHeap`].
#[derive(PartialEq)]
struct Ready(f64, usize);
impl Eq for Ready {}
impl PartialOrd for Ready {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Ready {
    fn cmp(&self, o: &Self) -> Ordering {
        o.0.total_cmp(&self.0).then(o.1.cmp(&self.1))
    }
}

/// Serial schedule generation with insertion: the eligible op of highest priority goes next, at
/// the earliest time its cores are free for it (gaps left earlier are used), in the mode the
/// rule picks.  A split op holds every core of its kind, so the profile keeps every capacity.
pub fn list_schedule(
    inst: &Instance,
    rule: ModeRule,
    priority: Priority,
    ub: f64,
) -> (Vec<f64>, Vec<usize>) {
    let m = inst.len();
    let (head, tail) = inst.head_tail();
    let pmin = inst.pmin();
    let prio: Vec<f64> = match priority {
        Priority::CriticalPath => (0..m).map(|k| -(pmin[k] + tail[k])).collect(),
        Priority::EarliestStart => head.clone(),
        Priority::LatestStart => (0..m).map(|k| -(inst.dur(k, 0) + tail[k])).collect(),
    };
    let succs = inst.succs();
    let mut npred: Vec<usize> = inst.preds.iter().map(|p| p.len()).collect();
    let mut prof = profiles(inst);
    let (mut start, mut mode, mut finish) = (vec![0.0; m], vec![0usize; m], vec![0.0; m]);
    let mut ready: BinaryHeap<Ready> = (0..m)
        .filter(|&k| npred[k] == 0)
        .map(|k| Ready(prio[k], k))
        .collect();
    while let Some(Ready(_, k)) = ready.pop() {
        let est = inst.preds[k].iter().map(|&p| finish[p]).fold(0.0, f64::max);
        let pr = &prof[inst.kind[k]];
        // (finish, held, mode, start), compared in that order.
        let mut options: Vec<(f64, i64, usize, f64)> = inst.modes[k]
            .iter()
            .enumerate()
            .map(|(mi, &(dur, held))| {
                let s = pr.earliest(est, dur, held);
                (s + dur, held, mi, s)
            })
            .collect();
        match rule {
            ModeRule::One => options.truncate(1),
            ModeRule::Split if options.len() > 1 => {
                options.remove(0);
            }
            ModeRule::Slack if options.len() > 1 && options[0].0 <= ub - tail[k] => {
                options.truncate(1)
            }
            _ => {}
        }
        let best = options
            .iter()
            .copied()
            .min_by(|a, b| {
                a.0.total_cmp(&b.0)
                    .then(a.1.cmp(&b.1))
                    .then(a.2.cmp(&b.2))
                    .then(a.3.total_cmp(&b.3))
            })
            .expect("an op has a mode");
        let (f, held, mi, s) = best;
        start[k] = s;
        mode[k] = mi;
        finish[k] = f;
        prof[inst.kind[k]].add(s, inst.dur(k, mi), held);
        for &q in &succs[k] {
            npred[q] -= 1;
            if npred[q] == 0 {
                ready.push(Ready(prio[q], q));
            }
        }
    }
    (start, mode)
}

/// Serial generation with insertion for a fixed op list and modes.  `backward` schedules the
/// mirrored problem (successors first) and returns mirrored starts (`T − finish`, unshifted).
/// `succs` are the instance's successor lists (used when `backward`).
fn sgs_fixed(
    inst: &Instance,
    succs: &[Vec<usize>],
    order: &[usize],
    mode: &[usize],
    backward: bool,
) -> Vec<f64> {
    let m = inst.len();
    let deps = if backward { succs } else { &inst.preds[..] };
    let mut prof = profiles(inst);
    let (mut start, mut finish) = (vec![0.0; m], vec![0.0; m]);
    for &k in order {
        let (dur, held) = inst.modes[k][mode[k]];
        let est = deps[k].iter().map(|&p| finish[p]).fold(0.0, f64::max);
        let p = &mut prof[inst.kind[k]];
        let s = p.earliest(est, dur, held);
        p.add(s, dur, held);
        start[k] = s;
        finish[k] = s + dur;
    }
    start
}

/// Decodes an op list (any precedence-feasible order) with fixed modes.
pub fn decode(inst: &Instance, order: &[usize], mode: &[usize]) -> Vec<f64> {
    sgs_fixed(inst, &inst.succs(), order, mode, false)
}

fn justify_with(
    inst: &Instance,
    succs: &[Vec<usize>],
    start: Vec<f64>,
    mode: &[usize],
    rounds: usize,
) -> (Vec<f64>, f64) {
    let m = inst.len();
    let dur: Vec<f64> = (0..m).map(|k| inst.dur(k, mode[k])).collect();
    let mut start = start;
    let mut mk = inst.makespan(&start, mode);
    for _ in 0..rounds {
        let mut order_b: Vec<usize> = (0..m).collect();
        // decreasing finish, then decreasing index
        order_b.sort_by(|&a, &b| {
            (start[b] + dur[b])
                .total_cmp(&(start[a] + dur[a]))
                .then(b.cmp(&a))
        });
        let rs = sgs_fixed(inst, succs, &order_b, mode, true);
        let mut order_f: Vec<usize> = (0..m).collect();
        // decreasing mirrored finish (= increasing start), then increasing index
        order_f.sort_by(|&a, &b| {
            (rs[b] + dur[b])
                .total_cmp(&(rs[a] + dur[a]))
                .then(a.cmp(&b))
        });
        let new = sgs_fixed(inst, succs, &order_f, mode, false);
        let new_mk = inst.makespan(&new, mode);
        if new_mk < mk * (1.0 - 1e-12) {
            start = new;
            mk = new_mk;
        } else {
            break;
        }
    }
    (start, mk)
}

/// Forward-backward improvement (double justification): shift every op as late as possible in
/// order of decreasing finish, then as early as possible in order of increasing start; repeat
/// (at most `rounds` times) while the makespan shrinks.  Modes stay as they are.
pub fn justify(inst: &Instance, start: Vec<f64>, mode: &[usize], rounds: usize) -> (Vec<f64>, f64) {
    justify_with(inst, &inst.succs(), start, mode, rounds)
}

/// The best of the list-schedule portfolio (priority rule × mode rule), each justified.
pub fn best_list(inst: &Instance) -> Schedule {
    let succs = inst.succs();
    let mut best: Option<Schedule> = None;
    for priority in Priority::ALL {
        for rule in ModeRule::ALL {
            let ub = best.as_ref().map_or(f64::INFINITY, |b| b.makespan);
            let (s, md) = list_schedule(inst, rule, priority, ub);
            let (s, mk) = justify_with(inst, &succs, s, &md, 4);
            if best
                .as_ref()
                .is_none_or(|b| mk < b.makespan - 1e-15 * mk.max(1.0))
            {
                best = Some(Schedule {
                    start: s,
                    mode: md,
                    makespan: mk,
                });
            }
        }
    }
    best.unwrap_or(Schedule {
        start: vec![],
        mode: vec![],
        makespan: 0.0,
    })
}

/// SplitMix64 (Steele, Lea, Flood 2014): a small, fixed generator, so that a seed gives the
/// same local search on every platform and every version of phaze's dependencies.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `[0, n)` (n ≥ 1; the modulo bias is below 2^-40 for the sizes used here).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Local search on a schedule: move one op (and, 30 % of the time, flip its mode) to a random
/// place of the op list allowed by precedence, decode by serial generation with insertion and
/// two rounds of justification, keep the result when it is not worse (plateaus are walked).
/// `iterations` decodes from `seed`: deterministic.
pub fn improve(inst: &Instance, init: Schedule, iterations: usize, seed: u64) -> Schedule {
    let m = inst.len();
    if m < 2 || iterations == 0 {
        return init;
    }
    let succs = inst.succs();
    let mut rng = Rng(seed);
    let by_start = |st: &[f64]| {
        let mut o: Vec<usize> = (0..m).collect();
        o.sort_by(|&a, &b| st[a].total_cmp(&st[b]).then(a.cmp(&b)));
        o
    };
    let mut order = by_start(&init.start);
    let mut best = init;
    let mut where_ = vec![0usize; m];
    for _ in 0..iterations {
        let k = rng.below(m);
        let mut trial_mode = best.mode.clone();
        if inst.modes[k].len() > 1 && rng.unit() < 0.3 {
            trial_mode[k] = 1 - trial_mode[k];
        }
        let mut trial: Vec<usize> = order.iter().copied().filter(|&q| q != k).collect();
        for (i, &q) in trial.iter().enumerate() {
            where_[q] = i;
        }
        let lo = inst.preds[k]
            .iter()
            .map(|&q| where_[q] + 1)
            .max()
            .unwrap_or(0);
        let hi = succs[k]
            .iter()
            .map(|&q| where_[q])
            .min()
            .unwrap_or(trial.len());
        trial.insert(lo + rng.below(hi - lo + 1), k);
        let st = sgs_fixed(inst, &succs, &trial, &trial_mode, false);
        let (st, mk) = justify_with(inst, &succs, st, &trial_mode, 2);
        if mk <= best.makespan * (1.0 + 1e-12) {
            order = by_start(&st);
            best = Schedule {
                start: st,
                mode: trial_mode,
                makespan: mk,
            };
        }
    }
    best
}

/// Checks a schedule: precedence, and at no instant more cores of a kind in use than it has.
pub fn check(inst: &Instance, s: &Schedule) -> Result<(), String> {
    let m = inst.len();
    let tol = 1e-9 * s.makespan.max(1e-30);
    for k in 0..m {
        for &p in &inst.preds[k] {
            let end_p = s.start[p] + inst.dur(p, s.mode[p]);
            if s.start[k] + tol < end_p {
                return Err(format!(
                    "op {k} starts at {} before its predecessor {p} ends at {end_p}",
                    s.start[k]
                ));
            }
        }
    }
    for (kd, &cap) in inst.caps.iter().enumerate() {
        let mut events: Vec<(f64, i64)> = Vec::new();
        for k in (0..m).filter(|&k| inst.kind[k] == kd) {
            let (d, h) = inst.modes[k][s.mode[k]];
            if d > 0.0 {
                events.push((s.start[k] + d - tol, -h));
                events.push((s.start[k], h));
            }
        }
        events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let mut used = 0;
        for (t, h) in events {
            used += h;
            if used > cap {
                return Err(format!("kind {kd}: {used} of {cap} cores in use at {t}"));
            }
        }
    }
    let mk = inst.makespan(&s.start, &s.mode);
    if (mk - s.makespan).abs() > tol {
        return Err(format!("makespan {} but the ops end at {mk}", s.makespan));
    }
    Ok(())
}
