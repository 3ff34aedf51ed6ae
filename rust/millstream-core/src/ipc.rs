//! Arrow IPC streams, the wire format of rows from mappers to reducers (uncompressed: the
//! link is loopback or a fast network, and compression would cost more CPU than it saves).
//!
//! [`encode`] turns zero-copy slices of window entries into the segments of one IPC stream
//! without copying their buffers; the caller copies the segments once into its output (for
//! Python, straight into a `bytes` object). [`decode_concat`] is the reducer side.

use arrow_array::RecordBatch;
use arrow_buffer::Buffer;
use arrow_ipc::reader::StreamDecoder;
use arrow_ipc::writer::{IpcWriteOptions, StreamEncoder};
use arrow_ipc::MetadataVersion;
use arrow_schema::{ArrowError, Schema, SchemaRef};
use arrow_select::concat::concat_batches;

use crate::error::{Error, Result};

/// One encoded IPC stream, as a list of segments that reference the batches' buffers.
#[derive(Debug, Default, Clone)]
pub struct IpcPayload {
    segments: Vec<Buffer>,
    len: usize,
}

impl IpcPayload {
    /// Length of the stream in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a payload of no bytes (never produced by [`encode`]).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies the stream into `out`, which must be exactly [`len`](Self::len) bytes long.
    pub fn write_to(&self, out: &mut [u8]) {
        assert_eq!(
            out.len(),
            self.len,
            "output length must equal the payload length"
        );
        let mut at = 0;
        for s in &self.segments {
            out[at..at + s.len()].copy_from_slice(s.as_slice());
            at += s.len();
        }
    }

    /// The stream as one vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = vec![0; self.len];
        self.write_to(&mut out);
        out
    }
}

fn write_options() -> IpcWriteOptions {
    IpcWriteOptions::try_new(8, false, MetadataVersion::V5).expect("8 is a valid alignment")
}

/// Encodes `batches` (all of `schema`) as one IPC stream: schema, batches, end of stream.
/// With no batches the stream holds the schema only, which is still a valid stream.
pub fn encode(schema: &Schema, batches: &[RecordBatch]) -> Result<IpcPayload> {
    let mut encoder = StreamEncoder::try_new_with_options(schema, write_options())?;
    let mut segments = Vec::with_capacity(4 * batches.len() + 4);
    for b in batches {
        segments.extend(encoder.encode(b)?);
    }
    segments.extend(encoder.finish()?);
    let len = segments.iter().map(Buffer::len).sum();
    Ok(IpcPayload { segments, len })
}

/// Decodes IPC stream payloads and concatenates all their rows into one batch: the
/// reducer's side, run on the payloads of one round.
///
/// Payloads with no rows only contribute their schema; empty payloads (zero bytes, what a
/// GetRows with no rows returns) are skipped. The decoded arrays point into the payloads'
/// buffers (no copy) when there is one batch; several are concatenated once. All payloads
/// with rows must have the same fields (names, types, nullability). With no rows at all,
/// the result has the schema of the first payload that has one (no columns if none has).
pub fn decode_concat(payloads: impl IntoIterator<Item = Buffer>) -> Result<RecordBatch> {
    let decode_error = |e: ArrowError| Error::Decode(e.to_string());
    let mut schema: Option<SchemaRef> = None;
    let mut batches: Vec<RecordBatch> = Vec::new();
    for (index, mut buffer) in payloads.into_iter().enumerate() {
        if buffer.is_empty() {
            continue;
        }
        let mut decoder = StreamDecoder::new();
        while !buffer.is_empty() {
            if let Some(batch) = decoder.decode(&mut buffer).map_err(decode_error)? {
                if batch.num_rows() == 0 {
                    continue;
                }
                if let Some(first) = batches.first() {
                    if first.schema().fields() != batch.schema().fields() {
                        return Err(Error::Decode(format!(
                            "payload {index} has the fields {:?}, an earlier one {:?}; the \
                             mappers' map functions return different schemas",
                            batch.schema().fields(),
                            first.schema().fields()
                        )));
                    }
                }
                batches.push(batch);
            }
        }
        decoder.finish().map_err(decode_error)?;
        if schema.is_none() {
            schema = decoder.schema();
        }
    }
    let schema = match batches.first() {
        Some(b) => b.schema(),
        None => schema.unwrap_or_else(|| SchemaRef::new(Schema::empty())),
    };
    match batches.len() {
        1 => Ok(batches.pop().expect("one batch")),
        _ => Ok(concat_batches(&schema, &batches).map_err(decode_error)?),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{ArrayRef, Int64Array, StringArray};

    use super::*;

    fn batch(range: std::ops::Range<i64>) -> RecordBatch {
        RecordBatch::try_from_iter([
            (
                "i",
                Arc::new(Int64Array::from_iter_values(range.clone())) as ArrayRef,
            ),
            (
                "s",
                Arc::new(StringArray::from_iter_values(
                    range.map(|i| format!("row {i}")),
                )),
            ),
        ])
        .unwrap()
    }

    #[test]
    fn slices_round_trip_through_several_payloads() {
        let b = batch(0..100);
        let p1 = encode(&b.schema(), &[b.slice(3, 10), b.slice(50, 7)]).unwrap();
        let p2 = encode(&b.schema(), &[b.slice(90, 10)]).unwrap();
        let empty = encode(&b.schema(), &[]).unwrap();
        let out = decode_concat([
            Buffer::from_vec(p1.to_vec()),
            Buffer::from_vec(empty.to_vec()),
            Buffer::from_vec(p2.to_vec()),
        ])
        .unwrap();
        let expected = concat_batches(
            &b.schema(),
            &[b.slice(3, 10), b.slice(50, 7), b.slice(90, 10)],
        )
        .unwrap();
        assert_eq!(out, expected);
    }

    #[test]
    fn schema_only_payloads_keep_the_schema() {
        let b = batch(0..1);
        let p = encode(&b.schema(), &[]).unwrap();
        let out = decode_concat([Buffer::from_vec(p.to_vec())]).unwrap();
        assert_eq!(out.num_rows(), 0);
        assert_eq!(out.schema(), b.schema());
        let none = decode_concat(Vec::<Buffer>::new()).unwrap();
        assert_eq!(none.num_columns(), 0);
    }

    #[test]
    fn payloads_of_different_fields_are_an_error() {
        let b = batch(0..3);
        let renamed = RecordBatch::try_from_iter([(
            "j",
            Arc::new(Int64Array::from_iter_values(0..3)) as ArrayRef,
        )])
        .unwrap();
        let p1 = encode(&b.schema(), std::slice::from_ref(&b)).unwrap();
        let p2 = encode(&renamed.schema(), &[renamed]).unwrap();
        let err = decode_concat([Buffer::from_vec(p1.to_vec()), Buffer::from_vec(p2.to_vec())])
            .unwrap_err();
        assert!(matches!(err, Error::Decode(_)), "{err}");
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(decode_concat([Buffer::from_vec(vec![1u8, 2, 3, 4, 5, 6, 7, 8, 9])]).is_err());
    }
}
