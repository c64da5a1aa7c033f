//! The warm-start heuristics on hand-checked and seeded random problems: every schedule they
//! return is valid (precedence, capacity), the local search never makes it worse, and a seed
//! gives the same schedule every time.

use phaze_sched::{
    best_list, check, decode, improve, justify, list_schedule, Instance, ModeRule, Priority,
    Profile,
};

/// A tiny deterministic generator for the test problems (not the crate's).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn random_instance(seed: u64, n: usize) -> Instance {
    let mut r = Lcg(seed);
    let caps = vec![1 + r.below(4) as i64, 1 + r.below(8) as i64];
    let mut kind = Vec::new();
    let mut modes = Vec::new();
    let mut preds = Vec::new();
    for k in 0..n {
        let kd = r.below(2) as usize;
        let one = 1.0 + r.below(100) as f64 / 10.0;
        let cap = caps[kd];
        let mut ms = vec![(one, 1)];
        if cap > 1 && r.below(2) == 0 {
            ms.push((one / cap as f64 * (1.0 + r.below(10) as f64 / 10.0), cap));
        }
        kind.push(kd);
        modes.push(ms);
        let mut ps: Vec<usize> = (0..k).filter(|_| r.below(6) == 0).collect();
        ps.dedup();
        preds.push(ps);
    }
    Instance {
        kind,
        caps,
        modes,
        preds,
    }
}

#[test]
fn one_core_serializes_independent_ops() {
    let inst = Instance {
        kind: vec![0, 0, 0],
        caps: vec![1],
        modes: vec![vec![(2.0, 1)], vec![(3.0, 1)], vec![(1.0, 1)]],
        preds: vec![vec![], vec![], vec![0]],
    };
    let s = best_list(&inst);
    check(&inst, &s).unwrap();
    assert_eq!(s.makespan, 6.0);
}

#[test]
fn split_mode_is_taken_when_it_finishes_first() {
    // Two cores; a splittable op (4 s on one core, 1.5 s split) and a 1 s op: the longer
    // critical path goes first, split (ends at 1.5 s rather than 4 s), then the short one.
    let inst = Instance {
        kind: vec![0, 0],
        caps: vec![2],
        modes: vec![vec![(1.0, 1)], vec![(4.0, 1), (1.5, 2)]],
        preds: vec![vec![], vec![]],
    };
    let (st, md) = list_schedule(&inst, ModeRule::Best, Priority::CriticalPath, f64::INFINITY);
    assert_eq!(md, vec![0, 1]);
    assert_eq!(st, vec![1.5, 0.0]);
    let s = best_list(&inst);
    check(&inst, &s).unwrap();
    assert_eq!(s.makespan, 2.5);
}

#[test]
fn profile_finds_the_first_gap_that_fits() {
    let mut p = Profile::new(2);
    p.add(0.0, 4.0, 2);
    p.add(5.0, 1.0, 1);
    assert_eq!(p.earliest(0.0, 1.0, 1), 4.0);
    assert_eq!(p.earliest(0.0, 2.0, 2), 6.0); // [4, 5) is too short
    assert_eq!(p.earliest(4.5, 3.0, 1), 4.5); // one core stays free over [5, 6)
}

#[test]
fn heuristics_are_valid_monotone_and_deterministic() {
    for seed in 0..60 {
        let inst = random_instance(seed, 5 + (seed as usize % 40));
        inst.validate().unwrap();
        for pr in Priority::ALL {
            for rule in ModeRule::ALL {
                let (st, md) = list_schedule(&inst, rule, pr, 50.0);
                let mk = inst.makespan(&st, &md);
                let (js, jmk) = justify(&inst, st.clone(), &md, 4);
                assert!(jmk <= mk);
                check(
                    &inst,
                    &phaze_sched::Schedule {
                        start: js,
                        mode: md.clone(),
                        makespan: jmk,
                    },
                )
                .unwrap();
            }
        }
        let b = best_list(&inst);
        check(&inst, &b).unwrap();
        let i1 = improve(&inst, b.clone(), 300, 7);
        let i2 = improve(&inst, b.clone(), 300, 7);
        check(&inst, &i1).unwrap();
        assert_eq!(i1, i2);
        assert!(i1.makespan <= b.makespan * (1.0 + 1e-12));
        let mut order: Vec<usize> = (0..inst.kind.len()).collect();
        order.sort_by(|&a, &c| i1.start[a].total_cmp(&i1.start[c]).then(a.cmp(&c)));
        let again = decode(&inst, &order, &i1.mode);
        let mk = inst.makespan(&again, &i1.mode);
        assert!(
            mk <= i1.makespan * (1.0 + 1e-12),
            "decoding a schedule's own order never makes it later"
        );
    }
}

#[test]
fn validate_rejects_bad_shapes() {
    let bad = Instance {
        kind: vec![0, 0],
        caps: vec![1],
        modes: vec![vec![(1.0, 1)], vec![(1.0, 1)]],
        preds: vec![vec![1], vec![]],
    };
    assert!(bad.validate().unwrap_err().contains("predecessor"));
    let bad = Instance {
        kind: vec![1],
        caps: vec![1],
        modes: vec![vec![(1.0, 1)]],
        preds: vec![vec![]],
    };
    assert!(bad.validate().unwrap_err().contains("no core count"));
    let bad = Instance {
        kind: vec![0],
        caps: vec![2],
        modes: vec![vec![(0.0, 1)]],
        preds: vec![vec![]],
    };
    assert!(bad.validate().unwrap_err().contains("mode"));
}
