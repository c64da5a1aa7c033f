//! The placement DP (`phaze-dp`) across the Python boundary: plain dicts and lists in and out,
//! the GIL released while solving. Only conversions live here.
//!
//! The input dicts are read into typed structs (`#[derive(FromPyObject)]`, one `#[pyo3(item)]`
//! field per key); unknown keys are rejected (a misspelt optional key would otherwise be
//! silently ignored). A missing key raises `KeyError`, a bad value `ValueError`, both naming
//! where it is (`problem.layers[3].fwd_s`): [`located`] restates the derive's error chain.

use phaze_dp::{
    Algorithm, Evaluation, Layer, NetLevel, Plan, Problem, Protocol, RankOrder, Recompute,
    Solution, Topology, Violation, Zero,
};
use pyo3::exceptions::{PyKeyError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyList};

// ---- scalars: strict about types; ranges are the core's (`Problem::validate`) ----------------

fn bad(what: &str, v: &Bound<'_, PyAny>) -> PyErr {
    let shown = v.repr().map(|r| r.to_string()).unwrap_or_else(|_| {
        v.get_type()
            .name()
            .map(|n| n.to_string())
            .unwrap_or_else(|_| "?".into())
    });
    PyValueError::new_err(format!("expected {what}, got {shown}"))
}

/// A real number (int or float; bool rejected).
struct Real(f64);

impl<'a, 'py> FromPyObject<'a, 'py> for Real {
    type Error = PyErr;
    fn extract(v: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        if v.is_instance_of::<PyBool>() {
            return Err(bad("a number", &v));
        }
        v.extract::<f64>()
            .map(Real)
            .map_err(|_| bad("a number", &v))
    }
}

/// A non-negative integer (bool and float rejected).
struct Count(u64);

impl<'a, 'py> FromPyObject<'a, 'py> for Count {
    type Error = PyErr;
    fn extract(v: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        const WHAT: &str = "a non-negative integer";
        if v.is_instance_of::<PyBool>() || v.is_instance_of::<PyFloat>() {
            return Err(bad(WHAT, &v));
        }
        v.extract::<u64>().map(Count).map_err(|_| bad(WHAT, &v))
    }
}

/// Bytes: a non-negative integer, or a finite non-negative float rounded up to a whole byte
/// (cost passes may compute sizes in floating point).
struct Bytes(u64);

impl<'a, 'py> FromPyObject<'a, 'py> for Bytes {
    type Error = PyErr;
    fn extract(v: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        const WHAT: &str = "a non-negative number of bytes";
        if v.is_instance_of::<PyBool>() {
            return Err(bad(WHAT, &v));
        }
        if !v.is_instance_of::<PyFloat>() {
            if let Ok(x) = v.extract::<u64>() {
                return Ok(Bytes(x));
            }
        }
        let x = v.extract::<f64>().map_err(|_| bad(WHAT, &v))?;
        // 2^64 as f64 is exact; anything at or above it does not fit a u64.
        if !(x.is_finite() && x >= 0.0 && x.ceil() < 18_446_744_073_709_551_616.0) {
            return Err(bad(WHAT, &v));
        }
        Ok(Bytes(x.ceil() as u64))
    }
}

/// A bool (an int is rejected).
struct Flag(bool);

impl<'a, 'py> FromPyObject<'a, 'py> for Flag {
    type Error = PyErr;
    fn extract(v: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        v.extract::<bool>().map(Flag).map_err(|_| bad("a bool", &v))
    }
}

/// A recompute setting: `"auto"` (None) or a policy's name; the words are the core's
/// ([`Recompute::setting`]).
struct RecomputeSetting(Option<Recompute>);

impl<'a, 'py> FromPyObject<'a, 'py> for RecomputeSetting {
    type Error = PyErr;
    fn extract(v: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let name: String = v
            .extract()
            .map_err(|_| bad("a string (auto, none, selective, full)", &v))?;
        Recompute::setting(&name)
            .map(RecomputeSetting)
            .map_err(|e| PyValueError::new_err(e.message))
    }
}

/// A ZeRO setting: `"auto"` (None) or `"0"`..`"3"`; the words are the core's ([`Zero::setting`]).
struct ZeroSetting(Option<Zero>);

impl<'a, 'py> FromPyObject<'a, 'py> for ZeroSetting {
    type Error = PyErr;
    fn extract(v: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let name: String = v
            .extract()
            .map_err(|_| bad("a string (auto, 0, 1, 2, 3)", &v))?;
        Zero::setting(&name)
            .map(ZeroSetting)
            .map_err(|e| PyValueError::new_err(e.message))
    }
}

/// A rank order as users write it (`auto`, `tp-dp-pp`, `tp-pp-dp`).
struct RankOrderSetting(Option<RankOrder>);

impl<'a, 'py> FromPyObject<'a, 'py> for RankOrderSetting {
    type Error = PyErr;
    fn extract(v: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let name: String = v
            .extract()
            .map_err(|_| bad("a string (auto, tp-dp-pp, tp-pp-dp)", &v))?;
        RankOrder::setting(&name)
            .map(RankOrderSetting)
            .map_err(|e| PyValueError::new_err(e.message))
    }
}

/// The blocks as `[first layer, count]`.
struct BlockRange((usize, usize));

impl<'a, 'py> FromPyObject<'a, 'py> for BlockRange {
    type Error = PyErr;
    fn extract(v: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        const WHAT: &str = "a list [first layer, count]";
        let pair = items::<Count>(&v, WHAT)?;
        match pair.as_slice() {
            [first, count] => Ok(BlockRange((
                usize::try_from(first.0).unwrap_or(usize::MAX),
                usize::try_from(count.0).unwrap_or(usize::MAX),
            ))),
            _ => Err(bad(WHAT, &v)),
        }
    }
}

// ---- containers ----------------------------------------------------------------------------

/// The message of an item's extraction error, restated by [`located`] as `[index]`.
const ITEM_ERROR: &str = "failed to extract item ";
/// The message pyo3's derive gives a field's extraction error (`Struct.field`), restated by
/// [`located`] as `.field`.
const FIELD_ERROR: &str = "failed to extract field ";

/// The items of a list, each extracted as `T`; an item's error names its index.
fn items<'py, T>(v: &Bound<'py, PyAny>, what: &str) -> PyResult<Vec<T>>
where
    T: for<'a> FromPyObject<'a, 'py, Error = PyErr>,
{
    let list = v
        .extract::<Vec<Bound<'py, PyAny>>>()
        .map_err(|_| bad(what, v))?;
    list.iter()
        .enumerate()
        .map(|(i, item)| {
            item.extract::<T>().map_err(|cause| {
                let err = PyTypeError::new_err(format!("{ITEM_ERROR}{i}"));
                err.set_cause(v.py(), Some(cause));
                err
            })
        })
        .collect()
}

/// A list of items.
struct Items<T>(Vec<T>);

impl<'a, 'py, T> FromPyObject<'a, 'py> for Items<T>
where
    T: for<'b> FromPyObject<'b, 'py, Error = PyErr>,
{
    type Error = PyErr;
    fn extract(v: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        items(&v, "a list").map(Items)
    }
}

/// One value per recompute policy: `[none, selective, full]`.
struct PerPolicy<T>([T; 3]);

impl<'a, 'py, T> FromPyObject<'a, 'py> for PerPolicy<T>
where
    T: for<'b> FromPyObject<'b, 'py, Error = PyErr>,
{
    type Error = PyErr;
    fn extract(v: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        const WHAT: &str = "a list of 3 values (none, selective, full)";
        let values = items::<T>(&v, WHAT)?;
        <[T; 3]>::try_from(values)
            .map(PerPolicy)
            .map_err(|_| bad(WHAT, &v))
    }
}

/// The keys a dict struct reads (every other key is rejected).
trait Keys {
    const KEYS: &'static [&'static str];
}

/// A dict with only `T::KEYS`, read as `T`.
struct Dict<T>(T);

impl<'a, 'py, T> FromPyObject<'a, 'py> for Dict<T>
where
    T: Keys + for<'b> FromPyObject<'b, 'py, Error = PyErr>,
{
    type Error = PyErr;
    fn extract(v: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let d = v.cast::<PyDict>().map_err(|_| bad("a dict", &v))?;
        for k in d.keys() {
            let key: String = k.extract().map_err(|_| bad("string keys", &k))?;
            if !T::KEYS.contains(&key.as_str()) {
                return Err(PyValueError::new_err(format!(
                    "unknown key '{key}' (expected keys: {})",
                    T::KEYS.join(", ")
                )));
            }
        }
        v.extract::<T>().map(Dict)
    }
}

/// An input error raised while reading the value at `path`, restated with the path of the
/// value it is about: a missing key as `KeyError("missing key 'k' in PATH")`, a bad value as
/// `ValueError("PATH: ...")`. The derive's and [`items`]' wrappers give the path's segments.
fn located(py: Python<'_>, err: PyErr, path: &str) -> PyErr {
    let mut path = path.to_string();
    let mut err = err;
    while err.is_instance_of::<PyTypeError>(py) {
        let message = err.value(py).to_string();
        let segment = if let Some(field) = message.strip_prefix(FIELD_ERROR) {
            format!(".{}", field.rsplit('.').next().unwrap_or(field))
        } else if let Some(index) = message.strip_prefix(ITEM_ERROR) {
            format!("[{index}]")
        } else {
            break;
        };
        let Some(cause) = err.cause(py) else { break };
        path.push_str(&segment);
        err = cause;
    }
    if err.is_instance_of::<PyKeyError>(py) {
        PyKeyError::new_err(format!("missing key {} in {path}", err.value(py)))
    } else if err.is_instance_of::<PyValueError>(py) || err.is_instance_of::<PyTypeError>(py) {
        PyValueError::new_err(format!("{path}: {}", err.value(py)))
    } else {
        err
    }
}

// ---- the input dicts (see `passes/algorithms/_phaze_rs.pyi`) -------------------------------

#[derive(FromPyObject)]
struct LayerInput {
    #[pyo3(item)]
    fwd_s: Real,
    #[pyo3(item)]
    bwd_s: Real,
    #[pyo3(item)]
    recompute_s: PerPolicy<Real>,
    #[pyo3(item, default)]
    opt_s: Option<Real>,
    #[pyo3(item, default)]
    expert_opt_s: Option<Real>,
    #[pyo3(item)]
    saved_bytes: PerPolicy<Bytes>,
    #[pyo3(item)]
    param_bytes: Bytes,
    #[pyo3(item)]
    grad_bytes: Bytes,
    #[pyo3(item)]
    optimizer_bytes: Bytes,
    #[pyo3(item)]
    workspace_bytes: Bytes,
    #[pyo3(item, default)]
    recompute_workspace_bytes: Option<Bytes>,
    #[pyo3(item)]
    boundary_bytes: Bytes,
    #[pyo3(item, default)]
    experts: Option<Count>,
    #[pyo3(item, default)]
    expert_param_bytes: Option<Bytes>,
    #[pyo3(item, default)]
    expert_grad_bytes: Option<Bytes>,
    #[pyo3(item, default)]
    expert_optimizer_bytes: Option<Bytes>,
    #[pyo3(item, default)]
    dispatch_bytes: Option<Bytes>,
}

impl Keys for LayerInput {
    const KEYS: &'static [&'static str] = &[
        "fwd_s",
        "bwd_s",
        "recompute_s",
        "opt_s",
        "expert_opt_s",
        "saved_bytes",
        "param_bytes",
        "grad_bytes",
        "optimizer_bytes",
        "workspace_bytes",
        "recompute_workspace_bytes",
        "boundary_bytes",
        "experts",
        "expert_param_bytes",
        "expert_grad_bytes",
        "expert_optimizer_bytes",
        "dispatch_bytes",
    ];
}

/// A topology's name: `"switch"`, `"torus"` or `"fat_tree"`.
struct TopologyName(String);

impl<'a, 'py> FromPyObject<'a, 'py> for TopologyName {
    type Error = PyErr;
    fn extract(v: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        const WHAT: &str = "a string (switch, torus, fat_tree)";
        let name: String = v.extract().map_err(|_| bad(WHAT, &v))?;
        if ["switch", "torus", "fat_tree"].contains(&name.as_str()) {
            Ok(TopologyName(name))
        } else {
            Err(bad(WHAT, &v))
        }
    }
}

struct AlgorithmName(Algorithm);

impl<'a, 'py> FromPyObject<'a, 'py> for AlgorithmName {
    type Error = PyErr;
    fn extract(v: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        const WHAT: &str = "a string (ring, nvls)";
        match v.extract::<String>().map_err(|_| bad(WHAT, &v))?.as_str() {
            "ring" => Ok(AlgorithmName(Algorithm::Ring)),
            "nvls" => Ok(AlgorithmName(Algorithm::Nvls)),
            _ => Err(bad(WHAT, &v)),
        }
    }
}

#[derive(FromPyObject)]
#[allow(non_snake_case)] // the keys are `*_Bps` (bytes, not bits, per second)
struct ProtocolInput {
    #[pyo3(item)]
    bandwidth_Bps: Real,
    #[pyo3(item)]
    latency_s: Real,
    #[pyo3(item, default)]
    base_s: Option<Real>,
    #[pyo3(item, default)]
    shard_Bps: Option<Real>,
    #[pyo3(item, default)]
    algorithm: Option<AlgorithmName>,
}

impl Keys for ProtocolInput {
    const KEYS: &'static [&'static str] = &[
        "bandwidth_Bps",
        "latency_s",
        "base_s",
        "shard_Bps",
        "algorithm",
    ];
}

#[derive(FromPyObject)]
#[allow(non_snake_case)] // the key is `bandwidth_Bps` (bytes, not bits, per second)
struct LevelInput {
    #[pyo3(item)]
    group_size: Count,
    #[pyo3(item)]
    bandwidth_Bps: Real,
    #[pyo3(item)]
    latency_s: Real,
    #[pyo3(item, default)]
    uplink_Bps: Option<Real>,
    #[pyo3(item, default)]
    topology: Option<TopologyName>,
    #[pyo3(item, default)]
    torus_dims: Option<Items<Count>>,
    #[pyo3(item, default)]
    leaf_size: Option<Count>,
    #[pyo3(item, default)]
    oversubscription: Option<Real>,
    #[pyo3(item, default)]
    protocols: Option<Items<Dict<ProtocolInput>>>,
    #[pyo3(item, default)]
    tree: Option<Flag>,
}

impl Keys for LevelInput {
    const KEYS: &'static [&'static str] = &[
        "group_size",
        "bandwidth_Bps",
        "latency_s",
        "uplink_Bps",
        "topology",
        "torus_dims",
        "leaf_size",
        "oversubscription",
        "protocols",
        "tree",
    ];
}

#[derive(FromPyObject)]
struct ProblemInput {
    #[pyo3(item)]
    layers: Items<Dict<LayerInput>>,
    #[pyo3(item)]
    devices: Count,
    #[pyo3(item)]
    hbm_bytes: Bytes,
    #[pyo3(item)]
    levels: Items<Dict<LevelInput>>,
    #[pyo3(item)]
    global_batch: Count,
    #[pyo3(item)]
    micro_batch: Count,
    #[pyo3(item)]
    tp: Count,
    #[pyo3(item)]
    dp_overlap: Flag,
    #[pyo3(item, default)]
    max_stages: Option<Count>,
    #[pyo3(item, default)]
    recompute: Option<RecomputeSetting>,
    #[pyo3(item, default)]
    zero: Option<ZeroSetting>,
    #[pyo3(item, default)]
    virtual_stages: Option<Count>,
    #[pyo3(item, default)]
    expert_parallel: Option<Count>,
    #[pyo3(item, default)]
    blocks: Option<BlockRange>,
    #[pyo3(item, default)]
    rank_order: Option<RankOrderSetting>,
    #[pyo3(item, default)]
    pipeline_split: Option<Flag>,
    #[pyo3(item, default)]
    grads_freed: Option<Flag>,
}

impl Keys for ProblemInput {
    const KEYS: &'static [&'static str] = &[
        "layers",
        "devices",
        "hbm_bytes",
        "levels",
        "global_batch",
        "micro_batch",
        "tp",
        "dp_overlap",
        "max_stages",
        "recompute",
        "zero",
        "virtual_stages",
        "blocks",
        "expert_parallel",
        "rank_order",
        "pipeline_split",
        "grads_freed",
    ];
}

impl From<LayerInput> for Layer {
    fn from(l: LayerInput) -> Layer {
        Layer {
            fwd_s: l.fwd_s.0,
            bwd_s: l.bwd_s.0,
            recompute_s: l.recompute_s.0.map(|x| x.0),
            opt_s: l.opt_s.map_or(0.0, |x| x.0),
            expert_opt_s: l.expert_opt_s.map_or(0.0, |x| x.0),
            saved_bytes: l.saved_bytes.0.map(|x| x.0),
            param_bytes: l.param_bytes.0,
            grad_bytes: l.grad_bytes.0,
            optimizer_bytes: l.optimizer_bytes.0,
            workspace_bytes: l.workspace_bytes.0,
            recompute_workspace_bytes: l.recompute_workspace_bytes.map_or(0, |b| b.0),
            boundary_bytes: l.boundary_bytes.0,
            experts: l.experts.map_or(0, |c| c.0),
            expert_param_bytes: l.expert_param_bytes.map_or(0, |b| b.0),
            expert_grad_bytes: l.expert_grad_bytes.map_or(0, |b| b.0),
            expert_optimizer_bytes: l.expert_optimizer_bytes.map_or(0, |b| b.0),
            dispatch_bytes: l.dispatch_bytes.map_or(0, |b| b.0),
        }
    }
}

impl From<LevelInput> for NetLevel {
    fn from(l: LevelInput) -> NetLevel {
        NetLevel {
            group_size: l.group_size.0,
            bandwidth_bps: l.bandwidth_Bps.0,
            latency_s: l.latency_s.0,
            uplink_bps: l.uplink_Bps.map(|x| x.0),
            // Missing keys of a topology become values `Problem::validate` rejects.
            topology: match l.topology.as_ref().map(|t| t.0.as_str()) {
                Some("torus") => Topology::Torus(
                    l.torus_dims
                        .map(|d| d.0.into_iter().map(|c| c.0).collect())
                        .unwrap_or_default(),
                ),
                Some("fat_tree") => Topology::FatTree {
                    leaf_size: l.leaf_size.map_or(0, |c| c.0),
                    oversubscription: l.oversubscription.map_or(0.0, |r| r.0),
                },
                _ => Topology::Switch,
            },
            protocols: l
                .protocols
                .map(|ps| {
                    ps.0.into_iter()
                        .map(|p| Protocol {
                            bandwidth_bps: p.0.bandwidth_Bps.0,
                            latency_s: p.0.latency_s.0,
                            base_s: p.0.base_s.map_or(0.0, |x| x.0),
                            shard_bps: p.0.shard_Bps.map(|x| x.0),
                            algorithm: p.0.algorithm.map_or(Algorithm::Ring, |a| a.0),
                        })
                        .collect()
                })
                .unwrap_or_default(),
            tree: l.tree.is_some_and(|f| f.0),
        }
    }
}

impl From<ProblemInput> for Problem {
    fn from(p: ProblemInput) -> Problem {
        Problem {
            layers: p.layers.0.into_iter().map(|d| d.0.into()).collect(),
            devices: p.devices.0,
            hbm_bytes: p.hbm_bytes.0,
            levels: p.levels.0.into_iter().map(|d| d.0.into()).collect(),
            global_batch: p.global_batch.0,
            micro_batch: p.micro_batch.0,
            tp: p.tp.0,
            dp_overlap: p.dp_overlap.0,
            max_stages: p
                .max_stages
                .map(|c| usize::try_from(c.0).unwrap_or(usize::MAX)),
            recompute: p.recompute.and_then(|r| r.0),
            zero: p.zero.and_then(|z| z.0),
            virtual_stages: p.virtual_stages.map(|c| c.0),
            blocks: p.blocks.map(|b| b.0),
            expert_parallel: p.expert_parallel.map(|c| c.0),
            rank_order: p.rank_order.and_then(|o| o.0),
            pipeline_split: p.pipeline_split.is_some_and(|f| f.0),
            grads_freed: p.grads_freed.is_some_and(|f| f.0),
        }
    }
}

/// A checked problem from its input; `path` names it in messages (`problem`, `problems[3]`).
fn validated(input: ProblemInput, path: &str) -> PyResult<Problem> {
    let prob = Problem::from(input);
    prob.validate()
        .map_err(|e| PyValueError::new_err(format!("{path}: {}", e.message)))?;
    Ok(prob)
}

/// Dict → validated `Problem`.
fn read_problem(v: &Bound<'_, PyAny>) -> PyResult<Problem> {
    let Dict(input) = v
        .extract::<Dict<ProblemInput>>()
        .map_err(|e| located(v.py(), e, "problem"))?;
    validated(input, "problem")
}

/// A list of problem dicts, each checked (an error names `problems[i]`).
fn read_problems(py: Python<'_>, problems: &Bound<'_, PyAny>) -> PyResult<Vec<Problem>> {
    let inputs = items::<Dict<ProblemInput>>(problems, "a list of problem dicts")
        .map_err(|e| located(py, e, "problems"))?;
    inputs
        .into_iter()
        .enumerate()
        .map(|(i, Dict(input))| validated(input, &format!("problems[{i}]")))
        .collect()
}

/// A fixed placement's pipeline and data-parallel degrees, each at least 1.
fn fixed_degrees(pp: i64, dp: i64) -> PyResult<(usize, u64)> {
    if pp < 1 || dp < 1 {
        return Err(PyValueError::new_err(format!(
            "pp and dp must be >= 1, got pp = {pp}, dp = {dp}"
        )));
    }
    Ok((usize::try_from(pp).unwrap_or(usize::MAX), dp as u64))
}

// ---- the answers ---------------------------------------------------------------------------

fn plan_dict<'py>(py: Python<'py>, p: &Plan) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("dp", p.dp)?;
    d.set_item("pp", p.pp)?;
    d.set_item("virtual_stages", p.virtual_stages)?;
    d.set_item("zero", p.zero.stage())?;
    d.set_item("expert_parallel", p.expert_parallel)?;
    d.set_item("rank_order", p.rank_order.name())?;
    d.set_item("tp", p.tp)?;
    d.set_item("micro_batch", p.micro_batch)?;
    d.set_item("num_micro_batches", p.num_micro_batches)?;
    d.set_item("global_batch", p.global_batch)?;
    d.set_item("time_per_batch_s", p.time_per_batch_s)?;
    d.set_item("throughput_samples_per_s", p.throughput_samples_per_s)?;
    d.set_item("devices_used", p.devices_used)?;
    d.set_item("max_stage_time_s", p.max_stage_time_s)?;
    d.set_item("max_exposed_dp_s", p.max_exposed_dp_s)?;
    d.set_item("max_optimizer_s", p.max_optimizer_s)?;
    d.set_item("max_memory_bytes", p.max_memory_bytes)?;
    let stages = PyList::empty(py);
    for s in &p.stages {
        let sd = PyDict::new(py);
        sd.set_item("rank", s.rank)?;
        sd.set_item("first_layer", s.first_layer)?;
        sd.set_item("last_layer", s.last_layer)?;
        sd.set_item("devices", s.devices)?;
        sd.set_item("time_s", s.time_s)?;
        let time = PyDict::new(py);
        time.set_item("compute_s", s.time_parts.compute_s)?;
        time.set_item("recompute_s", s.time_parts.recompute_s)?;
        time.set_item("pp_comm_s", s.time_parts.pp_comm_s)?;
        time.set_item("zero_comm_s", s.time_parts.zero_comm_s)?;
        time.set_item("ep_comm_s", s.time_parts.ep_comm_s)?;
        sd.set_item("time_parts", time)?;
        sd.set_item("memory_bytes", s.memory_bytes)?;
        let parts = PyDict::new(py);
        parts.set_item("params", s.memory.params)?;
        parts.set_item("grads", s.memory.grads)?;
        parts.set_item("optimizer", s.memory.optimizer)?;
        parts.set_item("activations", s.memory.activations)?;
        parts.set_item("workspace", s.memory.workspace)?;
        sd.set_item("memory", parts)?;
        sd.set_item("recompute", s.recompute.as_str())?;
        sd.set_item("in_flight", s.in_flight)?;
        sd.set_item("dp_comm_s", s.dp_comm_s)?;
        sd.set_item("exposed_dp_s", s.exposed_dp_s)?;
        sd.set_item("optimizer_s", s.optimizer_s)?;
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

// ---- the functions -------------------------------------------------------------------------

/// Optimal placement of one problem (see `passes/algorithms/_phaze_rs.pyi` for the dict layout).
#[pyfunction]
fn solve_placement<'py>(
    py: Python<'py>,
    problem: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyDict>> {
    let prob = read_problem(problem)?;
    let sol = py.detach(|| phaze_dp::solve(&prob));
    solution_dict(py, &sol)
}

/// Optimal placements of many problems, solved in parallel (rayon), in input order.
#[pyfunction]
fn solve_placement_batch<'py>(
    py: Python<'py>,
    problems: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyList>> {
    let probs = read_problems(py, problems)?;
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
    let prob = read_problem(problem)?;
    let (pp, dp) = fixed_degrees(pp, dp)?;
    let ev = py
        .detach(|| phaze_dp::evaluate_fixed(&prob, pp, dp))
        .map_err(|e| PyValueError::new_err(e.message))?;
    evaluation_dict(py, &ev)
}

/// `evaluate_placement` of one (pp, dp) over many problems, in parallel (rayon), in input order.
#[pyfunction]
fn evaluate_placement_batch<'py>(
    py: Python<'py>,
    problems: &Bound<'py, PyAny>,
    pp: i64,
    dp: i64,
) -> PyResult<Bound<'py, PyList>> {
    let probs = read_problems(py, problems)?;
    let (pp, dp) = fixed_degrees(pp, dp)?;
    let evs = py.detach(|| phaze_dp::evaluate_many(&probs, pp, dp));
    let out = PyList::empty(py);
    for ev in evs {
        let ev = ev.map_err(|e| PyValueError::new_err(e.message))?;
        out.append(evaluation_dict(py, &ev)?)?;
    }
    Ok(out)
}

/// Adds the placement functions to the extension module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(solve_placement, m)?)?;
    m.add_function(wrap_pyfunction!(solve_placement_batch, m)?)?;
    m.add_function(wrap_pyfunction!(evaluate_placement, m)?)?;
    m.add_function(wrap_pyfunction!(evaluate_placement_batch, m)?)?;
    Ok(())
}
