//! The one way binding code runs work without the GIL.

use pyo3::marker::Ungil;
use pyo3::prelude::*;

/// Runs `f` with the GIL released, then lets Python handle pending signals (so Ctrl-C
/// interrupts a long wait in the main thread; elsewhere this is a no-op).
pub fn detached<T, F>(py: Python<'_>, f: F) -> PyResult<T>
where
    F: Ungil + FnOnce() -> T,
    T: Ungil,
{
    let out = py.detach(f);
    py.check_signals()?;
    Ok(out)
}
