//! Record batches (magic 2) built as producers build them, for the decoder's tests.

use arrow_array::cast::AsArray;
use arrow_array::RecordBatch;

use super::codec::{tests::compress, Codec};
use super::wire::Writer;

/// The header names and values of row `row` of a decoded batch (its headers not null).
pub fn header_pairs(batch: &RecordBatch, row: usize) -> (Vec<String>, Vec<Option<Vec<u8>>>) {
    let pairs = batch.column(3).as_list::<i32>().value(row);
    let pairs = pairs.as_struct();
    let names = pairs.column(0).as_string::<i32>();
    let values = pairs.column(1).as_binary::<i32>();
    (
        names.iter().flatten().map(str::to_string).collect(),
        values.iter().map(|v| v.map(<[u8]>::to_vec)).collect(),
    )
}

/// One record of a test batch.
#[derive(Debug, Clone, Default)]
pub struct TestRecord {
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

impl TestRecord {
    /// A record with a key and a value.
    pub fn new(key: &str, value: &str) -> Self {
        Self {
            key: Some(key.into()),
            value: Some(value.into()),
            headers: Vec::new(),
        }
    }
}

/// The batch header's fields a test chooses.
#[derive(Debug, Clone, Copy)]
pub struct TestBatch {
    pub base_offset: i64,
    pub attributes: i16,
    pub producer_id: i64,
    pub first_timestamp: i64,
}

impl TestBatch {
    /// A plain batch at `base_offset`.
    pub fn at(base_offset: i64) -> Self {
        Self {
            base_offset,
            attributes: 0,
            producer_id: -1,
            first_timestamp: 1_700_000_000_000,
        }
    }

    /// A transactional batch of `producer_id`.
    pub fn transactional(base_offset: i64, producer_id: i64) -> Self {
        Self {
            attributes: 0x10,
            producer_id,
            ..Self::at(base_offset)
        }
    }

    /// The batch of `records` (timestamps 10 ms apart), compressed with `codec`.
    pub fn encode(self, codec: Codec, records: &[TestRecord]) -> Vec<u8> {
        let mut body = Writer::default();
        for (i, record) in records.iter().enumerate() {
            let mut r = Writer::default();
            r.i8(0).varint(10 * i as i64).varint(i as i64);
            r.varbytes(record.key.as_deref())
                .varbytes(record.value.as_deref());
            r.varint(record.headers.len() as i64);
            for (k, v) in &record.headers {
                r.varbytes(Some(k.as_bytes())).varbytes(v.as_deref());
            }
            body.varint(r.len() as i64).raw(&r.into_bytes());
        }
        let codec_bits = match codec {
            Codec::None => 0,
            Codec::Gzip => 1,
            Codec::Snappy => 2,
            Codec::Lz4 => 3,
            Codec::Zstd => 4,
        };
        let n = records.len().max(1) as i64;
        self.finish(
            self.attributes | codec_bits,
            n,
            &compress(codec, &body.into_bytes()),
        )
    }

    /// A control batch: the transaction's commit or abort marker.
    pub fn marker(self, abort: bool) -> Vec<u8> {
        let mut key = Writer::default();
        key.i16(0).i16(if abort { 0 } else { 1 });
        let mut value = Writer::default();
        value.i16(0).i32(0);
        let mut r = Writer::default();
        r.i8(0).varint(0).varint(0);
        r.varbytes(Some(&key.into_bytes()))
            .varbytes(Some(&value.into_bytes()))
            .varint(0);
        let mut body = Writer::default();
        body.varint(r.len() as i64).raw(&r.into_bytes());
        self.finish(self.attributes | 0x20, 1, &body.into_bytes())
    }

    fn finish(self, attributes: i16, records: i64, body: &[u8]) -> Vec<u8> {
        let mut crc_part = Writer::default();
        crc_part.i16(attributes).i32(records as i32 - 1);
        crc_part
            .i64(self.first_timestamp)
            .i64(self.first_timestamp + 10 * (records - 1));
        crc_part
            .i64(self.producer_id)
            .i16(0)
            .i32(0)
            .i32(records as i32);
        crc_part.raw(body);
        let crc_part = crc_part.into_bytes();
        let mut w = Writer::default();
        w.i64(self.base_offset)
            .i32((4 + 1 + 4 + crc_part.len()) as i32);
        w.i32(0).i8(2).raw(&crc32c::crc32c(&crc_part).to_be_bytes());
        w.raw(&crc_part);
        w.into_bytes()
    }
}
