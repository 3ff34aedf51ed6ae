use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(_core, MillstreamError, PyException);
create_exception!(_core, WindowError, MillstreamError);
create_exception!(_core, MemoryLimitError, WindowError);
create_exception!(_core, CommittedIndexError, WindowError);
create_exception!(_core, SchemaMismatchError, WindowError);

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("MillstreamError", py.get_type::<MillstreamError>())?;
    m.add("WindowError", py.get_type::<WindowError>())?;
    m.add("MemoryLimitError", py.get_type::<MemoryLimitError>())?;
    m.add("CommittedIndexError", py.get_type::<CommittedIndexError>())?;
    m.add("SchemaMismatchError", py.get_type::<SchemaMismatchError>())?;
    Ok(())
}
