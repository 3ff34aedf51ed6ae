//! The one place where core errors become Python exceptions. The exception hierarchy is
//! created here and re-exported unchanged by `millstream.exceptions`.

use millstream_core::kafka::KafkaError;
use millstream_core::Error;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(
    millstream._core,
    MillstreamError,
    PyException,
    "Base class of every error millstream raises."
);
create_exception!(
    millstream._core,
    WindowError,
    MillstreamError,
    "A mapper window operation was invalid."
);
create_exception!(
    millstream._core,
    MemoryLimitError,
    WindowError,
    "A mapped batch does not fit the window's memory limit."
);
create_exception!(
    millstream._core,
    CommittedIndexError,
    WindowError,
    "A reducer's committed row index is impossible or went backwards."
);
create_exception!(
    millstream._core,
    SchemaMismatchError,
    WindowError,
    "A mapped batch's schema differs from the window's."
);

create_exception!(
    millstream._core,
    KafkaReadError,
    MillstreamError,
    "Reading a Kafka partition failed (the message names the partition and offset)."
);
create_exception!(
    millstream._core,
    KafkaOffsetOutOfRangeError,
    KafkaReadError,
    "The offset to read is outside the partition's log; args: (message, offset, log start, \
     end), the range as the leader told it (-1: unknown)."
);

/// An error of a binding call: from the core, or a Python exception passed on unchanged.
#[derive(Debug)]
pub enum BindingError {
    /// From millstream-core.
    Core(Error),
    /// Raised by Python (argument conversion, signals); re-raised as is.
    Python(PyErr),
}

impl From<Error> for BindingError {
    fn from(e: Error) -> Self {
        Self::Core(e)
    }
}

impl From<PyErr> for BindingError {
    fn from(e: PyErr) -> Self {
        Self::Python(e)
    }
}

impl From<BindingError> for PyErr {
    fn from(e: BindingError) -> Self {
        let e = match e {
            BindingError::Python(e) => return e,
            BindingError::Core(e) => e,
        };
        let message = e.to_string();
        match e {
            Error::BatchOverMemoryLimit { .. } => MemoryLimitError::new_err(message),
            Error::CommittedIndexBackwards { .. } | Error::CommittedIndexInvalid { .. } => {
                CommittedIndexError::new_err(message)
            }
            Error::SchemaMismatch { .. } => SchemaMismatchError::new_err(message),
            Error::ReducerOutOfRange { .. }
            | Error::LengthMismatch { .. }
            | Error::InvalidReducerIndices(_)
            | Error::InputIndexBackwards { .. }
            | Error::RowOverPayloadLimit { .. }
            | Error::Closed
            | Error::Poisoned => WindowError::new_err(message),
            Error::KeyColumnNotFound { .. }
            | Error::UnsupportedKeyType { .. }
            | Error::InvalidArgument(_)
            | Error::Decode(_)
            | Error::Fdb { .. }
            | Error::Arrow(_) => MillstreamError::new_err(message),
            Error::Kafka(KafkaError::OffsetOutOfRange {
                offset,
                log_start,
                end,
                ..
            }) => KafkaOffsetOutOfRangeError::new_err((message, offset, log_start, end)),
            Error::Kafka(_) => KafkaReadError::new_err(message),
        }
    }
}

/// Result of a binding call.
pub type BindingResult<T> = Result<T, BindingError>;

/// Adds the exception classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("MillstreamError", py.get_type::<MillstreamError>())?;
    m.add("WindowError", py.get_type::<WindowError>())?;
    m.add("MemoryLimitError", py.get_type::<MemoryLimitError>())?;
    m.add("CommittedIndexError", py.get_type::<CommittedIndexError>())?;
    m.add("SchemaMismatchError", py.get_type::<SchemaMismatchError>())?;
    m.add("KafkaReadError", py.get_type::<KafkaReadError>())?;
    m.add(
        "KafkaOffsetOutOfRangeError",
        py.get_type::<KafkaOffsetOutOfRangeError>(),
    )?;
    Ok(())
}
