//! A Kafka reader in the core: Kafka's protocol spoken directly over TCP (no librdkafka),
//! record batches decoded straight into Arrow columns, one thread per partition reader that
//! reads ahead of its caller. Plain connections only (no TLS, no SASL).
//!
//! - [`wire`]: framing and primitive types; [`connection`]: one broker connection.
//! - Requests, one file each: [`api_versions`], [`metadata`], [`list_offsets`], [`fetch`]
//!   (v4: `read_committed`, aborted transactions).
//! - [`record_batch`]: record batches (magic 2) into [`columns`], with [`codec`]'s codecs.
//! - [`cluster`]: the partition's leader; [`partition_reader`]: the reader, and
//!   [`read_ahead`]: what it has decoded and not handed over yet.

pub mod api_versions;
pub mod cluster;
pub mod codec;
pub mod columns;
pub mod connection;
pub mod error;
pub mod fetch;
pub mod list_offsets;
pub mod metadata;
pub mod partition_reader;
pub mod read_ahead;
pub mod record_batch;
pub mod wire;

#[cfg(test)]
mod golden_tests;
#[cfg(test)]
mod record_batch_tests;
#[cfg(test)]
mod test_batches;

pub use cluster::ClusterConfig;
pub use columns::record_schema;
pub use error::{KafkaError, KafkaResult};
pub use partition_reader::{PartitionReader, ReaderOptions};
