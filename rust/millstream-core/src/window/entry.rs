//! Window entries and how a mapped batch becomes one: validation, grouping by reducer,
//! compaction of sparse slices, the row-size check against the payload limit, and the
//! memory an entry is charged.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{make_array, RecordBatchOptions};
use arrow_array::{Array, ArrowPrimitiveType, RecordBatch, UInt32Array};
use arrow_buffer::ScalarBuffer;
use arrow_data::transform::MutableArrayData;
use arrow_schema::{DataType, Schema, SchemaRef};
use arrow_select::take::take_record_batch;

use crate::error::{Error, Result};
use crate::size::{self, IpcOverhead};

/// A batch kept without a copy is copied when its buffers hold more than this many times
/// its rows' own bytes (plus [`COMPACT_SLACK_BYTES`]).
pub const COMPACT_RATIO: u64 = 2;

/// Buffers up to this many bytes beyond `COMPACT_RATIO` times a batch's own bytes are not
/// worth a copy.
pub const COMPACT_SLACK_BYTES: u64 = 64 * 1024;

/// One window entry: a mapped batch, grouped by reducer.
#[derive(Debug)]
pub(super) struct WindowEntry {
    pub(super) input_end_row_index: i64,
    pub(super) shuffle_begin: i64,
    pub(super) shuffle_end: i64,
    pub(super) continuation_token: Vec<u8>,
    /// Kept rows grouped by reducer, each group in shuffle order; `None` with no rows.
    pub(super) rows: Option<RecordBatch>,
    /// `reducer_offsets[r]..reducer_offsets[r + 1]` are reducer r's rows; empty with no rows.
    pub(super) reducer_offsets: Box<[u32]>,
    /// Per grouped row, its shuffle index minus `shuffle_begin`.
    pub(super) shuffle_offsets: ScalarBuffer<u32>,
    pub(super) bucket_pointer_count: u32,
    pub(super) bytes: u64,
}

impl WindowEntry {
    pub(super) fn reducer_range(&self, reducer: usize) -> std::ops::Range<usize> {
        if self.reducer_offsets.is_empty() {
            0..0
        } else {
            self.reducer_offsets[reducer] as usize..self.reducer_offsets[reducer + 1] as usize
        }
    }

    pub(super) fn num_rows(&self) -> usize {
        self.shuffle_offsets.len()
    }
}

/// What a push needs to know about the window; taken under the lock, used without it.
#[derive(Debug, Clone)]
pub struct PushContext {
    pub(super) num_reducers: u32,
    pub(super) memory_limit_bytes: u64,
    pub(super) max_payload_bytes: u64,
    pub(super) ipc: Option<IpcOverhead>,
    pub(super) shuffle_begin: i64,
    pub(super) input_begin: i64,
    pub(super) schema: Option<SchemaRef>,
    pub(super) watermarks: Vec<i64>,
}

/// A mapped batch made ready for [`Window::append`], built without holding the window.
#[derive(Debug)]
pub struct PreparedEntry {
    pub(super) entry: WindowEntry,
    pub(super) kept_rows_per_reducer: Vec<u32>,
    pub(super) schema: Option<SchemaRef>,
    pub(super) ipc: Option<IpcOverhead>,
    pub(super) input_begin: i64,
}

pub(super) fn index_bytes(e: &WindowEntry) -> u64 {
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

pub(super) fn check_same_fields(ours: &Schema, theirs: &Schema) -> Result<()> {
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
