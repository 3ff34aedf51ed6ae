//! Record batches (magic 2) decoded into [`RecordColumns`], as a `read_committed` consumer
//! sees them: each batch's CRC-32C is checked, compressed batches are decompressed, control
//! batches are dropped, and so are the batches of the transactions the Fetch response lists
//! as aborted (KIP-98: a producer's batches from the aborted transaction's first offset up
//! to its abort marker).

use std::collections::HashSet;

use super::codec::Codec;
use super::columns::{Header, RecordColumns};
use super::error::{KafkaError, KafkaResult};
use super::fetch::AbortedTransaction;
use super::wire::{Reader, WireResult};

/// Bytes of a batch before its records.
const HEADER_BYTES: usize = 61;
/// Bytes of the batch header covered by the batch length (after offset and length).
const LENGTH_PREFIX: usize = 12;
/// Where a batch's last offset delta starts.
const LAST_OFFSET_DELTA: usize = 23;
/// Where a batch's record count starts.
const RECORD_COUNT: usize = 57;
const TIMESTAMP_LOG_APPEND: i16 = 0x08;
const TRANSACTIONAL: i16 = 0x10;
const CONTROL: i16 = 0x20;
/// A control record's type for an abort marker.
const ABORT_MARKER: i16 = 0;

/// The partition whose batches are decoded, for the records' column and for errors.
#[derive(Debug, Clone, Copy)]
pub struct BatchSource<'a> {
    /// The topic.
    pub topic: &'a str,
    /// The partition.
    pub partition: i32,
}

impl BatchSource<'_> {
    fn corrupt(&self, offset: i64, reason: impl Into<String>) -> KafkaError {
        KafkaError::CorruptBatch {
            topic: self.topic.to_string(),
            partition: self.partition,
            offset,
            reason: reason.into(),
        }
    }
}

/// What decoding a Fetch response's records did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decoded {
    /// The next offset to fetch: past every whole batch read (and at most `end`).
    pub next_offset: i64,
    /// Whole batches found (0: the first batch was cut short, fetch more bytes).
    pub batches: usize,
}

/// Where decoding `records` from `position` (stopping at `end`) will get to, read from the
/// whole batches' lengths and last offset deltas alone (no CRC, no records): the same
/// [`Decoded`] that [`decode_batches`] returns for them when they decode, and the number of
/// records those batches hold. A reader sends its next fetch from there before it decodes.
pub fn scan_batches(records: &[u8], position: i64, end: Option<i64>) -> (Decoded, usize) {
    let end = end.unwrap_or(i64::MAX);
    let mut next_offset = position;
    let (mut batches, mut count) = (0usize, 0usize);
    for batch in WholeBatches::new(records) {
        let Ok((base, batch)) = batch else { break };
        if next_offset >= end || batch.len() < HEADER_BYTES {
            break;
        }
        batches += 1;
        let last = base + i64::from(be_i32(&batch[LAST_OFFSET_DELTA..]));
        if last >= next_offset {
            next_offset = (last + 1).min(end);
            count += usize::try_from(be_i32(&batch[RECORD_COUNT..])).unwrap_or(0);
        }
    }
    let decoded = Decoded {
        next_offset,
        batches,
    };
    (decoded, count)
}

fn be_i32(bytes: &[u8]) -> i32 {
    i32::from_be_bytes(bytes[..4].try_into().expect("4 bytes"))
}

/// The whole batches at the front of a Fetch response's records, each with its base offset;
/// they end at the first batch the fetch size cut short. A negative length is an error
/// (the base offset and the length).
struct WholeBatches<'a> {
    records: &'a [u8],
    at: usize,
}

impl<'a> WholeBatches<'a> {
    fn new(records: &'a [u8]) -> Self {
        Self { records, at: 0 }
    }
}

impl<'a> Iterator for WholeBatches<'a> {
    type Item = Result<(i64, &'a [u8]), (i64, i32)>;

    fn next(&mut self) -> Option<Self::Item> {
        let (records, at) = (self.records, self.at);
        if at + LENGTH_PREFIX > records.len() {
            return None;
        }
        let base = i64::from_be_bytes(records[at..at + 8].try_into().expect("8 bytes"));
        let length = be_i32(&records[at + 8..]);
        let Ok(bytes) = usize::try_from(length) else {
            self.at = records.len();
            return Some(Err((base, length)));
        };
        let stop = at + LENGTH_PREFIX + bytes;
        if stop > records.len() {
            return None; // cut short by the fetch size
        }
        self.at = stop;
        Some(Ok((base, &records[at..stop])))
    }
}

/// Decodes the record batches in `records` (a Fetch response's, its last batch possibly cut
/// short) into `out`: the committed records at offsets in `[position, end)`.
pub fn decode_batches(
    source: BatchSource<'_>,
    records: &[u8],
    aborted: &[AbortedTransaction],
    position: i64,
    end: Option<i64>,
    out: &mut RecordColumns,
) -> KafkaResult<Decoded> {
    let end = end.unwrap_or(i64::MAX);
    let mut next_offset = position;
    let mut aborted = aborted.iter().peekable();
    let mut aborting: HashSet<i64> = HashSet::new();
    let mut batches = 0usize;
    let mut whole = WholeBatches::new(records);
    while next_offset < end {
        let Some(batch) = whole.next() else { break };
        let (base, batch) = batch
            .map_err(|(base, length)| source.corrupt(base, format!("batch length {length}")))?;
        batches += 1;
        let header = BatchHeader::read(batch).map_err(|e| source.corrupt(base, e))?;
        let last = base + i64::from(header.last_offset_delta);
        if last < next_offset {
            continue;
        }
        while let Some(a) = aborted.next_if(|a| a.first_offset <= last) {
            aborting.insert(a.producer_id);
        }
        let crc = crc32c::crc32c(&batch[21..]);
        if crc != header.crc {
            return Err(source.corrupt(
                base,
                format!("CRC-32C {crc:#010x}, the batch says {:#010x}", header.crc),
            ));
        }
        let codec =
            Codec::from_attributes(header.attributes).map_err(|e| source.corrupt(base, e))?;
        let body = codec
            .decompress(&batch[HEADER_BYTES..], batch.len() * 2)
            .map_err(|e| source.corrupt(base, e))?;
        if header.attributes & CONTROL != 0 {
            if control_type(&body).map_err(|e| source.corrupt(base, e.to_string()))? == ABORT_MARKER
            {
                aborting.remove(&header.producer_id);
            }
        } else if header.attributes & TRANSACTIONAL == 0 || !aborting.contains(&header.producer_id)
        {
            let walk = Walk {
                base,
                header: &header,
                from: next_offset,
                end,
            };
            walk.records(&body, out)
                .map_err(|e| source.corrupt(base, format!("record {e}")))?;
        }
        next_offset = (last + 1).min(end);
    }
    Ok(Decoded {
        next_offset,
        batches,
    })
}

/// The fields of a batch header the decoder uses.
#[derive(Debug)]
struct BatchHeader {
    crc: u32,
    attributes: i16,
    last_offset_delta: i32,
    first_timestamp: i64,
    max_timestamp: i64,
    producer_id: i64,
    records: i32,
}

impl BatchHeader {
    fn read(batch: &[u8]) -> Result<Self, String> {
        let mut r = Reader::new(batch);
        let mut fields = || -> WireResult<(i8, Self)> {
            r.take(16, "batch offset, length and leader epoch")?;
            let magic = r.i8("magic")?;
            let crc = r.u32("crc")?;
            let attributes = r.i16("attributes")?;
            let last_offset_delta = r.i32("last offset delta")?;
            let first_timestamp = r.i64("first timestamp")?;
            let max_timestamp = r.i64("max timestamp")?;
            let producer_id = r.i64("producer id")?;
            r.take(6, "producer epoch and base sequence")?;
            let records = r.i32("records")?;
            let header = Self {
                crc,
                attributes,
                last_offset_delta,
                first_timestamp,
                max_timestamp,
                producer_id,
                records,
            };
            Ok((magic, header))
        };
        let (magic, header) = fields().map_err(|e| e.to_string())?;
        if magic != 2 {
            return Err(format!(
                "message format v{magic}: only record batches (v2, Kafka 0.11 and later) are read"
            ));
        }
        Ok(header)
    }
}

/// The type of a control batch's record (its key: version, type).
fn control_type(body: &[u8]) -> WireResult<i16> {
    let mut r = Reader::new(body);
    r.varint("record length")?;
    r.i8("record attributes")?;
    r.varint("timestamp delta")?;
    r.varint("offset delta")?;
    let key = r.varbytes("control key")?.unwrap_or_default();
    let mut key = Reader::new(key);
    key.i16("control key version")?;
    key.i16("control type")
}

/// How one batch's records are walked.
struct Walk<'h> {
    base: i64,
    header: &'h BatchHeader,
    from: i64,
    end: i64,
}

impl Walk<'_> {
    fn records(&self, body: &[u8], out: &mut RecordColumns) -> WireResult<()> {
        let mut r = Reader::new(body);
        let mut headers: Vec<Header<'_>> = Vec::new();
        for _ in 0..self.header.records.max(0) {
            let length = r.varint("length")?;
            let start = r.position();
            r.i8("attributes")?;
            let delta = r.varint("timestamp delta")?;
            let offset = self.base + r.varint("offset delta")?;
            let key = r.varbytes("key")?;
            let value = r.varbytes("value")?;
            headers.clear();
            for _ in 0..r.varint("header count")?.max(0) {
                let at = r.position();
                let k = r.varbytes("header key")?.unwrap_or_default();
                let k = std::str::from_utf8(k).map_err(|_| super::wire::WireError {
                    what: "header key (not UTF-8)",
                    at,
                })?;
                headers.push((k, r.varbytes("header value")?));
            }
            if r.position() - start != length as usize {
                return Err(super::wire::WireError {
                    what: "record length",
                    at: start,
                });
            }
            if offset >= self.end {
                break;
            }
            if offset >= self.from {
                let timestamp = if self.header.attributes & TIMESTAMP_LOG_APPEND != 0 {
                    self.header.max_timestamp
                } else {
                    self.header.first_timestamp + delta
                };
                out.push(offset, timestamp, key, value, &headers);
            }
        }
        Ok(())
    }
}
