//! Thin PyO3 bindings of millstream-core, compiled into `millstream._core`. Arrow data
//! crosses the boundary through the Arrow PyCapsule interface (pyo3-arrow) without copies.

use pyo3::prelude::*;

mod errors;
mod fdb_batch;
mod functions;
mod gil;
mod kafka;
mod window;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    m.add("__build_profile__", profile)?;
    m.add(
        "SHUFFLE_INDEX_COLUMN",
        millstream_core::SHUFFLE_INDEX_COLUMN,
    )?;
    errors::register(m)?;
    m.add_class::<window::PyWindow>()?;
    m.add_class::<window::PyWindowSnapshot>()?;
    m.add_class::<fdb_batch::PyFdbBatch>()?;
    m.add_class::<kafka::PyKafkaPartitionReader>()?;
    m.add_function(wrap_pyfunction!(functions::hash_partition, m)?)?;
    m.add_function(wrap_pyfunction!(functions::hash_partition_ordered, m)?)?;
    m.add_function(wrap_pyfunction!(functions::hash_keys, m)?)?;
    m.add_function(wrap_pyfunction!(functions::decode_ipc, m)?)?;
    if cfg!(debug_assertions) {
        let warnings = py.import("warnings")?;
        warnings.call_method1(
            "warn",
            (
                "millstream._core is a debug build: it is many times slower than a release \
                 build; do not benchmark it (build with `maturin develop --release`)",
                py.get_type::<pyo3::exceptions::PyRuntimeWarning>(),
            ),
        )?;
    }
    Ok(())
}
