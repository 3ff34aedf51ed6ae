//! `millstream._core.Window`: the thread-safe mapper window.

use std::time::{Duration, Instant};

use millstream_core::{
    LocalMapperState, Room, SharedWindow, Window, WindowOptions, WindowSnapshot,
};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::PyBytes;
use pyo3_arrow::{PyArray, PyRecordBatch};

use crate::errors::{BindingError, BindingResult};
use crate::gil::detached;

/// How long `wait_for_room` waits between checks for Python signals.
const SIGNAL_CHECK_INTERVAL: Duration = Duration::from_millis(50);

/// A mapper's window; see `_core.pyi`.
#[pyclass(name = "Window", module = "millstream._core", frozen)]
pub struct PyWindow {
    inner: SharedWindow,
}

impl PyWindow {
    /// Runs `f` on the window with the GIL released. Every method that takes the window's
    /// lock releases the GIL first: a thread holding the lock may need the GIL (dropping
    /// rows that Python allocated, as NumPy-backed Arrow buffers, runs their release
    /// callback under the GIL), so a thread must never wait for the lock while holding it.
    fn read<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&Window) -> T + Send,
    ) -> BindingResult<T> {
        Ok(py.detach(|| self.inner.with(f))?)
    }
}

#[pymethods]
impl PyWindow {
    #[new]
    #[pyo3(signature = (
        num_reducers,
        memory_limit_bytes,
        input_unread_row_index = 0,
        shuffle_unread_row_index = 0,
        continuation_token = b"".as_slice(),
        *,
        max_payload_bytes = u64::MAX,
    ))]
    #[pyo3(
        text_signature = "(num_reducers, memory_limit_bytes, input_unread_row_index=0, \
                              shuffle_unread_row_index=0, continuation_token=b'', *, \
                              max_payload_bytes=2**64 - 1)"
    )]
    fn new(
        num_reducers: u32,
        memory_limit_bytes: u64,
        input_unread_row_index: i64,
        shuffle_unread_row_index: i64,
        continuation_token: &[u8],
        max_payload_bytes: u64,
    ) -> BindingResult<Self> {
        let window = Window::new(WindowOptions {
            num_reducers,
            memory_limit_bytes,
            max_payload_bytes,
            initial_state: LocalMapperState {
                input_unread_row_index,
                shuffle_unread_row_index,
                continuation_token: continuation_token.to_vec(),
            },
        })?;
        Ok(Self {
            inner: SharedWindow::new(window),
        })
    }

    fn push(
        &self,
        py: Python<'_>,
        batch: &Bound<'_, PyAny>,
        reducer_indices: PyArray,
        input_end_row_index: i64,
        continuation_token: PyBackedBytes,
    ) -> BindingResult<(i64, i64)> {
        // A pyarrow slice keeps its parents' whole buffers alive, which the C data
        // interface does not show; pyarrow counts them (each buffer once).
        let held_bytes = batch
            .call_method0(pyo3::intern!(py, "get_total_buffer_size"))
            .and_then(|n| n.extract::<u64>())
            .ok();
        let batch = batch.extract::<PyRecordBatch>()?.into_inner();
        let (indices, _) = reducer_indices.into_inner();
        let token = continuation_token.to_vec();
        Ok(detached(py, || {
            self.inner.push(
                batch,
                indices.as_ref(),
                input_end_row_index,
                token,
                held_bytes,
            )
        })??)
    }

    #[pyo3(signature = (
        reducer_index, committed_row_index, max_rows, max_bytes, after_row_index=None,
        shuffle_indices=false,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn get_rows<'py>(
        &self,
        py: Python<'py>,
        reducer_index: i64,
        committed_row_index: i64,
        max_rows: i64,
        max_bytes: i64,
        after_row_index: Option<i64>,
        shuffle_indices: bool,
    ) -> BindingResult<(u64, i64, Bound<'py, PyBytes>)> {
        let after = after_row_index.unwrap_or(committed_row_index);
        let result = detached(py, || {
            self.inner.get_rows_after(
                reducer_index,
                committed_row_index,
                after,
                max_rows,
                max_bytes,
                shuffle_indices,
            )
        })??;
        let payload = &result.payload;
        let bytes = PyBytes::new_with(py, payload.len(), |out| {
            detached(py, || payload.write_to(out))
        })?;
        Ok((result.row_count, result.last_shuffle_row_index, bytes))
    }

    #[allow(clippy::type_complexity)]
    fn peek_spill<'py>(
        &self,
        py: Python<'py>,
        stragglers: Vec<u32>,
        target_bytes: u64,
        max_bytes: u64,
        chunk_bytes: u64,
    ) -> BindingResult<Vec<(u32, i64, i64, u64, Bound<'py, PyBytes>)>> {
        let chunks = detached(py, || {
            self.inner
                .peek_spill(&stragglers, target_bytes, max_bytes, chunk_bytes)
        })??;
        chunks
            .into_iter()
            .map(|c| {
                let payload = &c.payload;
                let bytes = PyBytes::new_with(py, payload.len(), |out| {
                    detached(py, || payload.write_to(out))
                })?;
                Ok((
                    c.reducer_index,
                    c.first_shuffle_row_index,
                    c.last_shuffle_row_index,
                    c.row_count,
                    bytes,
                ))
            })
            .collect()
    }

    fn mark_spilled(
        &self,
        py: Python<'_>,
        reducer_index: i64,
        through: i64,
    ) -> BindingResult<bool> {
        Ok(detached(py, || {
            self.inner.mark_spilled(reducer_index, through)
        })??)
    }

    fn spilled_row_index(&self, py: Python<'_>, reducer_index: i64) -> BindingResult<i64> {
        Ok(self.read(py, |w| w.spilled_row_index(reducer_index))??)
    }

    #[pyo3(signature = (timeout_seconds, reserve_bytes = 0))]
    fn wait_for_room(
        &self,
        py: Python<'_>,
        timeout_seconds: f64,
        reserve_bytes: u64,
    ) -> BindingResult<bool> {
        if timeout_seconds.is_nan() || timeout_seconds < 0.0 {
            return Err(BindingError::Core(millstream_core::Error::InvalidArgument(
                format!("timeout_seconds must be >= 0, got {timeout_seconds}"),
            )));
        }
        let deadline = Duration::try_from_secs_f64(timeout_seconds)
            .ok()
            .and_then(|t| Instant::now().checked_add(t));
        loop {
            let slice = match deadline {
                Some(d) => d
                    .saturating_duration_since(Instant::now())
                    .min(SIGNAL_CHECK_INTERVAL),
                None => SIGNAL_CHECK_INTERVAL,
            };
            match detached(py, || {
                self.inner.wait_for_room_for(Some(slice), reserve_bytes)
            })?? {
                Room::Available => return Ok(true),
                Room::Closed => return Ok(false),
                Room::TimedOut => {}
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(false);
            }
        }
    }

    fn local_state<'py>(&self, py: Python<'py>) -> BindingResult<(i64, i64, Bound<'py, PyBytes>)> {
        let state = self.read(py, |w| w.local_state().clone())?;
        Ok((
            state.input_unread_row_index,
            state.shuffle_unread_row_index,
            PyBytes::new(py, &state.continuation_token),
        ))
    }

    fn close(&self, py: Python<'_>) -> BindingResult<()> {
        Ok(py.detach(|| self.inner.close())?)
    }

    #[pyo3(signature = (reducer_index, after_row_index=None))]
    fn bucket_len(
        &self,
        py: Python<'_>,
        reducer_index: i64,
        after_row_index: Option<i64>,
    ) -> BindingResult<u64> {
        Ok(self.read(py, |w| match after_row_index {
            None => w.bucket_len(reducer_index),
            Some(after) => w.bucket_len_after(reducer_index, after),
        })??)
    }

    fn pending_shuffle_indices(
        &self,
        py: Python<'_>,
        reducer_index: i64,
    ) -> BindingResult<Vec<i64>> {
        Ok(self.read(py, |w| w.pending_shuffle_indices(reducer_index))??)
    }

    fn bucket_pointer_counts(&self, py: Python<'_>) -> BindingResult<Vec<u32>> {
        self.read(py, Window::bucket_pointer_counts)
    }

    fn snapshot(&self, py: Python<'_>) -> BindingResult<PyWindowSnapshot> {
        Ok(py.detach(|| self.inner.snapshot())?.into())
    }

    fn __repr__(&self, py: Python<'_>) -> BindingResult<String> {
        let s = py.detach(|| self.inner.snapshot())?;
        Ok(format!(
            "Window(num_reducers={}, entries={}, buffered_rows={}, buffered_bytes={}, \
             memory_limit_bytes={}, shuffle_end_row_index={})",
            s.num_reducers,
            s.num_entries,
            s.buffered_rows,
            s.buffered_bytes,
            s.memory_limit_bytes,
            s.shuffle_end_row_index
        ))
    }
}

/// The window's figures at one instant (one lock); see `_core.pyi`.
#[pyclass(name = "WindowSnapshot", module = "millstream._core", frozen, get_all)]
pub struct PyWindowSnapshot {
    num_reducers: u32,
    memory_limit_bytes: u64,
    max_payload_bytes: u64,
    buffered_bytes: u64,
    buffered_rows: u64,
    index_bytes: u64,
    num_entries: usize,
    first_entry_index: u64,
    input_end_row_index: i64,
    shuffle_end_row_index: i64,
    input_unread_row_index: i64,
    shuffle_unread_row_index: i64,
    closed: bool,
}

impl From<WindowSnapshot> for PyWindowSnapshot {
    fn from(s: WindowSnapshot) -> Self {
        Self {
            num_reducers: s.num_reducers,
            memory_limit_bytes: s.memory_limit_bytes,
            max_payload_bytes: s.max_payload_bytes,
            buffered_bytes: s.buffered_bytes,
            buffered_rows: s.buffered_rows,
            index_bytes: s.index_bytes,
            num_entries: s.num_entries,
            first_entry_index: s.first_entry_index,
            input_end_row_index: s.input_end_row_index,
            shuffle_end_row_index: s.shuffle_end_row_index,
            input_unread_row_index: s.local_state.input_unread_row_index,
            shuffle_unread_row_index: s.local_state.shuffle_unread_row_index,
            closed: s.closed,
        }
    }
}

#[pymethods]
impl PyWindowSnapshot {
    fn __repr__(&self) -> String {
        format!(
            "WindowSnapshot(num_reducers={}, num_entries={}, buffered_rows={}, \
             buffered_bytes={}, memory_limit_bytes={}, input_end_row_index={}, \
             shuffle_end_row_index={}, input_unread_row_index={}, \
             shuffle_unread_row_index={}, closed={})",
            self.num_reducers,
            self.num_entries,
            self.buffered_rows,
            self.buffered_bytes,
            self.memory_limit_bytes,
            self.input_end_row_index,
            self.shuffle_end_row_index,
            self.input_unread_row_index,
            self.shuffle_unread_row_index,
            if self.closed { "True" } else { "False" },
        )
    }
}
