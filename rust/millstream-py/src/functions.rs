//! Module-level functions: stable hash partitioning and IPC decoding.

use std::sync::Arc;

use std::panic::RefUnwindSafe;
use std::ptr::NonNull;

use arrow_array::{ArrayRef, UInt32Array, UInt64Array};
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

/// The canonical order of the rows (uint32 row numbers, sorted by key hash) and the
/// reducer index (int32) of every row in that order.
#[pyfunction]
pub fn hash_partition_ordered<'py>(
    py: Python<'py>,
    batch: PyRecordBatch,
    key_columns: Vec<String>,
    num_reducers: u32,
) -> BindingResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    let batch = batch.into_inner();
    let (order, reducers) = detached(py, || {
        let keys: Vec<&str> = key_columns.iter().map(String::as_str).collect();
        partition::partition_in_hash_order(&batch, &keys, num_reducers)
    })??;
    Ok((
        to_pyarrow(py, Arc::new(UInt32Array::from(order)))?,
        to_pyarrow(py, Arc::new(reducers))?,
    ))
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

/// Decodes GetRows payloads and concatenates their rows into one record batch
/// ([`ipc::decode_concat`], GIL released). The decoder reads the `bytes` objects in place and
/// the result reaches pyarrow through the C data interface: with one batch of rows its
/// arrays point into the payloads, otherwise into the one concatenation.
#[pyfunction]
pub fn decode_ipc<'py>(
    py: Python<'py>,
    payloads: Vec<PyBackedBytes>,
) -> BindingResult<Bound<'py, PyAny>> {
    let buffers: Vec<Buffer> = payloads.into_iter().map(buffer_of).collect();
    let batch = detached(py, || ipc::decode_concat(buffers))??;
    Ok(PyRecordBatch::new(batch).into_pyarrow(py)?)
}

/// The owner of a payload's memory inside an Arrow buffer.
struct Payload {
    _bytes: PyBackedBytes,
}

// Its bytes are immutable, so a panic cannot leave them half-changed.
impl RefUnwindSafe for Payload {}

/// An Arrow buffer over a Python `bytes` object's data, which it keeps alive (no copy).
fn buffer_of(bytes: PyBackedBytes) -> Buffer {
    let ptr = NonNull::from(&*bytes).cast::<u8>();
    let len = bytes.len();
    // SAFETY: `ptr..ptr + len` is the immutable data of `bytes`, valid while `bytes` lives;
    // the buffer owns `bytes` and drops it only after its last reference.
    unsafe { Buffer::from_custom_allocation(ptr, len, Arc::new(Payload { _bytes: bytes })) }
}
