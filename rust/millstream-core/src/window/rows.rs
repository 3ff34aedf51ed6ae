//! GetRows selection (thesis 4.3.4): popping a reducer's bucket up to its committed index
//! and choosing the rows to return within the row and byte caps, as zero-copy slices.

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::{Schema, SchemaRef};

use crate::error::{Error, Result};
use crate::ipc::{self, IpcPayload};
use crate::size::{self, IpcOverhead};

use super::spill::{spill_schema, with_indices};
use super::Window;

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
    /// The rows' shuffle indices, when asked for: the stream then carries them as a last
    /// column, [`SHUFFLE_INDEX_COLUMN`](super::SHUFFLE_INDEX_COLUMN).
    pub shuffle_indices: Option<Vec<i64>>,
}

impl Rows {
    /// The rows as one Arrow IPC stream.
    pub fn to_ipc(&self) -> Result<IpcPayload> {
        let Some(indices) = &self.shuffle_indices else {
            return ipc::encode(&self.schema, &self.batches);
        };
        let schema = spill_schema(&self.schema);
        let mut at = 0;
        let mut batches = Vec::with_capacity(self.batches.len());
        for batch in &self.batches {
            let n = batch.num_rows();
            batches.push(with_indices(&schema, batch, &indices[at..at + n])?);
            at += n;
        }
        ipc::encode(&schema, &batches)
    }

    /// True when no rows were selected.
    pub fn is_empty(&self) -> bool {
        self.row_count == 0
    }
}

impl Window {
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
        let mut rows = self.peek_rows(
            reducer_index,
            committed_row_index,
            max_rows,
            max_bytes,
            false,
        )?;
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

    pub(super) fn pop_bucket(&mut self, reducer: usize, committed_row_index: i64) {
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

    /// Up to `max_rows` rows of the reducer's bucket after shuffle index `after` whose IPC
    /// stream takes at most `max_bytes` (and `max_payload_bytes`), but at least one row if
    /// any, without removing them. Bytes are counted per row taken, so the cap holds
    /// whatever the sizes of other reducers' rows.
    ///
    /// `after` is the reducer's fetch position: its committed index for the thesis's loop;
    /// further on for a reducer that keeps fetched rows pending across commits (they stay
    /// in the bucket, and so in the window, until it commits them). With `shuffle_indices`
    /// the rows carry their shuffle indices (counted in the byte cap), so that such a
    /// reducer can commit any prefix of them.
    pub fn peek_rows(
        &self,
        reducer_index: i64,
        after: i64,
        max_rows: i64,
        max_bytes: i64,
        shuffle_indices: bool,
    ) -> Result<Rows> {
        let reducer = self.check_reducer(reducer_index)?;
        if max_rows < 0 || max_bytes < 0 {
            return Err(Error::InvalidArgument(format!(
                "max_rows and max_bytes must be >= 0, got {max_rows} and {max_bytes}"
            )));
        }
        let bucket = &self.buckets[reducer];
        let mut rows = Rows {
            row_count: 0,
            last_shuffle_row_index: bucket.committed_row_index.max(after),
            batches: Vec::new(),
            schema: self
                .schema
                .clone()
                .unwrap_or_else(|| Arc::new(Schema::empty())),
            shuffle_indices: shuffle_indices.then(Vec::new),
        };
        let Some(mut ipc) = self.ipc else {
            return Ok(rows);
        };
        // Eight bytes a row for the index column, and its share of the headers.
        let index_bytes = u64::from(shuffle_indices) * 8;
        if shuffle_indices {
            ipc = IpcOverhead::of(&spill_schema(&rows.schema))?;
        }
        let limit = (max_bytes as u64).min(self.max_payload_bytes);
        let mut used = ipc.stream_bytes;
        let mut remaining = bucket.len.min(max_rows as u64);
        let Some((mut at, mut position)) = self.bucket_position_after(reducer, after) else {
            return Ok(rows);
        };
        while remaining > 0 && at < self.entries.len() {
            let entry = &self.entries[at];
            let range = entry.reducer_range(reducer);
            let available = range.len() - position;
            if available > 0 {
                let start = range.start + position;
                let batch = entry.rows.as_ref().expect("an entry with rows");
                let wanted = (available as u64).min(remaining) as usize;
                let cost = |n: usize| {
                    used + ipc.batch_bytes
                        + size::ipc_body_bytes(batch, start..start + n)
                        + (index_bytes * n as u64).next_multiple_of(64)
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
                if let Some(indices) = &mut rows.shuffle_indices {
                    indices.extend(
                        entry.shuffle_offsets[start..start + take]
                            .iter()
                            .map(|&o| entry.shuffle_begin + i64::from(o)),
                    );
                }
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

    /// Where the reducer's first bucket row after shuffle index `after` is: the entry's
    /// position in `entries` and the row's position among the reducer's rows of it; `None`
    /// when there is none.
    fn bucket_position_after(&self, reducer: usize, after: i64) -> Option<(usize, usize)> {
        let bucket = &self.buckets[reducer];
        if bucket.is_empty() {
            return None;
        }
        let mut position = bucket.position as usize;
        let first = (bucket.first_entry_index - self.first_entry_index) as usize;
        for at in first..self.entries.len() {
            let entry = &self.entries[at];
            let range = entry.reducer_range(reducer);
            if entry.shuffle_end - 1 > after {
                let limit = after - entry.shuffle_begin;
                let pending = &entry.shuffle_offsets[range.start + position..range.end];
                let skipped = if limit < 0 {
                    0
                } else {
                    pending.partition_point(|&o| i64::from(o) <= limit)
                };
                if skipped < pending.len() {
                    return Some((at, position + skipped));
                }
            }
            position = 0;
        }
        None
    }

    /// Rows of the reducer's bucket after shuffle index `after` (its fetch position).
    pub fn bucket_len_after(&self, reducer_index: i64, after: i64) -> Result<u64> {
        let reducer = self.check_reducer(reducer_index)?;
        let Some((first, position)) = self.bucket_position_after(reducer, after) else {
            return Ok(0);
        };
        Ok(self
            .entries
            .range(first..)
            .map(|e| e.reducer_range(reducer).len() as u64)
            .sum::<u64>()
            - position as u64)
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
}
