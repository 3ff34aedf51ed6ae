//! [`SharedWindow`]: a [`Window`] behind a mutex, for the ingestion thread that pushes and
//! the RPC threads that serve `GetRows` at the same time, with a condition variable to wait
//! for memory.
//!
//! Expensive work happens outside the lock: a push groups its batch by reducer before taking
//! it, and `get_rows` encodes its IPC stream after releasing it. Pushes are serialized among
//! themselves by a second mutex.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use arrow_array::{Array, RecordBatch};

use crate::error::{Error, Result};
use crate::ipc::IpcPayload;
use crate::window::{PreparedEntry, SpillChunk, Window, WindowSnapshot};

/// Outcome of [`SharedWindow::wait_for_room`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Room {
    /// Buffered bytes are at most the memory limit.
    Available,
    /// The window was closed (and is over its limit).
    Closed,
    /// The timeout passed first.
    TimedOut,
}

/// Result of [`SharedWindow::get_rows`].
#[derive(Debug, Clone)]
pub struct GetRowsResult {
    /// Rows returned.
    pub row_count: u64,
    /// Shuffle index of the last row returned, or the committed index with no rows.
    pub last_shuffle_row_index: i64,
    /// The rows as an Arrow IPC stream; empty (zero bytes) with no rows.
    pub payload: IpcPayload,
}

#[derive(Debug)]
struct Inner {
    window: Window,
    closed: bool,
}

/// A thread-safe [`Window`].
#[derive(Debug)]
pub struct SharedWindow {
    inner: Mutex<Inner>,
    room: Condvar,
    push_lock: Mutex<()>,
}

impl SharedWindow {
    /// Wraps a window.
    pub fn new(window: Window) -> Self {
        Self {
            inner: Mutex::new(Inner {
                window,
                closed: false,
            }),
            room: Condvar::new(),
            push_lock: Mutex::new(()),
        }
    }

    fn lock(&self) -> Result<MutexGuard<'_, Inner>> {
        self.inner.lock().map_err(|_| Error::Poisoned)
    }

    /// Runs `f` on the window under the lock.
    pub fn with<T>(&self, f: impl FnOnce(&Window) -> T) -> Result<T> {
        Ok(f(&self.lock()?.window))
    }

    /// [`Window::snapshot`], with whether the window is closed: every figure under one lock.
    pub fn snapshot(&self) -> Result<WindowSnapshot> {
        let inner = self.lock()?;
        Ok(WindowSnapshot {
            closed: inner.closed,
            ..inner.window.snapshot()
        })
    }

    /// [`Window::push`]; the batch is grouped by reducer without holding the lock. See
    /// [`PreparedEntry::build`] for `held_bytes`.
    pub fn push(
        &self,
        batch: RecordBatch,
        reducer_indices: &dyn Array,
        input_end_row_index: i64,
        continuation_token: Vec<u8>,
        held_bytes: Option<u64>,
    ) -> Result<(i64, i64)> {
        let _pushing = self.push_lock.lock().map_err(|_| Error::Poisoned)?;
        let ctx = {
            let inner = self.lock()?;
            if inner.closed {
                return Err(Error::Closed);
            }
            inner.window.push_context()
        };
        let prepared = PreparedEntry::build(
            ctx,
            batch,
            reducer_indices,
            input_end_row_index,
            continuation_token,
            held_bytes,
        )?;
        let mut inner = self.lock()?;
        if inner.closed {
            return Err(Error::Closed);
        }
        let before = inner.window.buffered_bytes();
        let range = inner.window.append(prepared)?;
        if inner.window.buffered_bytes() < before {
            self.room.notify_all();
        }
        Ok(range)
    }

    /// [`Window::peek_spill`] under the lock (the chunks reference the entries' buffers;
    /// copying them out happens outside it).
    pub fn peek_spill(
        &self,
        stragglers: &[u32],
        target_bytes: u64,
        max_bytes: u64,
        chunk_bytes: u64,
    ) -> Result<Vec<SpillChunk>> {
        self.lock()?
            .window
            .peek_spill(stragglers, target_bytes, max_bytes, chunk_bytes)
    }

    /// [`Window::mark_spilled`]; wakes the mapper waiting for room when entries were trimmed.
    pub fn mark_spilled(&self, reducer_index: i64, through: i64) -> Result<bool> {
        let trimmed = self.lock()?.window.mark_spilled(reducer_index, through)?;
        if trimmed {
            self.room.notify_all();
        }
        Ok(trimmed)
    }

    /// [`Window::get_rows`], with the rows encoded as an IPC stream outside the lock. With no
    /// rows (an acknowledgement: `max_rows` 0) nothing is encoded and the payload is empty.
    pub fn get_rows(
        &self,
        reducer_index: i64,
        committed_row_index: i64,
        max_rows: i64,
        max_bytes: i64,
    ) -> Result<GetRowsResult> {
        self.get_rows_after(
            reducer_index,
            committed_row_index,
            committed_row_index,
            max_rows,
            max_bytes,
            false,
        )
    }

    /// [`get_rows`](Self::get_rows) for a reducer that keeps fetched rows pending across
    /// commits: the rows come from after `after_row_index` (its fetch position) when that
    /// is beyond the committed index, so it is sent only the rows it has not fetched yet;
    /// with `shuffle_indices` the rows carry their shuffle indices (see
    /// [`Window::peek_rows`]).
    pub fn get_rows_after(
        &self,
        reducer_index: i64,
        committed_row_index: i64,
        after_row_index: i64,
        max_rows: i64,
        max_bytes: i64,
        shuffle_indices: bool,
    ) -> Result<GetRowsResult> {
        let rows = {
            let mut inner = self.lock()?;
            let trimmed = inner
                .window
                .pop_committed(reducer_index, committed_row_index)?;
            if trimmed {
                self.room.notify_all();
            }
            let after = after_row_index.max(committed_row_index);
            inner
                .window
                .peek_rows(reducer_index, after, max_rows, max_bytes, shuffle_indices)?
        };
        if rows.is_empty() {
            // An acknowledgement, or nothing new: no stream to encode.
            return Ok(GetRowsResult {
                row_count: 0,
                last_shuffle_row_index: rows.last_shuffle_row_index,
                payload: IpcPayload::default(),
            });
        }
        Ok(GetRowsResult {
            row_count: rows.row_count,
            last_shuffle_row_index: rows.last_shuffle_row_index,
            payload: rows.to_ipc()?,
        })
    }

    /// Waits at most `timeout` (`None`: forever) until buffered bytes are at most the memory
    /// limit or the window is closed.
    pub fn wait_for_room(&self, timeout: Option<Duration>) -> Result<Room> {
        self.wait_for_room_for(timeout, 0)
    }

    /// Waits at most `timeout` (`None`: forever) until `reserve_bytes` more would fit under
    /// the memory limit (or nothing is buffered), or the window is closed: a mapper that
    /// reserves its next batch's size keeps the window under the limit.
    pub fn wait_for_room_for(&self, timeout: Option<Duration>, reserve_bytes: u64) -> Result<Room> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let mut inner = self.lock()?;
        loop {
            if inner.window.has_room_for(reserve_bytes) {
                return Ok(Room::Available);
            }
            if inner.closed {
                return Ok(Room::Closed);
            }
            inner = match deadline {
                None => self.room.wait(inner).map_err(|_| Error::Poisoned)?,
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(Room::TimedOut);
                    }
                    self.room
                        .wait_timeout(inner, left)
                        .map_err(|_| Error::Poisoned)?
                        .0
                }
            };
        }
    }

    /// Closes the window: wakes every waiter; later pushes fail. `get_rows` keeps working.
    pub fn close(&self) -> Result<()> {
        self.lock()?.closed = true;
        self.room.notify_all();
        Ok(())
    }
}
