//! Reads topic partition `PARTITION` from offset `START` up to offset `END` with
//! `read_committed` isolation into Arrow columns (key, value, timestamp, offset), in batches
//! of up to 65,536 records, and prints one JSON line: the reader, the records read, and the
//! wall and CPU seconds of this process (every thread, librdkafka's included). With `--ipc`,
//! the batches go to standard output as an Arrow IPC stream and the JSON line to standard
//! error (`bench/kafka_floor.py` reads a topic that way in the keyed-sum job).
//!
//! Usage: `kafka-floor READER BOOTSTRAP TOPIC PARTITION START END [--ipc]`, READER one of
//! `fetch` (Kafka's Fetch request: millstream's core reader; see `fetch.rs`), and with the `rdkafka`
//! feature `rdkafka` (librdkafka, one poll per record) and `rdkafka-batch` (librdkafka's
//! batch consume).

use std::time::Instant;

use std::sync::Arc;

#[cfg(feature = "rdkafka")]
use arrow_array::builder::{
    ArrayBuilder, BinaryBuilder, Int64Builder, TimestampMillisecondBuilder,
};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_ipc::writer::StreamWriter;
use arrow_schema::{DataType, Field, Schema, TimeUnit};

mod fetch;
#[cfg(feature = "rdkafka")]
mod librdkafka;

/// Records per Arrow batch.
const BATCH_ROWS: usize = 65_536;

/// The columns of one batch of records, as the librdkafka readers build them.
#[cfg(feature = "rdkafka")]
struct Columns {
    keys: BinaryBuilder,
    values: BinaryBuilder,
    timestamps: TimestampMillisecondBuilder,
    offsets: Int64Builder,
}

#[cfg(feature = "rdkafka")]
impl Columns {
    /// Empty columns with room for a batch of 80-byte values.
    fn new() -> Self {
        Self {
            keys: BinaryBuilder::with_capacity(BATCH_ROWS, BATCH_ROWS * 8),
            values: BinaryBuilder::with_capacity(BATCH_ROWS, BATCH_ROWS * 80),
            timestamps: TimestampMillisecondBuilder::with_capacity(BATCH_ROWS).with_timezone("UTC"),
            offsets: Int64Builder::with_capacity(BATCH_ROWS),
        }
    }

    /// Appends one record.
    fn push(&mut self, key: Option<&[u8]>, value: Option<&[u8]>, timestamp: i64, offset: i64) {
        self.keys.append_option(key);
        self.values.append_option(value);
        self.timestamps.append_value(timestamp);
        self.offsets.append_value(offset);
    }

    /// Records appended since the last `finish`.
    fn len(&self) -> usize {
        self.offsets.len()
    }

    /// The batch's arrays (the builders start again empty).
    fn finish(&mut self) -> Vec<ArrayRef> {
        vec![
            Arc::new(self.keys.finish()),
            Arc::new(self.values.finish()),
            Arc::new(self.timestamps.finish()),
            Arc::new(self.offsets.finish()),
        ]
    }
}

/// The schema of the batches (`Columns::finish`'s arrays in order).
fn schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("key", DataType::Binary, true),
        Field::new("value", DataType::Binary, true),
        Field::new(
            "timestamp",
            DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
            false,
        ),
        Field::new("offset", DataType::Int64, false),
    ]))
}

/// Where to read: the bootstrap address, topic, partition and the offsets `[start, end)`.
struct Target {
    bootstrap: String,
    topic: String,
    partition: i32,
    start: i64,
    end: i64,
}

/// User and system CPU seconds of this process, all threads.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .expect("a stat line")
        .1
        .split_whitespace()
        .collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let ipc = args.len() == 8 && args[7] == "--ipc";
    if args.len() != 7 && !ipc {
        eprintln!("usage: kafka-floor READER BOOTSTRAP TOPIC PARTITION START END [--ipc]");
        std::process::exit(2);
    }
    let target = Target {
        bootstrap: args[2].clone(),
        topic: args[3].clone(),
        partition: args[4].parse().expect("PARTITION is an integer"),
        start: args[5].parse().expect("START is an integer"),
        end: args[6].parse().expect("END is an integer"),
    };
    let mut out = ipc.then(|| {
        StreamWriter::try_new(std::io::BufWriter::new(std::io::stdout().lock()), &schema())
            .expect("an IPC stream on standard output")
    });
    let (started, cpu) = (Instant::now(), cpu_seconds());
    let mut rows = 0usize;
    let mut sink = |arrays: Vec<ArrayRef>| {
        rows += arrays[0].len();
        if let Some(out) = out.as_mut() {
            let batch = RecordBatch::try_new(schema(), arrays).expect("columns of the schema");
            out.write(&batch).expect("write a batch to standard output");
            out.flush().expect("flush standard output");
        }
    };
    match args[1].as_str() {
        "fetch" => fetch::read(&target, &mut sink),
        #[cfg(feature = "rdkafka")]
        "rdkafka" => librdkafka::read_polling(&target, &mut sink),
        #[cfg(feature = "rdkafka")]
        "rdkafka-batch" => librdkafka::read_batches(&target, &mut sink),
        other => {
            eprintln!("unknown reader {other} (rdkafka ones need --features rdkafka)");
            std::process::exit(2);
        }
    }
    if let Some(mut out) = out {
        out.finish().expect("end the IPC stream");
    }
    let (wall, cpu) = (started.elapsed().as_secs_f64(), cpu_seconds() - cpu);
    let line = format!(
        "{{\"reader\": \"{}\", \"rows\": {rows}, \"wall_seconds\": {wall:.4}, \"cpu_seconds\": {cpu:.3}}}",
        args[1]
    );
    if ipc {
        eprintln!("{line}");
    } else {
        println!("{line}");
    }
}
