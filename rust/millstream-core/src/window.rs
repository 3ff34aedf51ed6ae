//! The mapper window (thesis 4.3.1): window entries, buckets, bucket pointer counts, the
//! local mapper state, trimming (thesis 4.3.5) and memory accounting.
//!
//! # Layout
//!
//! On push, a mapped batch is reordered by reducer once (a stable counting sort and one
//! Arrow `take`), so each reducer's rows of an entry form one contiguous slice, in shuffle
//! order. Per row the entry keeps a `u32` offset back to shuffle order (the `take` indices
//! themselves); per entry, `num_reducers + 1` slice boundaries. `GetRows` then hands out
//! zero-copy slices and the IPC encoder copies them once. A batch already grouped by reducer
//! (one reducer, or sorted keys) is kept as is, without a copy, unless it is a small slice
//! of larger buffers (see Memory).
//!
//! # Committed indices
//!
//! `committed_row_index` is the shuffle index of the last row a reducer committed, -1 before
//! its first commit. Per bucket the window keeps the highest one seen (the *watermark*):
//!
//! * Lower than the watermark: [`Error::CommittedIndexBackwards`]. Only a second instance of
//!   the reducer with stale state can send it.
//! * Beyond the window's shuffle end: legal. After a mapper restart, reducers may have
//!   committed rows that the restarted mapper has not re-produced yet (its persisted state
//!   lags its reducers' commits). The watermark makes sure such rows, once re-produced, are
//!   never buffered for that reducer, let alone returned.
//! * Below -1: [`Error::CommittedIndexInvalid`].
//!
//! # Memory
//!
//! `buffered_bytes` counts the memory every entry keeps allocated: its Arrow buffers, each
//! allocation once however many columns share it ([`size::held_bytes`]), plus the index: 4
//! bytes per row, `4 * (num_reducers + 1)` bytes and the continuation token per entry, and
//! the entry header. A batch kept without a copy keeps its whole buffers alive, so a batch
//! whose buffers hold more than [`COMPACT_RATIO`] times its rows' own bytes (a slice of a
//! larger batch) is copied into buffers of its own first: the entry then holds, and frees
//! when trimmed, what it is charged. Pushing never blocks; the caller waits for room (see
//! [`SharedWindow`](crate::SharedWindow)). A single batch larger than the limit on its own is
//! an error, since no amount of waiting makes room for it.
//!
//! # GetRows bytes
//!
//! A response is capped by the bytes of its IPC stream, counted per row returned
//! ([`size::IpcOverhead`]): fixed widths, each row's own string/binary/list lengths, and
//! every message header. The cap gives way for one row, so a row larger than the cap still
//! moves; a row that could not fit `max_payload_bytes` (what the transport can carry) at
//! all is refused at push ([`Error::RowOverPayloadLimit`]), since no reducer could ever
//! receive it.
//!
//! # Schema
//!
//! The first batch with rows fixes the window's schema; later batches must have the same
//! fields (names, types, nullability). Schema metadata may differ; the window's is kept.
//! A change is a [`Error::SchemaMismatch`]: reducers decode one stream per mapper.

mod entry;
mod rows;
mod snapshot;
mod spill;

use std::collections::VecDeque;

use arrow_array::{Array, RecordBatch};
use arrow_schema::SchemaRef;

use crate::bucket::Bucket;
use crate::error::{Error, Result};
use crate::size::IpcOverhead;

pub use entry::{PreparedEntry, PushContext, COMPACT_RATIO, COMPACT_SLACK_BYTES};
pub use rows::Rows;
pub use snapshot::WindowSnapshot;
pub use spill::{spill_schema, SpillChunk, SHUFFLE_INDEX_COLUMN};

use entry::{check_same_fields, WindowEntry};

/// The local mapper state (thesis 4.3.2 fields): where the untrimmed input begins.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LocalMapperState {
    /// Input index of the first row whose mapped rows are not all committed.
    pub input_unread_row_index: i64,
    /// Shuffle index of the first row not committed by its reducer (at entry granularity).
    pub shuffle_unread_row_index: i64,
    /// Partition reader token to resume reading at `input_unread_row_index`.
    pub continuation_token: Vec<u8>,
}

/// How to build a window.
#[derive(Debug, Clone)]
pub struct WindowOptions {
    /// Reducers of the processor (at least 1).
    pub num_reducers: u32,
    /// Buffered bytes above which `wait_for_room` blocks.
    pub memory_limit_bytes: u64,
    /// Largest IPC stream one GetRows response may be (what the transport can carry, less
    /// its envelope); `u64::MAX` for no limit. A row that alone would exceed it is refused.
    pub max_payload_bytes: u64,
    /// The persisted mapper state the mapper starts from.
    pub initial_state: LocalMapperState,
}

/// A mapper's window. Not thread-safe by itself; see [`SharedWindow`](crate::SharedWindow).
#[derive(Debug)]
pub struct Window {
    num_reducers: u32,
    memory_limit_bytes: u64,
    max_payload_bytes: u64,
    entries: VecDeque<WindowEntry>,
    first_entry_index: u64,
    buckets: Vec<Bucket>,
    local_state: LocalMapperState,
    input_end_row_index: i64,
    shuffle_end_row_index: i64,
    schema: Option<SchemaRef>,
    ipc: Option<IpcOverhead>,
    buffered_bytes: u64,
    buffered_rows: u64,
}

impl Window {
    /// A window with no entries, starting at `options.initial_state`.
    pub fn new(options: WindowOptions) -> Result<Self> {
        let WindowOptions {
            num_reducers,
            memory_limit_bytes,
            max_payload_bytes,
            initial_state,
        } = options;
        if num_reducers == 0 || num_reducers > i32::MAX as u32 {
            return Err(Error::InvalidArgument(format!(
                "num_reducers must be in [1, {}], got {num_reducers}",
                i32::MAX
            )));
        }
        if initial_state.input_unread_row_index < 0 || initial_state.shuffle_unread_row_index < 0 {
            return Err(Error::InvalidArgument(format!(
                "input_unread_row_index and shuffle_unread_row_index must be >= 0, got {} and {}",
                initial_state.input_unread_row_index, initial_state.shuffle_unread_row_index
            )));
        }
        Ok(Self {
            num_reducers,
            memory_limit_bytes,
            max_payload_bytes,
            entries: VecDeque::new(),
            first_entry_index: 0,
            buckets: vec![Bucket::new(); num_reducers as usize],
            input_end_row_index: initial_state.input_unread_row_index,
            shuffle_end_row_index: initial_state.shuffle_unread_row_index,
            local_state: initial_state,
            schema: None,
            ipc: None,
            buffered_bytes: 0,
            buffered_rows: 0,
        })
    }

    /// Pushes one mapped batch as a window entry (thesis 4.3.3 step 6) and returns its
    /// shuffle range `(begin, end)`. See [`PreparedEntry::build`] for the arguments.
    pub fn push(
        &mut self,
        batch: RecordBatch,
        reducer_indices: &dyn Array,
        input_end_row_index: i64,
        continuation_token: Vec<u8>,
    ) -> Result<(i64, i64)> {
        let prepared = PreparedEntry::build(
            self.push_context(),
            batch,
            reducer_indices,
            input_end_row_index,
            continuation_token,
            None,
        )?;
        self.append(prepared)
    }

    /// A snapshot for [`PreparedEntry::build`].
    pub fn push_context(&self) -> PushContext {
        PushContext {
            num_reducers: self.num_reducers,
            memory_limit_bytes: self.memory_limit_bytes,
            max_payload_bytes: self.max_payload_bytes,
            ipc: self.ipc,
            shuffle_begin: self.shuffle_end_row_index,
            input_begin: self.input_end_row_index,
            schema: self.schema.clone(),
            watermarks: self
                .buckets
                .iter()
                .map(|b| b.committed_row_index.max(b.spilled_row_index))
                .collect(),
        }
    }

    /// Appends a prepared entry: updates buckets and pointer counts, then trims.
    pub fn append(&mut self, prepared: PreparedEntry) -> Result<(i64, i64)> {
        let PreparedEntry {
            mut entry,
            kept_rows_per_reducer,
            schema,
            ipc,
            input_begin,
        } = prepared;
        if entry.shuffle_begin != self.shuffle_end_row_index
            || input_begin != self.input_end_row_index
        {
            return Err(Error::InvalidArgument(
                "the window changed while the batch was prepared; push from one thread only".into(),
            ));
        }
        if let (Some(theirs), Some(ours)) = (&schema, &self.schema) {
            check_same_fields(ours, theirs)?;
        }
        if self.schema.is_none() {
            self.schema = schema;
        }
        if self.ipc.is_none() {
            self.ipc = ipc;
        }
        let index = self.first_entry_index + self.entries.len() as u64;
        for (bucket, &kept) in self.buckets.iter_mut().zip(&kept_rows_per_reducer) {
            if kept == 0 {
                continue;
            }
            if bucket.is_empty() {
                bucket.first_entry_index = index;
                bucket.position = 0;
                entry.bucket_pointer_count += 1;
            }
            bucket.len += u64::from(kept);
        }
        let range = (entry.shuffle_begin, entry.shuffle_end);
        self.input_end_row_index = entry.input_end_row_index;
        self.shuffle_end_row_index = entry.shuffle_end;
        self.buffered_bytes += entry.bytes;
        self.buffered_rows += entry.num_rows() as u64;
        self.entries.push_back(entry);
        // A reducer may have committed past rows (or they were spilled) while the entry was
        // being built.
        for reducer in 0..self.buckets.len() {
            let b = &self.buckets[reducer];
            let watermark = b.committed_row_index.max(b.spilled_row_index);
            if !b.is_empty() && watermark >= range.0 {
                self.pop_bucket(reducer, watermark);
            }
        }
        self.trim_window_entries();
        Ok(range)
    }

    fn check_reducer(&self, reducer_index: i64) -> Result<usize> {
        if reducer_index < 0 || reducer_index >= i64::from(self.num_reducers) {
            return Err(Error::ReducerOutOfRange {
                reducer_index,
                num_reducers: self.num_reducers,
            });
        }
        Ok(reducer_index as usize)
    }

    /// TrimWindowEntries (thesis 4.3.5): pops entries with bucket pointer count zero from the
    /// front and moves the local mapper state past the last one. Returns whether any was.
    pub fn trim_window_entries(&mut self) -> bool {
        let mut trimmed = false;
        while self
            .entries
            .front()
            .is_some_and(|e| e.bucket_pointer_count == 0)
        {
            let e = self.entries.pop_front().expect("front exists");
            self.first_entry_index += 1;
            self.buffered_bytes -= e.bytes;
            self.buffered_rows -= e.num_rows() as u64;
            self.local_state = LocalMapperState {
                input_unread_row_index: e.input_end_row_index,
                shuffle_unread_row_index: e.shuffle_end,
                continuation_token: e.continuation_token,
            };
            trimmed = true;
        }
        trimmed
    }
}
