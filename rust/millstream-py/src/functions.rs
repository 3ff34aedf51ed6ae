//! Module-level functions: stable hash partitioning and IPC decoding.

use std::panic::RefUnwindSafe;
use std::ptr::NonNull;
use std::sync::Arc;

use arrow_array::{ArrayRef, UInt64Array};
use arrow_buffer::Buffer;
use millstream_core::{ipc, partition};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3_arrow::{PyArray, PyRecordBatch};

use crate::errors::BindingResult;
use crate::gil::detached;

/// Reducer index (int32) of every row from the named key columns.
#[pyfunction]
pub fn hash_partition<'py>(
    py: Python<'py>,
    batch: PyRecordBatch,
    key_columns: Vec<String>,
    num_reducers: u32,
) -> BindingResult<Bound<'py, PyAny>> {
    let batch = batch.into_inner();
    let reducers = detached(py, || {
        let keys: Vec<&str> = key_columns.iter().map(String::as_str).collect();
        partition::partition(&batch, &keys, num_reducers)
    })??;
    to_pyarrow(py, Arc::new(reducers))
}

/// The 64-bit row hash (uint64) of the named key columns, before reduction to reducers.
#[pyfunction]
pub fn hash_keys<'py>(
    py: Python<'py>,
    batch: PyRecordBatch,
    key_columns: Vec<String>,
) -> BindingResult<Bound<'py, PyAny>> {
    let batch = batch.into_inner();
    let hashes = detached(py, || {
        let keys: Vec<&str> = key_columns.iter().map(String::as_str).collect();
        partition::hash_key_columns(&batch, &keys)
    })??;
    to_pyarrow(py, Arc::new(UInt64Array::from(hashes)))
}

/// Hands an array to pyarrow through the PyCapsule interface (no copy).
fn to_pyarrow(py: Python<'_>, array: ArrayRef) -> BindingResult<Bound<'_, PyAny>> {
    let array = PyArray::from_array_ref(array).into_pyobject(py)?;
    Ok(py
        .import(intern!(py, "pyarrow"))?
        .getattr(intern!(py, "array"))?
        .call1((array,))?)
}

/// Keeps a Python `bytes` object alive for as long as Arrow buffers view it.
struct PythonBytes {
    _bytes: PyBackedBytes,
}

// The bytes are immutable and only read through the Arrow buffer.
impl RefUnwindSafe for PythonBytes {}

fn zero_copy_buffer(bytes: PyBackedBytes) -> Buffer {
    let ptr = NonNull::from(&*bytes).cast::<u8>();
    let len = bytes.len();
    // SAFETY: `ptr..ptr + len` is the immutable content of the object the owner keeps alive.
    unsafe { Buffer::from_custom_allocation(ptr, len, Arc::new(PythonBytes { _bytes: bytes })) }
}

/// Decodes IPC stream payloads and concatenates their rows into one record batch.
#[pyfunction]
pub fn decode_ipc(py: Python<'_>, payloads: Vec<PyBackedBytes>) -> BindingResult<Bound<'_, PyAny>> {
    let batch = detached(py, || {
        ipc::decode_concat(payloads.into_iter().map(zero_copy_buffer))
    })??;
    Ok(PyRecordBatch::new(batch).into_pyarrow(py)?)
}
