//! Thin pyo3 boundary of phaze's Rust code.
//!
//! Only conversions live here: plain data in, plain data out. The algorithms
//! live in their own crates (plain Rust, `cargo test`ed without Python).
use pyo3::prelude::*;
mod placement;
mod schedule;

/// Version of the Rust extension; lets Python check that the `.so` it loaded
/// matches the package it came with.
#[pyfunction]
fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

#[pymodule]
fn _phaze_rs(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(version, m)?)?;
    placement::register(m)?;
    schedule::register(m)?;
    Ok(())
}
