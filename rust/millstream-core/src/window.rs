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

use std::collections::VecDeque;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{make_array, RecordBatchOptions};
use arrow_array::{Array, ArrowPrimitiveType, RecordBatch, UInt32Array};
use arrow_buffer::ScalarBuffer;
use arrow_data::transform::MutableArrayData;
use arrow_schema::{DataType, Schema, SchemaRef};
use arrow_select::take::take_record_batch;

use crate::bucket::Bucket;
use crate::error::{Error, Result};
use crate::ipc::{self, IpcPayload};
use crate::size::{self, IpcOverhead};

/// A batch kept without a copy is copied when its buffers hold more than this many times
/// its rows' own bytes (plus [`COMPACT_SLACK_BYTES`]).
pub const COMPACT_RATIO: u64 = 2;

/// Buffers up to this many bytes beyond `COMPACT_RATIO` times a batch's own bytes are not
/// worth a copy.
pub const COMPACT_SLACK_BYTES: u64 = 64 * 1024;

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

/// One window entry: a mapped batch, grouped by reducer.
#[derive(Debug)]
struct WindowEntry {
    input_end_row_index: i64,
    shuffle_begin: i64,
    shuffle_end: i64,
    continuation_token: Vec<u8>,
    /// Kept rows grouped by reducer, each group in shuffle order; `None` with no rows.
    rows: Option<RecordBatch>,
    /// `reducer_offsets[r]..reducer_offsets[r + 1]` are reducer r's rows; empty with no rows.
    reducer_offsets: Box<[u32]>,
    /// Per grouped row, its shuffle index minus `shuffle_begin`.
    shuffle_offsets: ScalarBuffer<u32>,
    bucket_pointer_count: u32,
    bytes: u64,
}

impl WindowEntry {
    fn reducer_range(&self, reducer: usize) -> std::ops::Range<usize> {
        if self.reducer_offsets.is_empty() {
            0..0
        } else {
            self.reducer_offsets[reducer] as usize..self.reducer_offsets[reducer + 1] as usize
        }
    }

    fn num_rows(&self) -> usize {
        self.shuffle_offsets.len()
    }
}

/// What a push needs to know about the window; taken under the lock, used without it.
#[derive(Debug, Clone)]
pub struct PushContext {
    num_reducers: u32,
    memory_limit_bytes: u64,
    max_payload_bytes: u64,
    ipc: Option<IpcOverhead>,
    shuffle_begin: i64,
    input_begin: i64,
    schema: Option<SchemaRef>,
    watermarks: Vec<i64>,
}

/// A mapped batch made ready for [`Window::append`], built without holding the window.
#[derive(Debug)]
pub struct PreparedEntry {
    entry: WindowEntry,
    kept_rows_per_reducer: Vec<u32>,
    schema: Option<SchemaRef>,
    ipc: Option<IpcOverhead>,
    input_begin: i64,
}

/// Rows selected for one reducer by [`Window::get_rows`]: zero-copy slices of entries.
#[derive(Debug, Clone)]
pub struct Rows {
    /// Number of rows.
    pub row_count: u64,
    /// Shuffle index of the last row; the committed index passed in when there are none.
    pub last_shuffle_row_index: i64,
    /// The rows, in shuffle order.
    pub batches: Vec<RecordBatch>,
    /// Their schema (the window's; empty before the first batch with rows).
    pub schema: SchemaRef,
}

impl Rows {
    /// The rows as one Arrow IPC stream.
    pub fn to_ipc(&self) -> Result<IpcPayload> {
        ipc::encode(&self.schema, &self.batches)
    }

    /// True when no rows were selected.
    pub fn is_empty(&self) -> bool {
        self.row_count == 0
    }
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
            watermarks: self.buckets.iter().map(|b| b.committed_row_index).collect(),
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
        // A reducer may have committed past rows while the entry was being built.
        for reducer in 0..self.buckets.len() {
            let b = &self.buckets[reducer];
            if !b.is_empty() && b.committed_row_index >= range.0 {
                self.pop_bucket(reducer, b.committed_row_index);
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

    /// GetRows (thesis 4.3.4 steps 2-4): [`pop_committed`](Self::pop_committed), then
    /// [`peek_rows`](Self::peek_rows).
    pub fn get_rows(
        &mut self,
        reducer_index: i64,
        committed_row_index: i64,
        max_rows: i64,
        max_bytes: i64,
    ) -> Result<Rows> {
        self.pop_committed(reducer_index, committed_row_index)?;
        let mut rows = self.peek_rows(reducer_index, max_rows, max_bytes)?;
        if rows.row_count == 0 {
            rows.last_shuffle_row_index = committed_row_index;
        }
        Ok(rows)
    }

    /// Pops the reducer's bucket up to `committed_row_index` (inclusive) and trims window
    /// entries whose pointer count fell to zero. Returns whether anything was trimmed.
    pub fn pop_committed(&mut self, reducer_index: i64, committed_row_index: i64) -> Result<bool> {
        let reducer = self.check_reducer(reducer_index)?;
        let bucket = &mut self.buckets[reducer];
        if committed_row_index < -1 {
            return Err(Error::CommittedIndexInvalid {
                reducer_index: reducer as u32,
                committed_row_index,
            });
        }
        if committed_row_index < bucket.committed_row_index {
            return Err(Error::CommittedIndexBackwards {
                reducer_index: reducer as u32,
                committed_row_index,
                previous: bucket.committed_row_index,
            });
        }
        bucket.committed_row_index = committed_row_index;
        self.pop_bucket(reducer, committed_row_index);
        Ok(self.trim_window_entries())
    }

    fn pop_bucket(&mut self, reducer: usize, committed_row_index: i64) {
        let bucket = &mut self.buckets[reducer];
        while !bucket.is_empty() {
            let at = (bucket.first_entry_index - self.first_entry_index) as usize;
            let entry = &mut self.entries[at];
            let range = entry.reducer_range(reducer);
            let pending = &entry.shuffle_offsets[range.start + bucket.position as usize..range.end];
            let limit = committed_row_index - entry.shuffle_begin;
            let popped = if limit < 0 {
                0
            } else if limit >= entry.shuffle_end - entry.shuffle_begin {
                pending.len()
            } else {
                pending.partition_point(|&o| i64::from(o) <= limit)
            };
            bucket.position += popped as u32;
            bucket.len -= popped as u64;
            if popped < pending.len() {
                break;
            }
            entry.bucket_pointer_count -= 1;
            if bucket.is_empty() {
                break;
            }
            let next = (at + 1..self.entries.len())
                .find(|&i| !self.entries[i].reducer_range(reducer).is_empty())
                .expect("a non-empty bucket has rows in a later entry");
            self.entries[next].bucket_pointer_count += 1;
            bucket.first_entry_index = self.first_entry_index + next as u64;
            bucket.position = 0;
        }
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

    /// Up to `max_rows` rows from the front of the reducer's bucket whose IPC stream takes
    /// at most `max_bytes` (and `max_payload_bytes`), but at least one row if any, without
    /// removing them. Bytes are counted per row taken, so the cap holds whatever the sizes
    /// of other reducers' rows.
    pub fn peek_rows(&self, reducer_index: i64, max_rows: i64, max_bytes: i64) -> Result<Rows> {
        let reducer = self.check_reducer(reducer_index)?;
        if max_rows < 0 || max_bytes < 0 {
            return Err(Error::InvalidArgument(format!(
                "max_rows and max_bytes must be >= 0, got {max_rows} and {max_bytes}"
            )));
        }
        let bucket = &self.buckets[reducer];
        let mut rows = Rows {
            row_count: 0,
            last_shuffle_row_index: bucket.committed_row_index,
            batches: Vec::new(),
            schema: self
                .schema
                .clone()
                .unwrap_or_else(|| Arc::new(Schema::empty())),
        };
        let Some(ipc) = self.ipc else {
            return Ok(rows);
        };
        let limit = (max_bytes as u64).min(self.max_payload_bytes);
        let mut used = ipc.stream_bytes;
        let mut remaining = bucket.len.min(max_rows as u64);
        let mut position = bucket.position as usize;
        let mut at = (bucket
            .first_entry_index
            .saturating_sub(self.first_entry_index)) as usize;
        while remaining > 0 && at < self.entries.len() {
            let entry = &self.entries[at];
            let range = entry.reducer_range(reducer);
            let available = range.len() - position;
            if available > 0 {
                let start = range.start + position;
                let batch = entry.rows.as_ref().expect("an entry with rows");
                let wanted = (available as u64).min(remaining) as usize;
                let cost = |n: usize| {
                    used + ipc.batch_bytes + size::ipc_body_bytes(batch, start..start + n)
                };
                let take = if cost(wanted) <= limit {
                    wanted
                } else {
                    // The largest count that fits: costs grow with the count.
                    let (mut fits, mut over) = (0, wanted);
                    while over - fits > 1 {
                        let mid = fits + (over - fits) / 2;
                        if cost(mid) <= limit {
                            fits = mid;
                        } else {
                            over = mid;
                        }
                    }
                    if fits == 0 && rows.row_count == 0 {
                        1
                    } else {
                        fits
                    }
                };
                if take == 0 {
                    break;
                }
                used = cost(take);
                rows.batches.push(batch.slice(start, take));
                rows.last_shuffle_row_index =
                    entry.shuffle_begin + i64::from(entry.shuffle_offsets[start + take - 1]);
                rows.row_count += take as u64;
                remaining -= take as u64;
                if take < wanted {
                    break;
                }
            }
            at += 1;
            position = 0;
        }
        Ok(rows)
    }

    /// Shuffle indices of the reducer's pending rows, in order (for tests and debugging).
    pub fn pending_shuffle_indices(&self, reducer_index: i64) -> Result<Vec<i64>> {
        let reducer = self.check_reducer(reducer_index)?;
        let bucket = &self.buckets[reducer];
        let mut out = Vec::with_capacity(bucket.len as usize);
        if bucket.is_empty() {
            return Ok(out);
        }
        let mut position = bucket.position as usize;
        for entry in self
            .entries
            .iter()
            .skip((bucket.first_entry_index - self.first_entry_index) as usize)
        {
            let range = entry.reducer_range(reducer);
            out.extend(
                entry.shuffle_offsets[range.start + position..range.end]
                    .iter()
                    .map(|&o| entry.shuffle_begin + i64::from(o)),
            );
            position = 0;
        }
        Ok(out)
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

    /// The local mapper state after trimming (thesis 4.3.5).
    pub fn local_state(&self) -> &LocalMapperState {
        &self.local_state
    }

    /// Reducers of the window.
    pub fn num_reducers(&self) -> u32 {
        self.num_reducers
    }

    /// The memory limit.
    pub fn memory_limit_bytes(&self) -> u64 {
        self.memory_limit_bytes
    }

    /// Bytes held by the window's entries (Arrow buffers and index).
    pub fn buffered_bytes(&self) -> u64 {
        self.buffered_bytes
    }

    /// Bytes charged for every entry (Arrow buffers and index), front first.
    pub fn entry_bytes(&self) -> Vec<u64> {
        self.entries.iter().map(|e| e.bytes).collect()
    }

    /// The largest GetRows payload the window serves.
    pub fn max_payload_bytes(&self) -> u64 {
        self.max_payload_bytes
    }

    /// Index bytes (everything but Arrow buffers) held by the window's entries.
    pub fn index_bytes(&self) -> u64 {
        self.entries.iter().map(index_bytes).sum()
    }

    /// Rows held by the window's entries.
    pub fn buffered_rows(&self) -> u64 {
        self.buffered_rows
    }

    /// True when buffered bytes are at most the memory limit.
    pub fn has_room(&self) -> bool {
        self.buffered_bytes <= self.memory_limit_bytes
    }

    /// Entries in the window.
    pub fn num_entries(&self) -> usize {
        self.entries.len()
    }

    /// Absolute index of the first entry (entries are numbered from 0 per window).
    pub fn first_entry_index(&self) -> u64 {
        self.first_entry_index
    }

    /// Input index after the last pushed entry.
    pub fn input_end_row_index(&self) -> i64 {
        self.input_end_row_index
    }

    /// Shuffle index the next pushed row gets.
    pub fn shuffle_end_row_index(&self) -> i64 {
        self.shuffle_end_row_index
    }

    /// The window's schema, fixed by the first batch with rows.
    pub fn schema(&self) -> Option<&SchemaRef> {
        self.schema.as_ref()
    }
}

fn index_bytes(e: &WindowEntry) -> u64 {
    (std::mem::size_of::<WindowEntry>()
        + 4 * e.reducer_offsets.len()
        + 4 * e.shuffle_offsets.len()
        + e.continuation_token.len()) as u64
}

impl PreparedEntry {
    /// Validates and groups a mapped batch: `reducer_indices` has one reducer index per row
    /// (any integer type, no nulls); the entry covers input rows up to
    /// `input_end_row_index` and resumes reading at `continuation_token`. Rows at or below
    /// their reducer's watermark are dropped here.
    ///
    /// `held_bytes` is the memory the batch's buffers keep allocated when its producer knows
    /// more than the buffers show: a slice imported through the Arrow C data interface
    /// keeps its parents' whole buffers alive, but shows only their part up to its last
    /// row. `None` for batches built in Rust.
    pub fn build(
        ctx: PushContext,
        batch: RecordBatch,
        reducer_indices: &dyn Array,
        input_end_row_index: i64,
        continuation_token: Vec<u8>,
        held_bytes: Option<u64>,
    ) -> Result<Self> {
        let n = batch.num_rows();
        if reducer_indices.len() != n {
            return Err(Error::LengthMismatch {
                batch_rows: n,
                reducer_indices: reducer_indices.len(),
            });
        }
        if input_end_row_index < ctx.input_begin {
            return Err(Error::InputIndexBackwards {
                input_end_row_index,
                window_input_end: ctx.input_begin,
            });
        }
        let n32 = u32::try_from(n).map_err(|_| {
            Error::InvalidArgument(format!(
                "a mapped batch has {n} rows; at most {} fit one window entry",
                u32::MAX
            ))
        })?;
        let num_reducers = ctx.num_reducers as usize;
        let reducers = reducer_indices_u32(reducer_indices, ctx.num_reducers)?;
        let (batch, schema) = if n == 0 {
            (batch, None)
        } else {
            let batch = match &ctx.schema {
                Some(ours) => conform(ours, batch)?,
                None => batch,
            };
            let schema = batch.schema();
            (batch, Some(schema))
        };

        let shuffle_begin = ctx.shuffle_begin;
        let filtering = ctx.watermarks.iter().any(|&w| w >= shuffle_begin);
        let dropped = |i: usize, r: u32| -> bool {
            filtering && shuffle_begin + i as i64 <= ctx.watermarks[r as usize]
        };
        let mut counts = vec![0u32; num_reducers + 1];
        let mut sorted = true;
        let mut previous = 0;
        for (i, &r) in reducers.iter().enumerate() {
            if dropped(i, r) {
                sorted = false;
                continue;
            }
            counts[r as usize + 1] += 1;
            sorted &= r >= previous;
            previous = r;
        }
        let kept_rows_per_reducer = counts[1..].to_vec();
        for r in 0..num_reducers {
            counts[r + 1] += counts[r];
        }
        let kept = counts[num_reducers] as usize;

        // What the producer says the batch holds, if the entry keeps the batch as pushed.
        let mut kept_held = 0;
        let (rows, shuffle_offsets, reducer_offsets) = if kept == 0 {
            (None, ScalarBuffer::from(Vec::new()), Box::default())
        } else if sorted {
            let (rows, copied) = compact_if_sparse(batch, held_bytes)?;
            if !copied {
                kept_held = held_bytes.unwrap_or(0);
            }
            (
                Some(rows),
                ScalarBuffer::from_iter(0..n32),
                counts.into_boxed_slice(),
            )
        } else {
            let mut cursor = counts[..num_reducers].to_vec();
            let mut order = vec![0u32; kept];
            for (i, &r) in reducers.iter().enumerate() {
                if dropped(i, r) {
                    continue;
                }
                let c = &mut cursor[r as usize];
                order[*c as usize] = i as u32;
                *c += 1;
            }
            let order = ScalarBuffer::from(order);
            let grouped = take_record_batch(&batch, &UInt32Array::new(order.clone(), None))?;
            (Some(grouped), order, counts.into_boxed_slice())
        };
        let ipc = match (ctx.ipc, &schema) {
            (Some(ipc), _) => Some(ipc),
            (None, Some(schema)) => Some(IpcOverhead::of(schema)?),
            (None, None) => None,
        };
        if let (Some(rows), Some(ipc)) = (&rows, &ipc) {
            check_row_sizes(
                rows,
                ipc,
                ctx.max_payload_bytes,
                &reducer_offsets,
                &shuffle_offsets,
                shuffle_begin,
            )?;
        }
        let arrow_bytes = rows
            .as_ref()
            .map_or(0, |rows| size::held_bytes(rows).max(kept_held));
        let mut entry = WindowEntry {
            input_end_row_index,
            shuffle_begin,
            shuffle_end: shuffle_begin + n as i64,
            continuation_token,
            rows,
            reducer_offsets,
            shuffle_offsets,
            bucket_pointer_count: 0,
            bytes: 0,
        };
        entry.bytes = arrow_bytes + index_bytes(&entry);
        if entry.bytes > ctx.memory_limit_bytes {
            return Err(Error::BatchOverMemoryLimit {
                entry_bytes: entry.bytes,
                memory_limit_bytes: ctx.memory_limit_bytes,
            });
        }
        Ok(Self {
            entry,
            kept_rows_per_reducer,
            schema,
            ipc,
            input_begin: ctx.input_begin,
        })
    }
}

/// Refuses a batch with a row whose IPC stream alone would exceed `max_payload_bytes`.
fn check_row_sizes(
    rows: &RecordBatch,
    ipc: &IpcOverhead,
    max_payload_bytes: u64,
    reducer_offsets: &[u32],
    shuffle_offsets: &[u32],
    shuffle_begin: i64,
) -> Result<()> {
    let n = rows.num_rows();
    // A row never takes more than the whole batch.
    if ipc.stream_of(rows, 0..n) <= max_payload_bytes {
        return Ok(());
    }
    for (i, &offset) in shuffle_offsets.iter().enumerate().take(n) {
        let row_bytes = ipc.stream_of(rows, i..i + 1);
        if row_bytes > max_payload_bytes {
            let reducer = reducer_offsets.partition_point(|&o| o as usize <= i) - 1;
            return Err(Error::RowOverPayloadLimit {
                shuffle_row_index: shuffle_begin + i64::from(offset),
                reducer_index: reducer as u32,
                row_bytes,
                max_payload_bytes,
            });
        }
    }
    Ok(())
}

/// `batch`, copied into buffers of its own when its buffers hold much more than its rows
/// (a slice of a larger batch), so that trimming its entry frees what it was charged; and
/// whether it was copied.
fn compact_if_sparse(batch: RecordBatch, held_bytes: Option<u64>) -> Result<(RecordBatch, bool)> {
    let rows = batch.num_rows();
    let own = size::ipc_body_bytes(&batch, 0..rows);
    let held = size::held_bytes(&batch).max(held_bytes.unwrap_or(0));
    if held <= COMPACT_RATIO * own + COMPACT_SLACK_BYTES {
        return Ok((batch, false));
    }
    let columns = batch
        .columns()
        .iter()
        .map(|c| {
            let data = c.to_data();
            let mut copy = MutableArrayData::new(vec![&data], false, rows);
            copy.try_extend(0, 0, rows)?;
            Ok(make_array(copy.freeze()))
        })
        .collect::<Result<Vec<_>>>()?;
    let copy = RecordBatch::try_new_with_options(
        batch.schema(),
        columns,
        &RecordBatchOptions::new().with_row_count(Some(rows)),
    )?;
    Ok((copy, true))
}

fn reducer_indices_u32(array: &dyn Array, num_reducers: u32) -> Result<Vec<u32>> {
    if array.null_count() > 0 {
        return Err(Error::InvalidReducerIndices(format!(
            "{} of them are null; every row needs a reducer",
            array.null_count()
        )));
    }
    fn convert<T: ArrowPrimitiveType>(array: &dyn Array, num_reducers: u32) -> Result<Vec<u32>>
    where
        T::Native: TryInto<i64> + Copy,
    {
        let values = array.as_primitive::<T>().values();
        let mut out = Vec::with_capacity(values.len());
        let mut bad = None;
        for &v in values.iter() {
            let v: i64 = v.try_into().unwrap_or(i64::MAX);
            if v < 0 || v >= i64::from(num_reducers) {
                bad.get_or_insert(v);
            }
            out.push(v as u32);
        }
        match bad {
            Some(reducer_index) => Err(Error::ReducerOutOfRange {
                reducer_index,
                num_reducers,
            }),
            None => Ok(out),
        }
    }
    match array.data_type() {
        DataType::Int8 => convert::<Int8Type>(array, num_reducers),
        DataType::Int16 => convert::<Int16Type>(array, num_reducers),
        DataType::Int32 => convert::<Int32Type>(array, num_reducers),
        DataType::Int64 => convert::<Int64Type>(array, num_reducers),
        DataType::UInt8 => convert::<UInt8Type>(array, num_reducers),
        DataType::UInt16 => convert::<UInt16Type>(array, num_reducers),
        DataType::UInt32 => convert::<UInt32Type>(array, num_reducers),
        DataType::UInt64 => convert::<UInt64Type>(array, num_reducers),
        other => Err(Error::InvalidReducerIndices(format!(
            "expected an integer array (int32 or uint32), got {other}"
        ))),
    }
}

fn check_same_fields(ours: &Schema, theirs: &Schema) -> Result<()> {
    let mismatch = |difference: String| Err(Error::SchemaMismatch { difference });
    if ours.fields().len() != theirs.fields().len() {
        let names = |s: &Schema| {
            s.fields()
                .iter()
                .map(|f| f.name().clone())
                .collect::<Vec<_>>()
        };
        return mismatch(format!(
            "the window has columns {:?}, the batch has {:?}",
            names(ours),
            names(theirs)
        ));
    }
    for (a, b) in ours.fields().iter().zip(theirs.fields()) {
        if a.name() != b.name()
            || a.data_type() != b.data_type()
            || a.is_nullable() != b.is_nullable()
        {
            return mismatch(format!(
                "column {}: the window has {:?} {}{}, the batch has {:?} {}{}",
                ours.fields().iter().position(|f| f == a).unwrap_or(0),
                a.name(),
                a.data_type(),
                if a.is_nullable() { "" } else { " not null" },
                b.name(),
                b.data_type(),
                if b.is_nullable() { "" } else { " not null" },
            ));
        }
    }
    Ok(())
}

fn conform(ours: &SchemaRef, batch: RecordBatch) -> Result<RecordBatch> {
    let theirs = batch.schema();
    if Arc::ptr_eq(ours, &theirs) || **ours == *theirs {
        return Ok(batch);
    }
    check_same_fields(ours, &theirs)?;
    let rows = batch.num_rows();
    Ok(RecordBatch::try_new_with_options(
        ours.clone(),
        batch.columns().to_vec(),
        &RecordBatchOptions::new().with_row_count(Some(rows)),
    )?)
}
