//! ListOffsets (v2, `read_committed`): a partition's first offset, or its last stable
//! offset (the end a `read_committed` reader can reach).

use super::connection::Request;
use super::wire::{Reader, WireResult, Writer};

/// The timestamp that asks for the partition's end (the last stable offset).
pub const LATEST: i64 = -1;
/// The timestamp that asks for the partition's log start.
pub const EARLIEST: i64 = -2;

/// ListOffsets for one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListOffsetsRequest {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// [`EARLIEST`], [`LATEST`] or a time (ms).
    pub timestamp: i64,
}

/// The answer for the partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListOffsetsResponse {
    /// Kafka's error code (0: none).
    pub error_code: i16,
    /// The offset found (-1: none).
    pub offset: i64,
}

impl Request for ListOffsetsRequest {
    const API_KEY: i16 = 2;
    const VERSION: i16 = 2;
    const NAME: &'static str = "ListOffsets";
    type Response = ListOffsetsResponse;

    fn encode(&self, w: &mut Writer) {
        w.i32(-1).i8(1); // a consumer, read_committed
        w.array_len(1).string(&self.topic).array_len(1);
        w.i32(self.partition).i64(self.timestamp);
    }

    fn decode(body: Vec<u8>, at: usize) -> WireResult<ListOffsetsResponse> {
        let mut r = Reader::new(&body[at..]);
        r.i32("throttle time")?;
        let topics = r.array_len(6, "topics")?;
        let mut found = None;
        for _ in 0..topics {
            r.string("topic")?;
            for _ in 0..r.array_len(22, "partitions")? {
                r.i32("partition")?;
                let error_code = r.i16("error code")?;
                r.i64("timestamp")?;
                let offset = r.i64("offset")?;
                found.get_or_insert(ListOffsetsResponse { error_code, offset });
            }
        }
        found.ok_or(super::wire::WireError {
            what: "the partition's answer",
            at: r.position(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_encodes() {
        let mut w = Writer::default();
        ListOffsetsRequest {
            topic: "t".into(),
            partition: 3,
            timestamp: EARLIEST,
        }
        .encode(&mut w);
        let mut expected = vec![
            0xff, 0xff, 0xff, 0xff, 1, 0, 0, 0, 1, 0, 1, b't', 0, 0, 0, 1,
        ];
        expected.extend(3i32.to_be_bytes());
        expected.extend((-2i64).to_be_bytes());
        assert_eq!(w.into_bytes(), expected);
    }

    #[test]
    fn response_decodes() {
        let mut w = Writer::default();
        w.i32(5).i32(0).array_len(1).string("t").array_len(1);
        w.i32(3).i16(0).i64(-1).i64(1234);
        let response = ListOffsetsRequest::decode(w.into_bytes(), 4).unwrap();
        assert_eq!(
            response,
            ListOffsetsResponse {
                error_code: 0,
                offset: 1234
            }
        );
    }

    #[test]
    fn a_response_without_the_partition_is_an_error() {
        let mut w = Writer::default();
        w.i32(5).i32(0).array_len(0);
        assert!(ListOffsetsRequest::decode(w.into_bytes(), 4).is_err());
    }
}
