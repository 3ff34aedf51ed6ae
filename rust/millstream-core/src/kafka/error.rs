//! What can go wrong reading Kafka: every error names the topic partition and the offset it
//! concerns where there is one, and says what to do.

use std::sync::Arc;

use super::wire::WireError;

/// Kafka error codes the reader acts on (the protocol's numbers).
pub mod code {
    /// The fetch offset is outside the partition's log.
    pub const OFFSET_OUT_OF_RANGE: i16 = 1;
    /// A message failed its CRC on the broker.
    pub const CORRUPT_MESSAGE: i16 = 2;
    /// The broker does not know the topic or partition (yet).
    pub const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
    /// The partition has no leader now.
    pub const LEADER_NOT_AVAILABLE: i16 = 5;
    /// The broker asked does not lead the partition.
    pub const NOT_LEADER_OR_FOLLOWER: i16 = 6;
    /// The request timed out on the broker.
    pub const REQUEST_TIMED_OUT: i16 = 7;
    /// The broker's replica is not available.
    pub const REPLICA_NOT_AVAILABLE: i16 = 9;
    /// The broker's disk failed for this partition.
    pub const KAFKA_STORAGE_ERROR: i16 = 56;
    /// The leader epoch asked is older than the leader's.
    pub const FENCED_LEADER_EPOCH: i16 = 74;
    /// The leader epoch asked is newer than the leader's.
    pub const UNKNOWN_LEADER_EPOCH: i16 = 75;
    /// The offset is not yet available (a new leader is catching up).
    pub const OFFSET_NOT_AVAILABLE: i16 = 78;

    /// Whether asking again (after refreshing metadata) can succeed.
    pub fn retriable(code: i16) -> bool {
        matches!(
            code,
            UNKNOWN_TOPIC_OR_PARTITION
                | LEADER_NOT_AVAILABLE
                | NOT_LEADER_OR_FOLLOWER
                | REQUEST_TIMED_OUT
                | REPLICA_NOT_AVAILABLE
                | KAFKA_STORAGE_ERROR
                | FENCED_LEADER_EPOCH
                | UNKNOWN_LEADER_EPOCH
                | OFFSET_NOT_AVAILABLE
        )
    }
}

/// Everything that can go wrong talking to Kafka brokers.
#[derive(Debug, Clone, thiserror::Error)]
pub enum KafkaError {
    /// A broker cannot be reached, or closed the connection.
    #[error("broker {broker}: {source}; check that it runs and is reachable")]
    Io {
        /// The broker's address.
        broker: String,
        /// The socket error.
        source: Arc<std::io::Error>,
    },

    /// A response that does not decode.
    #[error(
        "broker {broker} sent a {api} response that does not decode ({source}); it may not \
         speak this protocol version"
    )]
    Malformed {
        /// The broker's address.
        broker: String,
        /// The request's name.
        api: &'static str,
        /// Where decoding stopped.
        source: WireError,
    },

    /// A response to another request than the one sent.
    #[error("broker {broker} answered correlation id {got} to request {sent}")]
    Correlation {
        /// The broker's address.
        broker: String,
        /// Correlation id sent.
        sent: i32,
        /// Correlation id received.
        got: i32,
    },

    /// The broker lacks a request version the reader needs.
    #[error(
        "broker {broker} does not support {api} v{version} (it supports {min}-{max}); \
         millstream's Kafka reader needs Kafka 0.11 or later"
    )]
    UnsupportedVersion {
        /// The broker's address.
        broker: String,
        /// The request's name.
        api: &'static str,
        /// The version needed.
        version: i16,
        /// Lowest supported.
        min: i16,
        /// Highest supported.
        max: i16,
    },

    /// An error code the reader cannot recover from.
    #[error("topic {topic:?} partition {partition}: {api} failed with Kafka error code {code}")]
    Broker {
        /// The request's name.
        api: &'static str,
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// Kafka's error code.
        code: i16,
    },

    /// The offset asked is not in the partition's log (deleted by retention, or not yet
    /// written).
    #[error(
        "topic {topic:?} partition {partition}: offset {offset} is out of the partition's \
         range [{log_start}, {end}) (records deleted by retention, or the topic was recreated)"
    )]
    OffsetOutOfRange {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The offset asked.
        offset: i64,
        /// The partition's first offset when the fetch failed (-1: unknown).
        log_start: i64,
        /// Its last stable offset then (-1: unknown).
        end: i64,
    },

    /// A record batch that does not decode: a failed CRC, a bad length, an unknown codec.
    #[error(
        "topic {topic:?} partition {partition}: the record batch at offset {offset} is \
         corrupt ({reason}); nothing of it was read. Check the broker's log segment, or \
         start a new processor past it"
    )]
    CorruptBatch {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The batch's base offset.
        offset: i64,
        /// What is wrong with it.
        reason: String,
    },
}

impl KafkaError {
    /// Whether reconnecting (and refreshing metadata) may get past this error.
    pub fn retriable(&self) -> bool {
        match self {
            Self::Io { .. } | Self::Correlation { .. } => true,
            Self::Broker { code, .. } => code::retriable(*code),
            _ => false,
        }
    }
}

/// Result of talking to Kafka.
pub type KafkaResult<T> = Result<T, KafkaError>;
