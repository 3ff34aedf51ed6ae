//! The window's accounting at one instant: one [`WindowSnapshot`] taken under one lock for
//! metrics and status, plus per-entry views for tests and debugging.

use arrow_schema::SchemaRef;

use crate::bucket::Bucket;
use crate::error::Result;

use super::entry::index_bytes;
use super::{LocalMapperState, Window};

/// The window's figures at one instant, taken together (one lock for a
/// [`SharedWindow`](crate::SharedWindow)), so that they agree with each other.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WindowSnapshot {
    /// Reducers of the window.
    pub num_reducers: u32,
    /// Buffered bytes above which the mapper stops reading.
    pub memory_limit_bytes: u64,
    /// The largest GetRows payload the window serves.
    pub max_payload_bytes: u64,
    /// Bytes held by the entries (Arrow buffers and index).
    pub buffered_bytes: u64,
    /// Rows held by the entries.
    pub buffered_rows: u64,
    /// Index bytes (everything but Arrow buffers) held by the entries.
    pub index_bytes: u64,
    /// Entries in the window.
    pub num_entries: usize,
    /// Absolute index of the first entry (entries are numbered from 0 per window).
    pub first_entry_index: u64,
    /// Input index after the last pushed entry: where the next read starts.
    pub input_end_row_index: i64,
    /// Shuffle index the next pushed row gets.
    pub shuffle_end_row_index: i64,
    /// The local mapper state after trimming (thesis 4.3.5).
    pub local_state: LocalMapperState,
    /// Whether the window was closed (only a [`SharedWindow`](crate::SharedWindow) closes;
    /// always false for a bare [`Window`]).
    pub closed: bool,
}

impl Window {
    /// Every figure of the window at once.
    pub fn snapshot(&self) -> WindowSnapshot {
        WindowSnapshot {
            num_reducers: self.num_reducers,
            memory_limit_bytes: self.memory_limit_bytes,
            max_payload_bytes: self.max_payload_bytes,
            buffered_bytes: self.buffered_bytes,
            buffered_rows: self.buffered_rows,
            index_bytes: self.entries.iter().map(index_bytes).sum(),
            num_entries: self.entries.len(),
            first_entry_index: self.first_entry_index,
            input_end_row_index: self.input_end_row_index,
            shuffle_end_row_index: self.shuffle_end_row_index,
            local_state: self.local_state.clone(),
            closed: false,
        }
    }

    /// The local mapper state after trimming (thesis 4.3.5).
    pub fn local_state(&self) -> &LocalMapperState {
        &self.local_state
    }

    /// Bytes held by the entries (what [`has_room`](Self::has_room) compares).
    pub(crate) fn buffered_bytes(&self) -> u64 {
        self.buffered_bytes
    }

    /// True when buffered bytes are at most the memory limit.
    pub fn has_room(&self) -> bool {
        self.has_room_for(0)
    }

    /// True when `reserve_bytes` more would still be at most the memory limit, or when
    /// nothing is buffered (a batch larger than the limit alone is refused by `push`).
    pub fn has_room_for(&self, reserve_bytes: u64) -> bool {
        self.buffered_bytes == 0
            || self.buffered_bytes.saturating_add(reserve_bytes) <= self.memory_limit_bytes
    }

    /// The window's schema, fixed by the first batch with rows.
    pub fn schema(&self) -> Option<&SchemaRef> {
        self.schema.as_ref()
    }

    /// Rows in the reducer's bucket.
    pub fn bucket_len(&self, reducer_index: i64) -> Result<u64> {
        Ok(self.buckets[self.check_reducer(reducer_index)?].len)
    }

    /// The reducer's bucket.
    pub fn bucket(&self, reducer_index: i64) -> Result<&Bucket> {
        Ok(&self.buckets[self.check_reducer(reducer_index)?])
    }

    /// Bucket pointer counts of the entries, front first.
    pub fn bucket_pointer_counts(&self) -> Vec<u32> {
        self.entries
            .iter()
            .map(|e| e.bucket_pointer_count)
            .collect()
    }

    /// `(input_end, shuffle_begin, shuffle_end)` of every entry, front first.
    pub fn entry_ranges(&self) -> Vec<(i64, i64, i64)> {
        self.entries
            .iter()
            .map(|e| (e.input_end_row_index, e.shuffle_begin, e.shuffle_end))
            .collect()
    }

    /// Bytes charged for every entry (Arrow buffers and index), front first.
    pub fn entry_bytes(&self) -> Vec<u64> {
        self.entries.iter().map(|e| e.bytes).collect()
    }
}
