//! `FdbBatch`: FoundationDB's batch operations ([`millstream_core::fdb_batch`]) for the
//! FoundationDB backend, run with the GIL released. Keys arrive as Arrow binary arrays,
//! deltas as contiguous little-endian int64s; a FoundationDB error comes back as the
//! binding's own `fdb.FDBError`, so the backend translates it as it translates the
//! binding's.

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef};
use arrow_schema::DataType;
use millstream_core::fdb_batch::{FdbAddresses, FdbFunctions, FdbTransaction, RawTransaction};
use millstream_core::Error;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::{PyBytes, PyList};
use pyo3_arrow::PyArray;

use crate::errors::BindingError;
use crate::gil::detached;

/// The batch operations on the transactions of one loaded `libfdb_c`.
#[pyclass(frozen, name = "FdbBatch", module = "millstream._core")]
pub struct PyFdbBatch {
    functions: FdbFunctions,
    error: Py<PyAny>,
}

impl PyFdbBatch {
    /// `transaction` as a transaction to issue calls on.
    fn transaction(&self, transaction: usize) -> PyResult<FdbTransaction> {
        if transaction == 0 {
            return Err(BindingError::from(Error::InvalidArgument(
                "the transaction pointer is null; pass a live fdb.Transaction's tpointer"
                    .to_string(),
            ))
            .into());
        }
        // SAFETY: the caller passes a live transaction of this library and keeps it to
        // this call (see the class's documentation); the backend holds its
        // `fdb.Transaction` while it calls.
        Ok(unsafe { FdbTransaction::new(self.functions, transaction as *mut RawTransaction) })
    }

    /// A core error as a Python exception: a FoundationDB code as `fdb.FDBError(code)`.
    fn raise(&self, py: Python<'_>, error: Error) -> PyErr {
        match error {
            Error::Fdb { code } => match self.error.bind(py).call1((code,)) {
                Ok(exception) => PyErr::from_value(exception),
                Err(failed) => failed,
            },
            other => BindingError::from(other).into(),
        }
    }
}

#[pymethods]
impl PyFdbBatch {
    /// The operations calling the functions at these addresses, raising `error(code)`
    /// (the binding's `fdb.FDBError`) for a FoundationDB error. The addresses must be
    /// those of the named functions of the `libfdb_c` loaded in this process, with API
    /// version 730 selected; other values crash the process, as with `ctypes`.
    #[new]
    #[pyo3(signature = (
        *,
        transaction_get,
        transaction_set,
        transaction_atomic_op,
        future_block_until_ready,
        future_get_value,
        future_destroy,
        error,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        transaction_get: usize,
        transaction_set: usize,
        transaction_atomic_op: usize,
        future_block_until_ready: usize,
        future_get_value: usize,
        future_destroy: usize,
        error: Py<PyAny>,
    ) -> PyResult<Self> {
        let addresses = FdbAddresses {
            transaction_get,
            transaction_set,
            transaction_atomic_op,
            future_block_until_ready,
            future_get_value,
            future_destroy,
        };
        // SAFETY: the caller passes the addresses of the loaded library's functions (see
        // above); the library stays loaded for the life of the process.
        let functions = unsafe { FdbFunctions::new(addresses) }.map_err(BindingError::from)?;
        Ok(Self { functions, error })
    }

    /// Writes `values[i]` at `keys[i]` (Arrow binary arrays) in `transaction` (an
    /// `fdb.Transaction`'s `tpointer`).
    fn set_many(
        &self,
        py: Python<'_>,
        transaction: usize,
        keys: PyArray,
        values: PyArray,
    ) -> PyResult<()> {
        let tr = self.transaction(transaction)?;
        let (keys, values) = (binary(keys.array())?, binary(values.array())?);
        let done = detached(py, move || {
            tr.set_many(keys.iter().copied(), values.iter().copied())
        })?;
        done.map_err(|e| self.raise(py, e))
    }

    /// Adds `deltas[i]` (8 little-endian bytes each, back to back) to `keys[i]` with
    /// FoundationDB's atomic `ADD`.
    fn add_many(
        &self,
        py: Python<'_>,
        transaction: usize,
        keys: PyArray,
        deltas: PyBackedBytes,
    ) -> PyResult<()> {
        let tr = self.transaction(transaction)?;
        let keys = binary(keys.array())?;
        let done = detached(py, move || tr.add_many(keys.iter().copied(), &deltas))?;
        done.map_err(|e| self.raise(py, e))
    }

    /// Adds `deltas` (`width` little-endian int64 lanes per key, back to back) to `keys`
    /// lane by lane: one atomic `ADD` per key in the slot layout, no read.
    fn add_lanes(
        &self,
        py: Python<'_>,
        transaction: usize,
        keys: PyArray,
        deltas: PyBackedBytes,
        width: usize,
    ) -> PyResult<()> {
        let tr = self.transaction(transaction)?;
        let keys = binary(keys.array())?;
        let done = detached(py, move || {
            if deltas.len() % 8 != 0 {
                return Err(Error::InvalidArgument(format!(
                    "{} bytes of deltas are not whole int64 lanes",
                    deltas.len()
                )));
            }
            let lanes: Vec<i64> = deltas
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect();
            tr.add_lanes(&keys, &lanes, width)
        })?;
        done.map_err(|e| self.raise(py, e))
    }

    /// The values at `keys` (`None` where absent), all read at once; with `snapshot`
    /// without read conflicts.
    fn get_many<'py>(
        &self,
        py: Python<'py>,
        transaction: usize,
        keys: PyArray,
        snapshot: bool,
    ) -> PyResult<Bound<'py, PyList>> {
        let tr = self.transaction(transaction)?;
        let keys = binary(keys.array())?;
        let (data, spans) = detached(py, move || {
            let mut data = Vec::new();
            let mut spans = Vec::with_capacity(keys.len());
            tr.get_many(keys.iter().copied(), snapshot, |value| {
                spans.push(value.map(|v| {
                    data.extend_from_slice(v);
                    data.len() - v.len()..data.len()
                }));
            })
            .map(|()| (data, spans))
        })?
        .map_err(|e| self.raise(py, e))?;
        let values = spans.into_iter().map(|span| match span {
            Some(range) => PyBytes::new(py, &data[range]).into_any(),
            None => py.None().into_bound(py),
        });
        PyList::new(py, values)
    }
}

/// The values of a binary Arrow array (binary, large binary or binary view), which must
/// hold no nulls.
fn binary(array: &ArrayRef) -> PyResult<Vec<&[u8]>> {
    if array.null_count() > 0 {
        return Err(BindingError::from(Error::InvalidArgument(format!(
            "FoundationDB batch keys and values hold no nulls; got {}",
            array.null_count()
        )))
        .into());
    }
    let values = match array.data_type() {
        DataType::Binary => array.as_binary::<i32>().iter().flatten().collect(),
        DataType::LargeBinary => array.as_binary::<i64>().iter().flatten().collect(),
        DataType::BinaryView => array.as_binary_view().iter().flatten().collect(),
        other => {
            return Err(BindingError::from(Error::InvalidArgument(format!(
                "FoundationDB batch keys and values are a binary array; got {other}"
            )))
            .into())
        }
    };
    Ok(values)
}
