//! Straggler spill (thesis section 6): when the window is full and some reducers have
//! moved past its oldest entries, the rows those entries still hold for the others (the
//! stragglers, which the caller names) are handed out to be written to the store, and the
//! window lets them go.
//!
//! [`Window::peek_spill`] chooses the rows without changing the window; the caller writes
//! them and then calls [`Window::mark_spilled`], which pops them from their buckets as if
//! committed (the reducer's committed index stays where it is) and trims the entries
//! nobody needs any more. Rows at or below a bucket's spilled index are never buffered
//! again, as for its committed index. Spilled rows carry their shuffle indices in an extra
//! column, [`SHUFFLE_INDEX_COLUMN`], so that a reader can skip the ones it committed.

use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use crate::error::{Error, Result};
use crate::ipc::{self, IpcPayload};
use crate::size::{self, IpcOverhead};

use super::Window;

/// The column of a spilled chunk that holds each row's shuffle index.
pub const SHUFFLE_INDEX_COLUMN: &str = "__millstream_shuffle_index";

/// One chunk of a reducer's spilled rows, as an Arrow IPC stream of at most the chunk size
/// given to [`Window::peek_spill`] (or one row).
#[derive(Debug, Clone)]
pub struct SpillChunk {
    /// The reducer the rows are for.
    pub reducer_index: u32,
    /// Shuffle index of the first row.
    pub first_shuffle_row_index: i64,
    /// Shuffle index of the last row.
    pub last_shuffle_row_index: i64,
    /// Number of rows.
    pub row_count: u64,
    /// The rows with [`SHUFFLE_INDEX_COLUMN`] last.
    pub payload: IpcPayload,
}

/// A reducer's rows of one entry, with their shuffle indices.
struct Piece {
    batch: RecordBatch,
    indices: Vec<i64>,
}

impl Window {
    /// The rows to spill so that the window holds at most `target_bytes`: from the front
    /// entry on, for every entry that another reducer with rows in it has moved past and
    /// that only `stragglers` still wait for, their rows of it; at most `max_bytes` of them
    /// (at least one entry's), in chunks of at most `chunk_bytes`. It stops at the first
    /// entry a reducer that is not a straggler still needs, or that nobody has moved past
    /// (then spilling would let nobody read on); nothing when the window holds no more
    /// than `target_bytes`.
    pub fn peek_spill(
        &self,
        stragglers: &[u32],
        target_bytes: u64,
        max_bytes: u64,
        chunk_bytes: u64,
    ) -> Result<Vec<SpillChunk>> {
        let mut straggler = vec![false; self.num_reducers as usize];
        for &r in stragglers {
            straggler[self.check_reducer(i64::from(r))?] = true;
        }
        let Some(schema) = self.schema.clone() else {
            return Ok(Vec::new());
        };
        let mut pieces: Vec<Vec<Piece>> = (0..self.num_reducers).map(|_| Vec::new()).collect();
        let mut freed = 0u64;
        let mut taken = 0u64;
        for (at, entry) in self.entries.iter().enumerate() {
            if self.buffered_bytes.saturating_sub(freed) <= target_bytes {
                break;
            }
            let index = self.first_entry_index + at as u64;
            let mut having = 0usize;
            let mut waiting: Vec<(usize, usize)> = Vec::new();
            for (r, bucket) in self.buckets.iter().enumerate() {
                let range = entry.reducer_range(r);
                if range.is_empty() {
                    continue;
                }
                having += 1;
                if bucket.is_empty() || bucket.first_entry_index > index {
                    continue;
                }
                let skip = if bucket.first_entry_index == index {
                    bucket.position as usize
                } else {
                    0
                };
                if skip < range.len() {
                    waiting.push((r, range.start + skip));
                }
            }
            if waiting.is_empty() {
                freed += entry.bytes;
                continue;
            }
            if having == waiting.len() || waiting.iter().any(|&(r, _)| !straggler[r]) {
                break;
            }
            let batch = entry.rows.as_ref();
            let bytes: u64 = waiting
                .iter()
                .map(|&(r, start)| {
                    let end = entry.reducer_range(r).end;
                    batch.map_or(0, |b| size::ipc_body_bytes(b, start..end))
                        + 8 * (end - start) as u64
                })
                .sum();
            if taken > 0 && taken + bytes > max_bytes {
                break;
            }
            taken += bytes;
            freed += entry.bytes;
            for (r, start) in waiting {
                let batch = batch.expect("an entry with rows for a reducer has rows");
                let end = entry.reducer_range(r).end;
                pieces[r].push(Piece {
                    batch: batch.slice(start, end - start),
                    indices: entry.shuffle_offsets[start..end]
                        .iter()
                        .map(|&o| entry.shuffle_begin + i64::from(o))
                        .collect(),
                });
            }
        }
        let spilled = spill_schema(&schema);
        let overhead = IpcOverhead::of(&spilled)?;
        let mut chunks = Vec::new();
        for (r, reducer_pieces) in pieces.into_iter().enumerate() {
            chunk_pieces(
                r as u32,
                &spilled,
                overhead,
                reducer_pieces,
                chunk_bytes,
                &mut chunks,
            )?;
        }
        Ok(chunks)
    }

    /// Lets the window go of the reducer's rows up to shuffle index `through` (inclusive),
    /// which the caller has written to the store: they leave the bucket as if committed,
    /// without moving the reducer's committed index, and are never buffered again. Entries
    /// nobody needs any more are trimmed. Returns whether any was.
    pub fn mark_spilled(&mut self, reducer_index: i64, through: i64) -> Result<bool> {
        let reducer = self.check_reducer(reducer_index)?;
        let bucket = &mut self.buckets[reducer];
        if through <= bucket.spilled_row_index {
            return Ok(false);
        }
        bucket.spilled_row_index = through;
        self.pop_bucket(reducer, through);
        Ok(self.trim_window_entries())
    }

    /// The highest shuffle index spilled for the reducer (-1: none).
    pub fn spilled_row_index(&self, reducer_index: i64) -> Result<i64> {
        Ok(self.buckets[self.check_reducer(reducer_index)?].spilled_row_index)
    }
}

/// The window's schema with [`SHUFFLE_INDEX_COLUMN`] appended.
pub fn spill_schema(schema: &Schema) -> SchemaRef {
    let mut fields: Vec<Arc<Field>> = schema.fields().iter().cloned().collect();
    fields.push(Arc::new(Field::new(
        SHUFFLE_INDEX_COLUMN,
        DataType::Int64,
        false,
    )));
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

pub(super) fn with_indices(
    schema: &SchemaRef,
    batch: &RecordBatch,
    indices: &[i64],
) -> Result<RecordBatch> {
    let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
    columns.push(Arc::new(Int64Array::from(indices.to_vec())));
    RecordBatch::try_new(schema.clone(), columns).map_err(|e| Error::InvalidArgument(e.to_string()))
}

/// Splits one reducer's pieces into chunks of at most `chunk_bytes` (at least one row).
fn chunk_pieces(
    reducer: u32,
    schema: &SchemaRef,
    overhead: IpcOverhead,
    pieces: Vec<Piece>,
    chunk_bytes: u64,
    out: &mut Vec<SpillChunk>,
) -> Result<()> {
    let mut batches: Vec<RecordBatch> = Vec::new();
    let mut first = -1;
    let mut last = -1;
    let mut rows = 0u64;
    let mut used = overhead.stream_bytes;
    let flush = |batches: &mut Vec<RecordBatch>,
                 first: i64,
                 last: i64,
                 rows: &mut u64,
                 used: &mut u64,
                 out: &mut Vec<SpillChunk>|
     -> Result<()> {
        if batches.is_empty() {
            return Ok(());
        }
        out.push(SpillChunk {
            reducer_index: reducer,
            first_shuffle_row_index: first,
            last_shuffle_row_index: last,
            row_count: *rows,
            payload: ipc::encode(schema, batches)?,
        });
        batches.clear();
        *rows = 0;
        *used = overhead.stream_bytes;
        Ok(())
    };
    for piece in pieces {
        let full = with_indices(schema, &piece.batch, &piece.indices)?;
        let mut at = 0;
        while at < full.num_rows() {
            let left = full.num_rows() - at;
            let cost =
                |n: usize| used + overhead.batch_bytes + size::ipc_body_bytes(&full, at..at + n);
            let take = if cost(left) <= chunk_bytes {
                left
            } else {
                let (mut fits, mut over) = (0, left);
                while over - fits > 1 {
                    let mid = fits + (over - fits) / 2;
                    if cost(mid) <= chunk_bytes {
                        fits = mid;
                    } else {
                        over = mid;
                    }
                }
                if fits == 0 && rows == 0 {
                    1
                } else {
                    fits
                }
            };
            if take == 0 {
                flush(&mut batches, first, last, &mut rows, &mut used, out)?;
                continue;
            }
            if rows == 0 {
                first = piece.indices[at];
            }
            used = cost(take);
            batches.push(full.slice(at, take));
            last = piece.indices[at + take - 1];
            rows += take as u64;
            at += take;
            if take < left {
                flush(&mut batches, first, last, &mut rows, &mut used, out)?;
            }
        }
    }
    flush(&mut batches, first, last, &mut rows, &mut used, out)
}
