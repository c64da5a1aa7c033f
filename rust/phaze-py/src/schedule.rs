//! The scheduling warm start (`phaze-sched`) across the Python boundary: an instance as plain
//! lists, a schedule back as `(start, mode, makespan)`; the GIL released while it runs.
//!
//! An instance is `(kind, caps, modes, preds)`: the unit kind of each op (an index into
//! `caps`), the cores of each kind, each op's `[(duration_s, cores_held), ...]` (one core first,
//! split second) and its predecessors (ops in topological order).

use phaze_sched::{Instance, Schedule};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

type Modes = Vec<Vec<(f64, i64)>>;

fn instance(
    kind: Vec<usize>,
    caps: Vec<i64>,
    modes: Modes,
    preds: Vec<Vec<usize>>,
) -> PyResult<Instance> {
    let inst = Instance {
        kind,
        caps,
        modes,
        preds,
    };
    inst.validate().map_err(PyValueError::new_err)?;
    Ok(inst)
}

fn check_len(what: &str, got: usize, want: usize) -> PyResult<()> {
    if got != want {
        return Err(PyValueError::new_err(format!(
            "{what}: {got} values for {want} ops"
        )));
    }
    Ok(())
}

/// Every op's mode exists (one per op, checked by the caller).
fn check_modes(inst: &Instance, mode: &[usize]) -> PyResult<()> {
    match (0..mode.len()).find(|&k| mode[k] >= inst.modes[k].len()) {
        Some(k) => Err(PyValueError::new_err(format!(
            "op {k}: mode {} of {}",
            mode[k],
            inst.modes[k].len()
        ))),
        None => Ok(()),
    }
}

/// The best list schedule of the portfolio (priority rule × mode rule), justified:
/// `(start, mode, makespan)`.
#[pyfunction]
fn best_list_schedule(
    py: Python<'_>,
    kind: Vec<usize>,
    caps: Vec<i64>,
    modes: Modes,
    preds: Vec<Vec<usize>>,
) -> PyResult<(Vec<f64>, Vec<usize>, f64)> {
    let inst = instance(kind, caps, modes, preds)?;
    let s = py.detach(|| phaze_sched::best_list(&inst));
    Ok((s.start, s.mode, s.makespan))
}

/// The seeded local search from a schedule (`start`, `mode`, `makespan`): `iterations`
/// decodes; returns the best schedule found (never worse).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn improve_schedule(
    py: Python<'_>,
    kind: Vec<usize>,
    caps: Vec<i64>,
    modes: Modes,
    preds: Vec<Vec<usize>>,
    start: Vec<f64>,
    mode: Vec<usize>,
    makespan: f64,
    iterations: usize,
    seed: u64,
) -> PyResult<(Vec<f64>, Vec<usize>, f64)> {
    let inst = instance(kind, caps, modes, preds)?;
    check_len("start", start.len(), inst.kind.len())?;
    check_len("mode", mode.len(), inst.kind.len())?;
    check_modes(&inst, &mode)?;
    let s = py.detach(|| {
        phaze_sched::improve(
            &inst,
            Schedule {
                start,
                mode,
                makespan,
            },
            iterations,
            seed,
        )
    });
    Ok((s.start, s.mode, s.makespan))
}

/// Decode an op list (`order`, precedence-feasible) with fixed modes, then justify:
/// `(start, makespan)`.
#[pyfunction]
fn decode_justified(
    py: Python<'_>,
    kind: Vec<usize>,
    caps: Vec<i64>,
    modes: Modes,
    preds: Vec<Vec<usize>>,
    order: Vec<usize>,
    mode: Vec<usize>,
) -> PyResult<(Vec<f64>, f64)> {
    let inst = instance(kind, caps, modes, preds)?;
    check_len("order", order.len(), inst.kind.len())?;
    check_len("mode", mode.len(), inst.kind.len())?;
    let mut seen = vec![false; order.len()];
    for &k in &order {
        if k >= seen.len() || seen[k] {
            return Err(PyValueError::new_err("order: not a permutation of the ops"));
        }
        seen[k] = true;
    }
    check_modes(&inst, &mode)?;
    Ok(py.detach(|| {
        let st = phaze_sched::decode(&inst, &order, &mode);
        phaze_sched::justify(&inst, st, &mode, 4)
    }))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(best_list_schedule, m)?)?;
    m.add_function(wrap_pyfunction!(improve_schedule, m)?)?;
    m.add_function(wrap_pyfunction!(decode_justified, m)?)?;
    Ok(())
}
