//! Kafka's Fetch spoken directly: millstream's own reader (`millstream_core::kafka`, the
//! one `KafkaTopic` uses), one partition read `read_committed` into Arrow columns, a fetch
//! ahead of the sink. What reading costs when nothing sits between the socket and the
//! columns but the core's decoder.

use std::time::Duration;

use millstream_core::kafka::{ClusterConfig, PartitionReader, ReaderOptions};

use arrow_array::ArrayRef;

use crate::{Target, BATCH_ROWS};

/// Bytes asked for per fetch.
const FETCH_BYTES: i32 = 64 << 20;
/// The core's batches' columns this program hands on: key, value, timestamp, offset.
const COLUMNS: [usize; 4] = [0, 1, 2, 5];

/// Reads `target` from its start offset to its end offset, handing each batch's columns to `sink`.
pub fn read(target: &Target, sink: &mut dyn FnMut(Vec<ArrayRef>)) {
    let mut reader = PartitionReader::start(ReaderOptions {
        cluster: ClusterConfig::from_servers(
            &target.bootstrap,
            "kafka-floor",
            Duration::from_secs(30),
        ),
        topic: target.topic.clone(),
        partition: target.partition,
        start: target.start,
        end: Some(target.end),
        max_wait_ms: 100,
        fetch_bytes: FETCH_BYTES,
        read_ahead_bytes: 64 << 20,
    });
    while !reader.ended() {
        let batch = reader
            .read(BATCH_ROWS, Duration::from_secs(1))
            .expect("read the partition");
        if let Some(batch) = batch {
            sink(COLUMNS.iter().map(|&c| batch.column(c).clone()).collect());
        }
    }
}
