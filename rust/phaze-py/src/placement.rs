//! The placement DP (`phaze-dp`) across the Python boundary: plain dicts and lists in and out,
//! the GIL released while solving. Only conversions and key checking live here.
//!
//! Unknown keys are rejected (a misspelt optional key would otherwise be silently ignored);
//! a missing key raises `KeyError`, a bad value `ValueError`, both naming the key.

use phaze_dp::{Evaluation, Layer, NetLevel, Plan, Problem, Solution, Violation};
use pyo3::exceptions::{PyKeyError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyList};

const PROBLEM_KEYS: &[&str] = &[
    "layers",
    "devices",
    "hbm_bytes",
    "levels",
    "global_batch",
    "micro_batch",
    "tp",
    "dp_overlap",
    "max_stages",
];
const LAYER_KEYS: &[&str] = &[
    "fwd_s",
    "bwd_s",
    "recompute_s",
    "saved_bytes",
    "param_bytes",
    "grad_bytes",
    "optimizer_bytes",
    "workspace_bytes",
    "boundary_bytes",
    "tp_fwd_bytes",
    "tp_bwd_bytes",
    "tp_fwd_count",
    "tp_bwd_count",
];
const LEVEL_KEYS: &[&str] = &["group_size", "bandwidth_Bps", "latency_s"];

fn type_name(v: &Bound<'_, PyAny>) -> String {
    v.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// Where a value sits in the input (`problem.layers[3].recompute_s[1]`), formatted only when
/// an error names it: parsing a large problem must not allocate a string per value.
#[derive(Clone, Copy)]
struct Name<'a> {
    ctx: &'a str,
    key: &'a str,
    index: Option<usize>,
}

impl<'a> Name<'a> {
    fn of(ctx: &'a str, key: &'a str) -> Self {
        Name {
            ctx,
            key,
            index: None,
        }
    }
    fn at(self, index: usize) -> Self {
        Name {
            index: Some(index),
            ..self
        }
    }
}

impl std::fmt::Display for Name<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.ctx)?;
        if !self.key.is_empty() {
            write!(f, ".{}", self.key)?;
        }
        if let Some(i) = self.index {
            write!(f, "[{i}]")?;
        }
        Ok(())
    }
}

fn bad(name: impl std::fmt::Display, what: &str, v: &Bound<'_, PyAny>) -> PyErr {
    let shown = v
        .repr()
        .map(|r| r.to_string())
        .unwrap_or_else(|_| type_name(v));
    PyValueError::new_err(format!("{name}: expected {what}, got {shown}"))
}

/// A dict with only `allowed` string keys.
fn as_dict<'a, 'py>(
    v: &'a Bound<'py, PyAny>,
    name: &str,
    allowed: &[&str],
) -> PyResult<&'a Bound<'py, PyDict>> {
    let d = v.cast::<PyDict>().map_err(|_| bad(name, "a dict", v))?;
    for k in d.keys() {
        let ks: String = k.extract().map_err(|_| bad(name, "string keys", &k))?;
        if !allowed.contains(&ks.as_str()) {
            return Err(PyValueError::new_err(format!(
                "{name}: unknown key '{ks}' (expected keys: {})",
                allowed.join(", ")
            )));
        }
    }
    Ok(d)
}

fn req<'py>(d: &Bound<'py, PyDict>, key: &str, name: &str) -> PyResult<Bound<'py, PyAny>> {
    d.get_item(key)?
        .ok_or_else(|| PyKeyError::new_err(format!("missing key '{key}' in {name}")))
}

/// A real number (int or float; bool rejected). Range checks are the core's (`validate`).
fn as_f64(v: &Bound<'_, PyAny>, name: Name) -> PyResult<f64> {
    if v.is_instance_of::<PyBool>() {
        return Err(bad(name, "a number", v));
    }
    v.extract::<f64>().map_err(|_| bad(name, "a number", v))
}

/// A non-negative integer (bool and float rejected).
fn as_uint(v: &Bound<'_, PyAny>, name: Name) -> PyResult<u64> {
    if v.is_instance_of::<PyBool>() || v.is_instance_of::<PyFloat>() {
        return Err(bad(name, "a non-negative integer", v));
    }
    v.extract::<u64>()
        .map_err(|_| bad(name, "a non-negative integer", v))
}

/// Bytes: a non-negative integer, or a finite non-negative float rounded up to a whole byte
/// (cost passes may compute sizes in floating point).
fn as_bytes(v: &Bound<'_, PyAny>, name: Name) -> PyResult<u64> {
    const WHAT: &str = "a non-negative number of bytes";
    if v.is_instance_of::<PyBool>() {
        return Err(bad(name, WHAT, v));
    }
    if !v.is_instance_of::<PyFloat>() {
        if let Ok(x) = v.extract::<u64>() {
            return Ok(x);
        }
    }
    let x = v.extract::<f64>().map_err(|_| bad(name, WHAT, v))?;
    // 2^64 as f64 is exact; anything at or above it does not fit a u64.
    if !(x.is_finite() && x >= 0.0 && x.ceil() < 18_446_744_073_709_551_616.0) {
        return Err(bad(name, WHAT, v));
    }
    Ok(x.ceil() as u64)
}

fn as_list<'py>(
    v: &Bound<'py, PyAny>,
    name: impl std::fmt::Display,
    what: &str,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    v.extract::<Vec<Bound<'py, PyAny>>>()
        .map_err(|_| bad(name, what, v))
}

fn as_triple<T: Copy + Default>(
    v: &Bound<'_, PyAny>,
    name: Name,
    one: fn(&Bound<'_, PyAny>, Name) -> PyResult<T>,
) -> PyResult<[T; 3]> {
    let items = as_list(v, name, "a list of 3 values (none, selective, full)")?;
    if items.len() != 3 {
        return Err(bad(name, "a list of 3 values (none, selective, full)", v));
    }
    let mut out = [T::default(); 3];
    for (r, item) in items.iter().enumerate() {
        out[r] = one(item, name.at(r))?;
    }
    Ok(out)
}

fn parse_layer(v: &Bound<'_, PyAny>, name: &str) -> PyResult<Layer> {
    let d = as_dict(v, name, LAYER_KEYS)?;
    let f = |k: &str| as_f64(&req(d, k, name)?, Name::of(name, k));
    let b = |k: &str| as_bytes(&req(d, k, name)?, Name::of(name, k));
    let u = |k: &str| as_uint(&req(d, k, name)?, Name::of(name, k));
    Ok(Layer {
        fwd_s: f("fwd_s")?,
        bwd_s: f("bwd_s")?,
        recompute_s: as_triple(
            &req(d, "recompute_s", name)?,
            Name::of(name, "recompute_s"),
            as_f64,
        )?,
        saved_bytes: as_triple(
            &req(d, "saved_bytes", name)?,
            Name::of(name, "saved_bytes"),
            as_bytes,
        )?,
        param_bytes: b("param_bytes")?,
        grad_bytes: b("grad_bytes")?,
        optimizer_bytes: b("optimizer_bytes")?,
        workspace_bytes: b("workspace_bytes")?,
        boundary_bytes: b("boundary_bytes")?,
        tp_fwd_bytes: b("tp_fwd_bytes")?,
        tp_bwd_bytes: b("tp_bwd_bytes")?,
        tp_fwd_count: u("tp_fwd_count")?,
        tp_bwd_count: u("tp_bwd_count")?,
    })
}

fn parse_level(v: &Bound<'_, PyAny>, name: &str) -> PyResult<NetLevel> {
    let d = as_dict(v, name, LEVEL_KEYS)?;
    Ok(NetLevel {
        group_size: as_uint(&req(d, "group_size", name)?, Name::of(name, "group_size"))?,
        bandwidth_bps: as_f64(
            &req(d, "bandwidth_Bps", name)?,
            Name::of(name, "bandwidth_Bps"),
        )?,
        latency_s: as_f64(&req(d, "latency_s", name)?, Name::of(name, "latency_s"))?,
    })
}

/// Dict → validated `Problem`. `name` prefixes messages (`problem`, `problems[3]`).
fn parse_problem(v: &Bound<'_, PyAny>, name: &str) -> PyResult<Problem> {
    let d = as_dict(v, name, PROBLEM_KEYS)?;
    let layers = as_list(
        &req(d, "layers", name)?,
        Name::of(name, "layers"),
        "a list of layer dicts",
    )?
    .iter()
    .enumerate()
    .map(|(i, l)| parse_layer(l, &format!("{name}.layers[{i}]")))
    .collect::<PyResult<Vec<_>>>()?;
    let levels = as_list(
        &req(d, "levels", name)?,
        Name::of(name, "levels"),
        "a list of level dicts",
    )?
    .iter()
    .enumerate()
    .map(|(i, l)| parse_level(l, &format!("{name}.levels[{i}]")))
    .collect::<PyResult<Vec<_>>>()?;
    let u = |k: &str| as_uint(&req(d, k, name)?, Name::of(name, k));
    let dp_overlap = req(d, "dp_overlap", name)?;
    let max_stages = match d.get_item("max_stages")? {
        Some(v) if !v.is_none() => {
            let ms = as_uint(&v, Name::of(name, "max_stages"))?;
            Some(usize::try_from(ms).unwrap_or(usize::MAX))
        }
        _ => None,
    };
    let prob = Problem {
        layers,
        devices: u("devices")?,
        hbm_bytes: as_bytes(&req(d, "hbm_bytes", name)?, Name::of(name, "hbm_bytes"))?,
        levels,
        global_batch: u("global_batch")?,
        micro_batch: u("micro_batch")?,
        tp: u("tp")?,
        dp_overlap: dp_overlap
            .extract::<bool>()
            .map_err(|_| bad(Name::of(name, "dp_overlap"), "a bool", &dp_overlap))?,
        max_stages,
    };
    prob.validate()
        .map_err(|e| PyValueError::new_err(format!("{name}: {}", e.message)))?;
    Ok(prob)
}

fn plan_dict<'py>(py: Python<'py>, p: &Plan) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("dp", p.dp)?;
    d.set_item("pp", p.pp)?;
    d.set_item("tp", p.tp)?;
    d.set_item("micro_batch", p.micro_batch)?;
    d.set_item("num_micro_batches", p.num_micro_batches)?;
    d.set_item("global_batch", p.global_batch)?;
    d.set_item("time_per_batch_s", p.time_per_batch_s)?;
    d.set_item("throughput_samples_per_s", p.throughput_samples_per_s)?;
    d.set_item("devices_used", p.devices_used)?;
    d.set_item("max_stage_time_s", p.max_stage_time_s)?;
    d.set_item("max_exposed_dp_s", p.max_exposed_dp_s)?;
    d.set_item("max_memory_bytes", p.max_memory_bytes)?;
    let stages = PyList::empty(py);
    for s in &p.stages {
        let sd = PyDict::new(py);
        sd.set_item("first_layer", s.first_layer)?;
        sd.set_item("last_layer", s.last_layer)?;
        sd.set_item("devices", s.devices)?;
        sd.set_item("time_s", s.time_s)?;
        sd.set_item("memory_bytes", s.memory_bytes)?;
        sd.set_item("recompute", s.recompute.as_str())?;
        sd.set_item("in_flight", s.in_flight)?;
        sd.set_item("dp_allreduce_s", s.dp_allreduce_s)?;
        sd.set_item("exposed_dp_s", s.exposed_dp_s)?;
        stages.append(sd)?;
    }
    d.set_item("stages", stages)?;
    Ok(d)
}

fn violations_list<'py>(py: Python<'py>, vs: &[Violation]) -> PyResult<Bound<'py, PyList>> {
    let out = PyList::empty(py);
    for v in vs {
        let d = PyDict::new(py);
        d.set_item("kind", v.kind.as_str())?;
        d.set_item("message", &v.message)?;
        d.set_item("needed_bytes", v.needed_bytes)?;
        d.set_item("dp", v.dp)?;
        d.set_item("pp", v.pp)?;
        out.append(d)?;
    }
    Ok(out)
}

fn result_dict<'py>(
    py: Python<'py>,
    feasible: bool,
    plan: Option<&Plan>,
    violations: &[Violation],
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("feasible", feasible)?;
    match plan {
        Some(p) => d.set_item("plan", plan_dict(py, p)?)?,
        None => d.set_item("plan", py.None())?,
    }
    d.set_item("violations", violations_list(py, violations)?)?;
    Ok(d)
}

fn solution_dict<'py>(py: Python<'py>, s: &Solution) -> PyResult<Bound<'py, PyDict>> {
    match s {
        Solution::Feasible(p) => result_dict(py, true, Some(p), &[]),
        Solution::Infeasible(v) => result_dict(py, false, None, std::slice::from_ref(v)),
    }
}

fn evaluation_dict<'py>(py: Python<'py>, e: &Evaluation) -> PyResult<Bound<'py, PyDict>> {
    result_dict(py, e.feasible, e.plan.as_ref(), &e.violations)
}

/// Optimal placement of one problem (see `passes/algorithms/_phaze_rs.pyi` for the dict layout).
#[pyfunction]
fn solve_placement<'py>(
    py: Python<'py>,
    problem: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyDict>> {
    let prob = parse_problem(problem, "problem")?;
    let sol = py.detach(|| phaze_dp::solve(&prob));
    solution_dict(py, &sol)
}

/// Optimal placements of many problems, solved in parallel (rayon), in input order.
#[pyfunction]
fn solve_placement_batch<'py>(
    py: Python<'py>,
    problems: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyList>> {
    let probs = as_list(problems, "problems", "a list of problem dicts")?
        .iter()
        .enumerate()
        .map(|(i, p)| parse_problem(p, &format!("problems[{i}]")))
        .collect::<PyResult<Vec<_>>>()?;
    let sols = py.detach(|| phaze_dp::solve_many(&probs));
    let out = PyList::empty(py);
    for s in &sols {
        out.append(solution_dict(py, s)?)?;
    }
    Ok(out)
}

/// A fixed (pp, dp): best split and policies, every violated constraint, and its numbers.
#[pyfunction]
fn evaluate_placement<'py>(
    py: Python<'py>,
    problem: &Bound<'py, PyAny>,
    pp: i64,
    dp: i64,
) -> PyResult<Bound<'py, PyDict>> {
    let prob = parse_problem(problem, "problem")?;
    if pp < 1 || dp < 1 {
        return Err(PyValueError::new_err(format!(
            "pp and dp must be >= 1, got pp = {pp}, dp = {dp}"
        )));
    }
    let (pp, dp) = (usize::try_from(pp).unwrap_or(usize::MAX), dp as u64);
    let ev = py
        .detach(|| phaze_dp::evaluate_fixed(&prob, pp, dp))
        .map_err(|e| PyValueError::new_err(e.message))?;
    evaluation_dict(py, &ev)
}

/// Adds the placement functions to the extension module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(solve_placement, m)?)?;
    m.add_function(wrap_pyfunction!(solve_placement_batch, m)?)?;
    m.add_function(wrap_pyfunction!(evaluate_placement, m)?)?;
    Ok(())
}
