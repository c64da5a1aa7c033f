//! The scheduling warm start (`phaze-sched`) across the Python boundary: an instance as plain
//! lists, a schedule back as `(start, mode, makespan)`; the GIL released while it runs.
//!
//! An instance is `(kind, caps, modes, preds)`: the unit kind of each op (an index into
//! `caps`), the cores of each kind, each op's `[(duration_s, cores_held), ...]` (one core first,
//! split second) and its predecessors (ops in topological order). pyo3 converts the lists; the
//! core checks them (a bad index would otherwise panic in the search) and names what is wrong.

use phaze_sched::{Instance, Schedule};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

type Modes = Vec<Vec<(f64, i64)>>;
type Found = (Vec<f64>, Vec<usize>, f64);

/// The best list schedule of the portfolio (priority rule × mode rule), justified.
#[pyfunction]
pub fn best_list_schedule(
    py: Python<'_>,
    kind: Vec<usize>,
    caps: Vec<i64>,
    modes: Modes,
    preds: Vec<Vec<usize>>,
) -> PyResult<Found> {
    let inst = Instance::new(kind, caps, modes, preds).map_err(PyValueError::new_err)?;
    let s = py.detach(|| phaze_sched::best_list(&inst));
    Ok((s.start, s.mode, s.makespan))
}

/// The seeded local search from a schedule: `iterations` decodes; the best schedule found
/// (never worse).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn improve_schedule(
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
) -> PyResult<Found> {
    let inst = Instance::new(kind, caps, modes, preds).map_err(PyValueError::new_err)?;
    let init = Schedule {
        start,
        mode,
        makespan,
    };
    inst.check_schedule(&init).map_err(PyValueError::new_err)?;
    let s = py.detach(|| phaze_sched::improve(&inst, init, iterations, seed));
    Ok((s.start, s.mode, s.makespan))
}

/// An op list (precedence-feasible) decoded with fixed modes, then justified:
/// `(start, makespan)`.
#[pyfunction]
pub fn decode_justified(
    py: Python<'_>,
    kind: Vec<usize>,
    caps: Vec<i64>,
    modes: Modes,
    preds: Vec<Vec<usize>>,
    order: Vec<usize>,
    mode: Vec<usize>,
) -> PyResult<(Vec<f64>, f64)> {
    let inst = Instance::new(kind, caps, modes, preds).map_err(PyValueError::new_err)?;
    inst.check_order(&order).map_err(PyValueError::new_err)?;
    inst.check_mode(&mode).map_err(PyValueError::new_err)?;
    Ok(py.detach(|| {
        let start = phaze_sched::decode(&inst, &order, &mode);
        phaze_sched::justify(&inst, start, &mode, 4)
    }))
}
