//! Sizes of rows without encoding them: the bytes a row range takes in an Arrow IPC stream
//! (the GetRows byte cap) and the bytes a batch's buffers hold in memory (the window's
//! memory limit).
//!
//! [`ipc_body_bytes`] follows what the IPC writer (`arrow_ipc::writer`, alignment 8)
//! copies for a slice: only the sliced range of fixed-width values, offsets and the values
//! they span; whole buffers where the writer sends them whole (views' data buffers,
//! dictionaries, unions, run-end encoding). It never counts less than the writer writes;
//! the tests check it against real encodings.

use std::ops::Range;

use arrow_array::cast::AsArray;
use arrow_array::{Array, OffsetSizeTrait, RecordBatch};
use arrow_data::ArrayData;
use arrow_schema::{DataType, SchemaRef};

use crate::error::Result;
use crate::ipc;

/// Buffers in IPC bodies are padded to this many bytes.
const ALIGNMENT: u64 = 8;

/// Header bytes a batch with rows may take beyond the header of an empty one: flatbuffers
/// leave out scalar fields that are zero (the row count, the body length), with padding.
const HEADER_SLACK: u64 = 32;

fn pad(bytes: u64) -> u64 {
    bytes.div_ceil(ALIGNMENT) * ALIGNMENT
}

/// What an IPC stream of one schema takes besides its rows' buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpcOverhead {
    /// Schema message and end-of-stream marker: once per stream.
    pub stream_bytes: u64,
    /// Message header of one record batch (and of the dictionary batches it may need):
    /// once per batch of the stream.
    pub batch_bytes: u64,
}

impl IpcOverhead {
    /// Measures the overhead of `schema` by encoding a stream without rows.
    pub fn of(schema: &SchemaRef) -> Result<Self> {
        let stream_bytes = ipc::encode(schema, &[])?.len() as u64;
        let empty = RecordBatch::new_empty(schema.clone());
        let with_batch = ipc::encode(schema, &[empty])?.len() as u64;
        Ok(Self {
            stream_bytes,
            batch_bytes: with_batch - stream_bytes + HEADER_SLACK,
        })
    }

    /// Bytes of a stream holding rows `range` of `batch` as one record batch.
    pub fn stream_of(&self, batch: &RecordBatch, range: Range<usize>) -> u64 {
        self.stream_bytes + self.batch_bytes + ipc_body_bytes(batch, range)
    }
}

/// Body bytes of rows `range` of `batch` in an IPC record batch message (an upper bound;
/// exact for primitive, boolean, string, binary, list and struct columns).
pub fn ipc_body_bytes(batch: &RecordBatch, range: Range<usize>) -> u64 {
    batch
        .columns()
        .iter()
        .map(|c| array_body_bytes(c.as_ref(), range.clone()))
        .sum()
}

/// [`ipc_body_bytes`] of one array.
pub fn array_body_bytes(array: &dyn Array, range: Range<usize>) -> u64 {
    let rows = range.len() as u64;
    let data_type = array.data_type();
    let validity = match data_type {
        DataType::Null | DataType::Union(..) | DataType::RunEndEncoded(..) => 0,
        _ if array.null_count() > 0 => pad(rows.div_ceil(8)),
        _ => 0,
    };
    let body = match data_type {
        DataType::Null => 0,
        DataType::Boolean => pad(rows.div_ceil(8)),
        DataType::Utf8 => byte_array(array.as_string::<i32>().value_offsets(), range),
        DataType::Binary => byte_array(array.as_binary::<i32>().value_offsets(), range),
        DataType::LargeUtf8 => byte_array(array.as_string::<i64>().value_offsets(), range),
        DataType::LargeBinary => byte_array(array.as_binary::<i64>().value_offsets(), range),
        DataType::List(_) => list::<i32>(array, range),
        DataType::LargeList(_) => list::<i64>(array, range),
        DataType::Map(..) => {
            let map = array.as_map();
            let offsets = map.value_offsets();
            let child = offsets[range.start] as usize..offsets[range.end] as usize;
            pad(4 * (rows + 1)) + struct_body_bytes(map.entries().columns(), child)
        }
        DataType::FixedSizeList(_, size) => {
            let size = *size as usize;
            let child = range.start * size..range.end * size;
            array_body_bytes(array.as_fixed_size_list().values().as_ref(), child)
        }
        DataType::Struct(_) => struct_body_bytes(array.as_struct().columns(), range),
        DataType::Dictionary(..) => {
            let dictionary = array.as_any_dictionary();
            let keys = dictionary.keys();
            let values = dictionary.values();
            let key_width = keys.data_type().primitive_width().unwrap_or(8) as u64;
            // The writer sends the whole dictionary (in a dictionary batch) with the keys.
            pad(key_width * rows) + array_body_bytes(values.as_ref(), 0..values.len())
        }
        other => match other.primitive_width() {
            Some(width) => pad(width as u64 * rows),
            None => match other {
                DataType::FixedSizeBinary(width) => pad(*width as u64 * rows),
                _ => whole_buffers(&array.to_data()),
            },
        },
    };
    validity + body
}

fn struct_body_bytes(columns: &[arrow_array::ArrayRef], range: Range<usize>) -> u64 {
    columns
        .iter()
        .map(|c| array_body_bytes(c.as_ref(), range.clone()))
        .sum()
}

fn byte_array<O: OffsetSizeTrait>(offsets: &[O], range: Range<usize>) -> u64 {
    let values = offsets[range.end].as_usize() - offsets[range.start].as_usize();
    pad((O::get_byte_width() * (range.len() + 1)) as u64) + pad(values as u64)
}

fn list<O: OffsetSizeTrait>(array: &dyn Array, range: Range<usize>) -> u64 {
    let list = array.as_list::<O>();
    let offsets = list.value_offsets();
    let child = offsets[range.start].as_usize()..offsets[range.end].as_usize();
    pad((O::get_byte_width() * (range.len() + 1)) as u64)
        + array_body_bytes(list.values().as_ref(), child)
}

/// Everything an array's buffers and children hold, padded, plus 32 bytes of header per
/// buffer: for layouts the IPC writer sends whole (views, unions, run-end encoding).
fn whole_buffers(data: &ArrayData) -> u64 {
    let own: u64 = data
        .buffers()
        .iter()
        .map(|b| pad(b.len() as u64) + 32)
        .sum();
    let nulls = data
        .nulls()
        .map_or(0, |n| pad(n.buffer().len() as u64) + 32);
    own + nulls + data.child_data().iter().map(whole_buffers).sum::<u64>()
}

/// Bytes of memory `batch`'s buffers keep allocated, each allocation counted once, however
/// many columns or slices share it.
pub fn held_bytes(batch: &RecordBatch) -> u64 {
    let mut seen: Vec<(usize, usize)> = Vec::new();
    for column in batch.columns() {
        collect_allocations(&column.to_data(), &mut seen);
    }
    seen.iter().map(|&(_, capacity)| capacity as u64).sum()
}

fn collect_allocations(data: &ArrayData, seen: &mut Vec<(usize, usize)>) {
    let mut note = |b: &arrow_buffer::Buffer| {
        let start = b.data_ptr().as_ptr() as usize;
        match seen.iter_mut().find(|(s, _)| *s == start) {
            Some((_, capacity)) => *capacity = (*capacity).max(b.capacity()),
            None => seen.push((start, b.capacity())),
        }
    };
    for b in data.buffers() {
        note(b);
    }
    if let Some(n) = data.nulls() {
        note(n.buffer());
    }
    for child in data.child_data() {
        collect_allocations(child, seen);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::builder::{ListBuilder, StringBuilder};
    use arrow_array::types::Int32Type;
    use arrow_array::{
        ArrayRef, BooleanArray, DictionaryArray, FixedSizeListArray, Int32Array, Int64Array,
        LargeStringArray, StringArray, StringViewArray, StructArray,
    };
    use arrow_schema::Field;

    use super::*;

    fn batch() -> RecordBatch {
        let n = 300;
        let strings: ArrayRef = Arc::new(StringArray::from_iter(
            (0..n).map(|i| (i % 7 != 0).then(|| "x".repeat(i % 50))),
        ));
        let mut lists = ListBuilder::new(StringBuilder::new());
        for i in 0..n {
            for j in 0..i % 4 {
                lists.values().append_value(format!("{i}-{j}"));
            }
            lists.append(i % 5 != 0);
        }
        let fixed = FixedSizeListArray::from_iter_primitive::<Int32Type, _, _>(
            (0..n).map(|i| Some(vec![Some(i as i32), None, Some(1)])),
            3,
        );
        let structs = StructArray::from(vec![
            (
                Arc::new(Field::new("a", DataType::Int64, false)),
                Arc::new(Int64Array::from_iter_values(0..n as i64)) as ArrayRef,
            ),
            (
                Arc::new(Field::new("b", DataType::LargeUtf8, true)),
                Arc::new(LargeStringArray::from_iter(
                    (0..n).map(|i| (i % 3 != 0).then(|| "y".repeat(i % 9))),
                )) as ArrayRef,
            ),
        ]);
        let dictionary: DictionaryArray<Int32Type> =
            (0..n).map(|i| ["a", "bb", "ccc"][i % 3]).collect();
        let views: ArrayRef = Arc::new(StringViewArray::from_iter_values(
            (0..n).map(|i| "z".repeat(i % 40)),
        ));
        RecordBatch::try_from_iter([
            ("s", strings),
            ("l", Arc::new(lists.finish()) as ArrayRef),
            ("f", Arc::new(fixed) as ArrayRef),
            ("t", Arc::new(structs) as ArrayRef),
            ("d", Arc::new(dictionary) as ArrayRef),
            ("v", views),
            (
                "b",
                Arc::new(BooleanArray::from_iter((0..n).map(|i| Some(i % 2 == 0)))) as ArrayRef,
            ),
            (
                "i",
                Arc::new(Int32Array::from_iter(
                    (0..n).map(|i| (i % 4 != 0).then_some(i as i32)),
                )) as ArrayRef,
            ),
        ])
        .unwrap()
    }

    #[test]
    fn estimates_never_fall_below_real_encodings() {
        let b = batch();
        let overhead = IpcOverhead::of(&b.schema()).unwrap();
        for (start, len) in [(0, 1), (0, 300), (13, 1), (13, 77), (150, 150), (299, 1)] {
            let real = ipc::encode(&b.schema(), &[b.slice(start, len)])
                .unwrap()
                .len() as u64;
            let estimate = overhead.stream_of(&b, start..start + len);
            assert!(estimate >= real, "{start}+{len}: {estimate} < {real}");
        }
    }

    #[test]
    fn estimates_are_exact_for_plain_columns() {
        let b = RecordBatch::try_from_iter([
            (
                "s",
                Arc::new(StringArray::from_iter_values(
                    (0..1000).map(|i| "q".repeat(i % 100)),
                )) as ArrayRef,
            ),
            (
                "i",
                Arc::new(Int64Array::from_iter(
                    (0..1000).map(|i| (i % 3 != 0).then_some(i)),
                )),
            ),
        ])
        .unwrap();
        let overhead = IpcOverhead::of(&b.schema()).unwrap();
        for (start, len) in [(0, 1), (5, 995), (321, 17)] {
            let real = ipc::encode(&b.schema(), &[b.slice(start, len)])
                .unwrap()
                .len() as u64;
            let estimate = overhead.stream_of(&b, start..start + len);
            // The empty batch measured for the header carries an 8-byte offsets buffer.
            assert!(
                (real..=real + 8 + HEADER_SLACK).contains(&estimate),
                "{start}+{len}: {estimate} vs {real}"
            );
        }
    }

    #[test]
    fn held_bytes_counts_a_shared_allocation_once() {
        let values: ArrayRef = Arc::new(Int64Array::from_iter_values(0..1000));
        let whole = RecordBatch::try_from_iter([("a", values.clone())]).unwrap();
        let twice =
            RecordBatch::try_from_iter([("a", values.slice(0, 10)), ("b", values.slice(990, 10))])
                .unwrap();
        assert_eq!(held_bytes(&twice), held_bytes(&whole));
        assert!(held_bytes(&whole) >= 8000);
    }
}
