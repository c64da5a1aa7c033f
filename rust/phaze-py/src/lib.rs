//! Thin pyo3 boundary of phaze's Rust code.
//!
//! Only conversions live here: plain data in, plain data out. The algorithms live in their own
//! crates (plain Rust, `cargo test`ed without Python), and so do the forms of their data.
mod placement;
mod schedule;

#[pyo3::pymodule]
mod _phaze_rs {
    use pyo3::prelude::*;

    #[pymodule_export]
    use super::placement::{
        evaluate_placement, evaluate_placement_batch, solve_placement, solve_placement_batch,
    };
    #[pymodule_export]
    use super::schedule::{best_list_schedule, decode_justified, improve_schedule};

    /// The extension's version: Python checks that the `.so` it loaded is its package's.
    #[pyfunction]
    fn version() -> &'static str {
        env!("CARGO_PKG_VERSION")
    }
}
