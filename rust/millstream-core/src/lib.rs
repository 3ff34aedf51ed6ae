//! millstream's shuffle core, plain Rust without Python.
//!
//! A mapper keeps its mapped rows in memory in a [`Window`] (thesis 4.3.1): window entries
//! hold the rows, one [`Bucket`] per reducer tracks which rows the reducer has not committed
//! yet, and trimming frees entries every reducer has committed past (thesis 4.3.5).
//! [`SharedWindow`] wraps it for concurrent use with a memory limit to wait on. Rows leave
//! as Arrow IPC streams ([`ipc`]); keys map to reducers through a stable hash
//! ([`partition`]). FoundationDB's batch operations run through its C API in
//! [`fdb_batch`], adding counter [`lanes`]; [`kafka`] reads Kafka topic partitions into
//! Arrow batches.

pub mod bucket;
pub mod error;
pub mod fdb_batch;
pub mod ipc;
pub mod kafka;
pub mod lanes;
pub mod partition;
pub mod shared;
pub mod size;
pub mod window;

pub use bucket::Bucket;
pub use error::{Error, Result};
pub use shared::{GetRowsResult, Room, SharedWindow};
pub use window::{
    spill_schema, LocalMapperState, PreparedEntry, PushContext, Rows, SpillChunk, Window,
    WindowOptions, WindowSnapshot, SHUFFLE_INDEX_COLUMN,
};
