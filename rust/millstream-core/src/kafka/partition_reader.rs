//! A reader of one topic partition that keeps one fetch ahead of its caller.
//!
//! A thread of its own fetches from the partition's leader and decodes each response into
//! Arrow columns while the caller maps the batch before; a channel of one response stands
//! between them, so at most one decoded response waits. The caller takes batches of at
//! most the rows it asks for ([`PartitionReader::read`]) and the offset after them
//! ([`PartitionReader::position`]); the thread stops at the reader's end offset, if it has
//! one.
//!
//! Failures: a connection that breaks or a leader that moved makes the thread reconnect
//! (metadata asked again) and fetch again from the offset after the last response it
//! handed over, so that no record is lost or doubled; it retries until it gets through.
//! An offset out of range (retention), a corrupt batch and an error code that retrying
//! cannot mend end the thread, and the reader returns that error from then on.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::RecordBatch;
use arrow_select::concat::concat_batches;

use super::cluster::ClusterConfig;
use super::columns::{record_schema, RecordColumns};
use super::connection::{Connection, Request};
use super::error::{code, KafkaError, KafkaResult};
use super::fetch::FetchRequest;
use super::list_offsets::{ListOffsetsRequest, EARLIEST, LATEST};
use super::record_batch::{decode_batches, BatchSource};

/// The largest fetch the reader grows to when one batch is larger than its fetch size.
const MAX_FETCH_BYTES: i32 = 1 << 30;
/// The longest wait between two attempts to reach the partition's leader.
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// Column of the records' offsets in [`record_schema`].
const OFFSET_COLUMN: usize = 5;

/// What to read.
#[derive(Debug, Clone)]
pub struct ReaderOptions {
    /// The cluster.
    pub cluster: ClusterConfig,
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The first offset to read.
    pub start: i64,
    /// The offset to stop before (`None`: never stop).
    pub end: Option<i64>,
    /// How long the broker may hold a fetch when it has no records (ms).
    pub max_wait_ms: i32,
    /// Bytes asked for per fetch.
    pub fetch_bytes: i32,
}

/// One decoded Fetch response: its committed records and the offset after it.
#[derive(Debug)]
struct Chunk {
    records: RecordBatch,
    next_offset: i64,
}

/// Reads one partition, a fetch ahead of the caller (see the module docs).
#[derive(Debug)]
pub struct PartitionReader {
    chunks: Receiver<KafkaResult<Chunk>>,
    stop: Arc<AtomicBool>,
    pending: VecDeque<RecordBatch>,
    received: i64,
    end: Option<i64>,
    failed: Option<KafkaError>,
}

impl PartitionReader {
    /// Starts reading from `options.start` (the thread connects in the background).
    pub fn start(options: ReaderOptions) -> Self {
        let (sender, chunks) = sync_channel(1);
        let stop = Arc::new(AtomicBool::new(false));
        let (received, end) = (options.start, options.end);
        let fetcher = Fetcher {
            position: options.start,
            fetch_bytes: options.fetch_bytes,
            options,
            stop: Arc::clone(&stop),
            sender,
        };
        std::thread::Builder::new()
            .name("kafka-reader".into())
            .spawn(move || fetcher.run())
            .expect("a thread for the Kafka reader");
        Self {
            chunks,
            stop,
            pending: VecDeque::new(),
            received,
            end,
            failed: None,
        }
    }

    /// The offset of the next record [`read`](Self::read) returns (or past which it looks).
    pub fn position(&self) -> i64 {
        match self.pending.front() {
            Some(batch) => batch
                .column(OFFSET_COLUMN)
                .as_primitive::<Int64Type>()
                .value(0),
            None => self.received,
        }
    }

    /// Whether every record before the end offset was handed over.
    pub fn ended(&self) -> bool {
        self.pending.is_empty() && self.end.is_some_and(|end| self.received >= end)
    }

    /// Takes what the thread has decoded; waits up to `wait` for it when nothing is
    /// pending. Returns whether rows are pending.
    fn receive(&mut self, wait: Duration) -> KafkaResult<bool> {
        let deadline = Instant::now() + wait;
        loop {
            if let Some(e) = &self.failed {
                return Err(e.clone());
            }
            let received = if self.pending.is_empty() && !self.ended() {
                match self
                    .chunks
                    .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                {
                    Ok(chunk) => Some(chunk),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => return Ok(false),
                }
            } else {
                self.chunks.try_recv().ok()
            };
            match received {
                None => return Ok(!self.pending.is_empty()),
                Some(Err(e)) => self.failed = Some(e),
                Some(Ok(chunk)) => {
                    self.received = chunk.next_offset;
                    if chunk.records.num_rows() > 0 {
                        self.pending.push_back(chunk.records);
                    }
                    if !self.pending.is_empty() {
                        return Ok(true);
                    }
                }
            }
        }
    }

    /// Up to `max_rows` records from [`position`](Self::position) on, waiting up to `wait`
    /// for the first one; `None` when none came in time (or the end was reached).
    pub fn read(&mut self, max_rows: usize, wait: Duration) -> KafkaResult<Option<RecordBatch>> {
        if !self.receive(wait)? {
            return Ok(None);
        }
        let mut pieces = Vec::new();
        let mut rows = 0;
        while rows < max_rows {
            let Some(front) = self.pending.pop_front() else {
                if !self.receive(Duration::ZERO)? {
                    break;
                }
                continue;
            };
            let take = front.num_rows().min(max_rows - rows);
            if take < front.num_rows() {
                self.pending
                    .push_front(front.slice(take, front.num_rows() - take));
            }
            pieces.push(front.slice(0, take));
            rows += take;
        }
        let batch = match pieces.len() {
            1 => pieces.pop().expect("one piece"),
            _ => concat_batches(&record_schema(), &pieces).expect("batches of one schema"),
        };
        Ok(Some(batch))
    }

    /// Waits up to `timeout` for a record to read; returns whether one is there.
    pub fn wait(&mut self, timeout: Duration) -> KafkaResult<bool> {
        self.receive(timeout)
    }
}

impl Drop for PartitionReader {
    fn drop(&mut self) {
        // The thread sees the flag, or the closed channel, after its current fetch.
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The reader's thread: fetches, decodes, hands over.
struct Fetcher {
    options: ReaderOptions,
    position: i64,
    fetch_bytes: i32,
    stop: Arc<AtomicBool>,
    sender: SyncSender<KafkaResult<Chunk>>,
}

impl Fetcher {
    fn run(mut self) {
        let mut connection: Option<Connection> = None;
        let mut backoff = Duration::from_millis(10);
        while !self.stop.load(Ordering::Relaxed) && !self.finished() {
            let step = match connection.as_mut() {
                Some(c) => self.fetch(c),
                None => match self
                    .options
                    .cluster
                    .connect_leader(&self.options.topic, self.options.partition)
                {
                    Ok(c) => {
                        connection = Some(c);
                        continue;
                    }
                    Err(e) => Err(e),
                },
            };
            match step {
                Ok(Some(chunk)) => {
                    backoff = Duration::from_millis(10);
                    if self.sender.send(Ok(chunk)).is_err() {
                        return; // the reader was dropped
                    }
                }
                Ok(None) => backoff = Duration::from_millis(10),
                Err(e) if e.retriable() => {
                    connection = None;
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
                Err(e) => {
                    let _ = self.sender.send(Err(e));
                    return;
                }
            }
        }
    }

    fn finished(&self) -> bool {
        self.options.end.is_some_and(|end| self.position >= end)
    }

    /// One fetch: the chunk to hand over, `None` when it held nothing new.
    fn fetch(&mut self, connection: &mut Connection) -> KafkaResult<Option<Chunk>> {
        let (topic, partition) = (self.options.topic.as_str(), self.options.partition);
        let response = connection.call(&FetchRequest {
            topic: topic.to_string(),
            partition,
            offset: self.position,
            max_wait_ms: self.options.max_wait_ms,
            max_bytes: self.fetch_bytes,
        })?;
        match response.error_code {
            0 => {}
            code::OFFSET_OUT_OF_RANGE => return Err(self.out_of_range(connection)),
            code => {
                return Err(KafkaError::Broker {
                    api: FetchRequest::NAME,
                    topic: topic.to_string(),
                    partition,
                    code,
                })
            }
        }
        let mut columns = RecordColumns::new(partition);
        let source = BatchSource { topic, partition };
        let decoded = decode_batches(
            source,
            response.records(),
            &response.aborted,
            self.position,
            self.options.end,
            &mut columns,
        )?;
        if decoded.batches == 0 && !response.records().is_empty() {
            self.fetch_bytes = self.fetch_bytes.saturating_mul(2).min(MAX_FETCH_BYTES);
        }
        if decoded.next_offset == self.position {
            return Ok(None);
        }
        self.position = decoded.next_offset;
        Ok(Some(Chunk {
            records: columns.finish(),
            next_offset: decoded.next_offset,
        }))
    }

    /// The out-of-range error, with the partition's range as the leader tells it now.
    fn out_of_range(&self, connection: &mut Connection) -> KafkaError {
        let mut ask = |timestamp| {
            connection
                .call(&ListOffsetsRequest {
                    topic: self.options.topic.clone(),
                    partition: self.options.partition,
                    timestamp,
                })
                .ok()
                .filter(|r| r.error_code == 0)
                .map_or(-1, |r| r.offset)
        };
        KafkaError::OffsetOutOfRange {
            topic: self.options.topic.clone(),
            partition: self.options.partition,
            offset: self.position,
            log_start: ask(EARLIEST),
            end: ask(LATEST),
        }
    }
}
