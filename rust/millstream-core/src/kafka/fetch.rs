//! Fetch (v4, `read_committed`) of one partition: the record batches from an offset, the
//! partition's last stable offset, and the transactions aborted in the range (KIP-98), which
//! the batch decoder needs to drop aborted records.

use std::ops::Range;

use super::connection::Request;
use super::wire::{Reader, WireError, WireResult, Writer};

/// Fetch of one partition from `offset`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchRequest {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The first offset wanted.
    pub offset: i64,
    /// How long the broker may wait for data (ms).
    pub max_wait_ms: i32,
    /// Bytes asked for (the broker sends at least one whole batch even if larger).
    pub max_bytes: i32,
}

/// A transaction aborted in the fetched range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbortedTransaction {
    /// The producer that aborted it.
    pub producer_id: i64,
    /// The transaction's first offset.
    pub first_offset: i64,
}

/// The Fetch response's part for the partition; owns the response's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchResponse {
    /// Kafka's error code (0: none).
    pub error_code: i16,
    /// The partition's high watermark.
    pub high_watermark: i64,
    /// Its last stable offset (the end a `read_committed` reader sees).
    pub last_stable_offset: i64,
    /// Transactions aborted in the range, by first offset.
    pub aborted: Vec<AbortedTransaction>,
    body: Vec<u8>,
    records: Range<usize>,
}

impl FetchResponse {
    /// The record batches' bytes (the last batch may be cut short).
    pub fn records(&self) -> &[u8] {
        &self.body[self.records.clone()]
    }

    /// The response's bytes, for the next response to reuse their allocation.
    pub fn into_body(self) -> Vec<u8> {
        self.body
    }
}

impl Request for FetchRequest {
    const API_KEY: i16 = 1;
    const VERSION: i16 = 4;
    const NAME: &'static str = "Fetch";
    type Response = FetchResponse;

    fn encode(&self, w: &mut Writer) {
        w.i32(-1).i32(self.max_wait_ms).i32(1).i32(self.max_bytes);
        w.i8(1); // read_committed
        w.array_len(1).string(&self.topic).array_len(1);
        w.i32(self.partition).i64(self.offset).i32(self.max_bytes);
    }

    fn decode(body: Vec<u8>, at: usize) -> WireResult<FetchResponse> {
        let mut r = Reader::new(&body[at..]);
        r.i32("throttle time")?;
        // The request names one partition: the answer is the first of the first topic.
        let missing = WireError {
            what: "the partition's answer",
            at: at + r.position(),
        };
        if r.array_len(6, "topics")? == 0 {
            return Err(missing);
        }
        r.string("topic")?;
        if r.array_len(30, "partitions")? == 0 {
            return Err(missing);
        }
        r.i32("partition")?;
        let error_code = r.i16("error code")?;
        let high_watermark = r.i64("high watermark")?;
        let last_stable_offset = r.i64("last stable offset")?;
        let n = r.array_len(16, "aborted transactions")?;
        let mut aborted = Vec::with_capacity(n);
        for _ in 0..n {
            aborted.push(AbortedTransaction {
                producer_id: r.i64("producer id")?,
                first_offset: r.i64("first offset")?,
            });
        }
        aborted.sort_by_key(|a| a.first_offset);
        let records = r.bytes("records")?;
        let start = at + r.position() - records.len();
        Ok(FetchResponse {
            error_code,
            high_watermark,
            last_stable_offset,
            aborted,
            records: start..start + records.len(),
            body,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_encodes() {
        let mut w = Writer::default();
        FetchRequest {
            topic: "t".into(),
            partition: 2,
            offset: 7,
            max_wait_ms: 100,
            max_bytes: 1024,
        }
        .encode(&mut w);
        let mut expected = Writer::default();
        expected.i32(-1).i32(100).i32(1).i32(1024).i8(1);
        expected.array_len(1).string("t").array_len(1);
        expected.i32(2).i64(7).i32(1024);
        assert_eq!(w.into_bytes(), expected.into_bytes());
    }

    #[test]
    fn response_decodes_with_aborted_transactions_sorted() {
        let mut w = Writer::default();
        w.i32(11).i32(0).array_len(1).string("t").array_len(1);
        w.i32(2).i16(0).i64(40).i64(30).array_len(2);
        w.i64(9).i64(20).i64(8).i64(10);
        w.i32(3).raw(b"abc");
        let response = FetchRequest::decode(w.into_bytes(), 4).unwrap();
        assert_eq!(
            (response.high_watermark, response.last_stable_offset),
            (40, 30)
        );
        let firsts: Vec<i64> = response.aborted.iter().map(|a| a.first_offset).collect();
        assert_eq!(firsts, [10, 20]);
        assert_eq!(response.records(), b"abc");
    }

    #[test]
    fn null_aborted_and_null_records_read_as_empty() {
        let mut w = Writer::default();
        w.i32(11).i32(0).array_len(1).string("t").array_len(1);
        w.i32(2).i16(1).i64(-1).i64(-1).i32(-1).i32(-1);
        let response = FetchRequest::decode(w.into_bytes(), 4).unwrap();
        assert_eq!(response.error_code, 1);
        assert!(response.aborted.is_empty() && response.records().is_empty());
    }

    #[test]
    fn a_truncated_response_is_an_error() {
        let mut w = Writer::default();
        w.i32(11).i32(0).array_len(1).string("t").array_len(1);
        w.i32(2)
            .i16(0)
            .i64(40)
            .i64(30)
            .array_len(0)
            .i32(10)
            .raw(b"abc");
        assert!(FetchRequest::decode(w.into_bytes(), 4).is_err());
    }
}
