//! `millstream._core.KafkaPartitionReader`: the core's Kafka partition reader, its batches
//! handed to pyarrow through the C data interface; every wait runs without the GIL.

use std::sync::Mutex;
use std::time::Duration;

use millstream_core::kafka::{ClusterConfig, PartitionReader, ReaderOptions};
use pyo3::prelude::*;
use pyo3_arrow::PyRecordBatch;

use crate::errors::BindingResult;
use crate::gil::detached;

/// How long one wait without the GIL lasts before Python's signals are checked.
const SIGNAL_CHECK_INTERVAL: Duration = Duration::from_millis(100);

/// A reader of one Kafka topic partition; see `_core.pyi`.
#[pyclass(name = "KafkaPartitionReader", module = "millstream._core", frozen)]
pub struct PyKafkaPartitionReader {
    inner: Mutex<PartitionReader>,
}

impl PyKafkaPartitionReader {
    /// Runs `f` on the reader without the GIL, in slices of at most the signal interval
    /// until it gives something or `wait` passes.
    fn waiting<T: Send>(
        &self,
        py: Python<'_>,
        wait: f64,
        f: impl Fn(&mut PartitionReader, Duration) -> BindingResult<Option<T>> + Send + Sync,
    ) -> BindingResult<Option<T>> {
        let mut left = Duration::from_secs_f64(wait.max(0.0));
        loop {
            let slice = left.min(SIGNAL_CHECK_INTERVAL);
            let out = detached(py, || {
                f(&mut self.inner.lock().expect("reader lock"), slice)
            })??;
            left = left.saturating_sub(slice);
            if out.is_some() || left.is_zero() {
                return Ok(out);
            }
        }
    }
}

#[pymethods]
impl PyKafkaPartitionReader {
    #[new]
    #[pyo3(signature = (
        bootstrap_servers, topic, partition, start, end = None, *,
        client_id = "millstream", timeout_seconds = 10.0, max_wait_ms = 100,
        fetch_bytes = 8 << 20, read_ahead_bytes = 64 << 20,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        bootstrap_servers: &str,
        topic: String,
        partition: i32,
        start: i64,
        end: Option<i64>,
        client_id: &str,
        timeout_seconds: f64,
        max_wait_ms: i32,
        fetch_bytes: i32,
        read_ahead_bytes: usize,
    ) -> Self {
        let timeout = Duration::from_secs_f64(timeout_seconds.max(0.1))
            + Duration::from_millis(max_wait_ms.max(0) as u64);
        let reader = PartitionReader::start(ReaderOptions {
            cluster: ClusterConfig::from_servers(bootstrap_servers, client_id, timeout),
            topic,
            partition,
            start,
            end,
            max_wait_ms,
            fetch_bytes,
            read_ahead_bytes,
        });
        Self {
            inner: Mutex::new(reader),
        }
    }

    fn position(&self, py: Python<'_>) -> i64 {
        py.detach(|| self.inner.lock().expect("reader lock").position())
    }

    fn retrying(&self, py: Python<'_>) -> Option<(String, f64, u32)> {
        py.detach(|| {
            let retrying = self.inner.lock().expect("reader lock").retrying()?;
            let seconds = retrying.since.elapsed().as_secs_f64();
            Some((retrying.error.to_string(), seconds, retrying.attempts))
        })
    }

    fn ended(&self, py: Python<'_>) -> bool {
        py.detach(|| self.inner.lock().expect("reader lock").ended())
    }

    fn read<'py>(
        &self,
        py: Python<'py>,
        max_rows: usize,
        wait_seconds: f64,
    ) -> BindingResult<Option<Bound<'py, PyAny>>> {
        let batch = self.waiting(py, wait_seconds, |reader, wait| {
            Ok(reader
                .read(max_rows.max(1), wait)
                .map_err(millstream_core::Error::from)?)
        })?;
        Ok(match batch {
            Some(batch) => Some(PyRecordBatch::new(batch).into_pyarrow(py)?),
            None => None,
        })
    }

    fn wait(&self, py: Python<'_>, timeout_seconds: f64) -> BindingResult<bool> {
        let ready = self.waiting(py, timeout_seconds, |reader, wait| {
            let ready = reader.wait(wait).map_err(millstream_core::Error::from)?;
            Ok(ready.then_some(()))
        })?;
        Ok(ready.is_some())
    }
}
