//! The placement DP (`phaze-dp`) across the Python boundary, the GIL released while solving.
//!
//! The core's types declare their dict forms (serde; `passes/algorithms/_phaze_rs.pyi`): a
//! problem is read through [`Value`], a result written by pythonize. Not read by pythonize:
//! its reader converts (any object to a bool by its truth, `True` to an int), so a wrong type
//! would pass; [`Value`] gives each Python type one serde type, and the core's types refuse
//! what they do not declare. serde_path_to_error names where (`problem.layers[3].fwd_s`).

use phaze_dp::{Evaluation, Problem};
use pyo3::exceptions::{PyKeyError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple, PyType};
use pythonize::pythonize;
use serde::de::value::{Error, MapDeserializer, SeqDeserializer};
use serde::de::{DeserializeOwned, Deserializer, Error as _, IntoDeserializer, Visitor};

type Obj<'py> = Bound<'py, PyAny>;
/// What a read through [`Value`] gives (serde's plain error; serde_path_to_error adds where).
type Read<T> = Result<T, Error>;

/// A Python value as serde sees it: None, a bool, an int, a float, a str, a dict with str
/// keys or a dataclass instance (a map: [`map_items`]), a list or a tuple; another object as
/// an int if it has `__index__`, else as a float if it has `__float__` (numpy's scalars).
struct Value<'py>(Obj<'py>);

/// A dict's items, or a dataclass instance's fields by attribute but those that are None (the
/// Rust default): the hardware description's levels read as they are. None if `o` is neither.
fn map_items<'py>(o: &Obj<'py>) -> PyResult<Option<Vec<(String, Value<'py>)>>> {
    if let Ok(d) = o.cast::<PyDict>() {
        let item = |(k, x): (Obj<'py>, Obj<'py>)| Ok((k.extract::<String>()?, Value(x)));
        return d.iter().map(item).collect::<PyResult<_>>().map(Some);
    } else if o.is_instance_of::<PyType>() || !o.hasattr("__dataclass_fields__")? {
        return Ok(None);
    }
    let fields = o.py().import("dataclasses")?.call_method1("fields", (o,))?;
    let mut items = Vec::new();
    for field in fields.try_iter()? {
        let name: String = field?.getattr("name")?.extract()?;
        let x = o.getattr(&name)?;
        if !x.is_none() {
            items.push((name, Value(x)));
        }
    }
    Ok(Some(items))
}

impl IntoDeserializer<'_, Error> for Value<'_> {
    type Deserializer = Self;
    fn into_deserializer(self) -> Self {
        self
    }
}

impl<'de> Deserializer<'de> for Value<'_> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, v: V) -> Read<V::Value> {
        let o = self.0;
        if o.is_none() {
            v.visit_unit()
        } else if let Ok(b) = o.cast::<PyBool>() {
            v.visit_bool(b.is_true())
        } else if let Ok(x) = o.cast::<PyFloat>() {
            v.visit_f64(x.value())
        } else if let Ok(s) = o.cast::<PyString>() {
            v.visit_str(&s.to_cow().map_err(Error::custom)?)
        } else if o.is_instance_of::<PyList>() || o.is_instance_of::<PyTuple>() {
            let items = o.try_iter().and_then(|i| i.collect::<PyResult<Vec<_>>>());
            let items = items.map_err(Error::custom)?.into_iter().map(Value);
            SeqDeserializer::new(items).deserialize_any(v)
        } else if let Ok(x) = o.extract::<u64>() {
            v.visit_u64(x)
        } else if let Ok(x) = o.extract::<i64>() {
            v.visit_i64(x)
        } else if o.is_instance_of::<PyInt>() {
            Err(Error::custom(format!("{o} does not fit 64 bits")))
        } else if let Some(items) = map_items(&o).map_err(Error::custom)? {
            MapDeserializer::new(items.into_iter()).deserialize_any(v)
        } else {
            let x = o.extract::<f64>();
            v.visit_f64(x.map_err(|_| Error::custom(format!("unsupported {}", o.get_type())))?)
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, v: V) -> Read<V::Value> {
        match self.0.is_none() {
            true => v.visit_none(),
            false => v.visit_some(self),
        }
    }

    /// A struct only from a dict or a dataclass (serde would also read a list as its fields).
    fn deserialize_struct<V: Visitor<'de>>(self, _: &str, _: &[&str], v: V) -> Read<V::Value> {
        match map_items(&self.0).map_err(Error::custom)? {
            Some(items) => MapDeserializer::new(items.into_iter()).deserialize_any(v),
            None => Err(Error::custom(format!("expected a dict, got {:?}", self.0))),
        }
    }

    /// A unit variant is its word.
    fn deserialize_enum<V: Visitor<'de>>(self, _: &str, _: &[&str], v: V) -> Read<V::Value> {
        match self.0.cast::<PyString>() {
            Ok(s) => v.visit_enum(s.to_string().into_deserializer()),
            Err(_) => self.deserialize_any(v),
        }
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf unit
        unit_struct newtype_struct seq tuple tuple_struct map identifier ignored_any
    }
}

/// `obj` read as a `T`; a missing key raises `KeyError` (serde's words: "missing field"), a
/// bad value `ValueError`, each naming where from `root`.
fn read<T: DeserializeOwned>(obj: &Obj<'_>, root: &str) -> PyResult<T> {
    serde_path_to_error::deserialize(Value(obj.clone())).map_err(|e| {
        let message = match e.path().to_string() {
            p if p == "." => format!("{root}: {}", e.inner()),
            p if p.starts_with('[') => format!("{root}{p}: {}", e.inner()),
            p => format!("{root}.{p}: {}", e.inner()),
        };
        match e.inner().to_string().starts_with("missing field") {
            true => PyKeyError::new_err(message),
            false => PyValueError::new_err(message),
        }
    })
}

/// `p` if [`Problem::validate`] accepts it; `at` names it.
fn valid(p: Problem, at: &str) -> PyResult<Problem> {
    let checked = p.validate().map_err(|e| format!("{at}: {e}"));
    checked.map_err(PyValueError::new_err).map(|()| p)
}

fn read_problems(obj: &Obj<'_>) -> PyResult<Vec<Problem>> {
    let problems: Vec<Problem> = read(obj, "problems")?;
    let valid_at = |(i, p): (usize, Problem)| valid(p, &format!("problems[{i}]"));
    problems.into_iter().enumerate().map(valid_at).collect()
}

/// A fixed placement's pipeline and data-parallel degrees, each at least 1.
fn degrees(pp: i64, dp: i64) -> PyResult<(usize, u64)> {
    let said = format!("pp and dp must be >= 1, got pp = {pp}, dp = {dp}");
    match (usize::try_from(pp), u64::try_from(dp)) {
        (Ok(p @ 1..), Ok(d @ 1..)) => Ok((p, d)),
        _ => Err(PyValueError::new_err(said)),
    }
}

/// Optimal placement of one problem: a `ResultDict` (`Evaluation`'s serde form, which a
/// `Solution` converts to; see `passes/algorithms/_phaze_rs.pyi` for the dict layouts).
#[pyfunction]
pub fn solve_placement<'py>(py: Python<'py>, problem: &Obj<'py>) -> PyResult<Obj<'py>> {
    let prob = valid(read(problem, "problem")?, "problem")?;
    let sol = py.detach(|| phaze_dp::solve(&prob));
    Ok(pythonize(py, &Evaluation::from(sol))?)
}

/// Optimal placements of many problems, solved in parallel (rayon), in input order.
#[pyfunction]
pub fn solve_placement_batch<'py>(py: Python<'py>, problems: &Obj<'py>) -> PyResult<Obj<'py>> {
    let probs = read_problems(problems)?;
    let sols = py.detach(|| phaze_dp::solve_many(&probs));
    let evs: Vec<Evaluation> = sols.into_iter().map(Evaluation::from).collect();
    Ok(pythonize(py, &evs)?)
}

/// A fixed (pp, dp): best split and policies, every violated constraint, and its numbers.
#[pyfunction]
pub fn evaluate_placement<'py>(
    py: Python<'py>,
    problem: &Obj<'py>,
    pp: i64,
    dp: i64,
) -> PyResult<Obj<'py>> {
    let prob = valid(read(problem, "problem")?, "problem")?;
    let (pp, dp) = degrees(pp, dp)?;
    let ev = py.detach(|| phaze_dp::evaluate_fixed(&prob, pp, dp));
    let ev = ev.map_err(|e| PyValueError::new_err(e.message))?;
    Ok(pythonize(py, &ev)?)
}

/// `evaluate_placement` of one (pp, dp) over many problems, in parallel (rayon), in input order.
#[pyfunction]
pub fn evaluate_placement_batch<'py>(
    py: Python<'py>,
    problems: &Obj<'py>,
    pp: i64,
    dp: i64,
) -> PyResult<Obj<'py>> {
    let probs = read_problems(problems)?;
    let (pp, dp) = degrees(pp, dp)?;
    let evs = py.detach(|| phaze_dp::evaluate_many(&probs, pp, dp));
    let evs = evs.into_iter().collect::<Result<Vec<_>, _>>();
    let evs = evs.map_err(|e| PyValueError::new_err(e.message))?;
    Ok(pythonize(py, &evs)?)
}
