//! A reader of one topic partition that reads ahead of its caller.
//!
//! A thread of its own fetches from the partition's leader and decodes each response into
//! Arrow columns while the caller maps the batches before: decoded responses wait in a
//! [`read_ahead`] of at most [`ReaderOptions::read_ahead_bytes`], and the thread sends each
//! fetch before it decodes the response to the last one (the offset to fetch from is read
//! from the response's batch headers first), so the broker prepares the next response
//! while this one is decoded. The caller takes batches of at most the rows it asks for
//! ([`PartitionReader::read`]) and the offset after them ([`PartitionReader::position`]);
//! the thread stops at the reader's end offset, if it has one.
//!
//! Failures: a connection that breaks or a leader that moved makes the thread reconnect
//! (metadata asked again) and fetch again from the offset after the last response it
//! handed over (a fetch in flight on the broken connection is forgotten), so that no record
//! is lost or doubled; it retries until it gets through. An offset out of range
//! (retention), a corrupt batch and an error code that retrying cannot mend end the thread,
//! and the reader returns that error from then on.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::RecordBatch;
use arrow_select::concat::concat_batches;

use super::cluster::ClusterConfig;
use super::columns::{record_schema, RecordColumns};
use super::connection::{Connection, Request, Sent};
use super::error::{code, KafkaError, KafkaResult};
use super::fetch::FetchRequest;
use super::list_offsets::{ListOffsetsRequest, EARLIEST, LATEST};
use super::read_ahead::{read_ahead, Giver, Taken, Taker};
use super::record_batch::{decode_batches, scan_batches, BatchSource};

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
    /// Bytes of decoded records the thread may hold that the caller has not taken.
    pub read_ahead_bytes: usize,
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
    chunks: Taker<KafkaResult<Chunk>>,
    stop: Arc<AtomicBool>,
    retrying: Arc<Mutex<Option<Retrying>>>,
    pending: VecDeque<RecordBatch>,
    received: i64,
    end: Option<i64>,
    failed: Option<KafkaError>,
}

impl PartitionReader {
    /// Starts reading from `options.start` (the thread connects in the background).
    pub fn start(options: ReaderOptions) -> Self {
        let (giver, chunks) = read_ahead(options.read_ahead_bytes);
        let stop = Arc::new(AtomicBool::new(false));
        let retrying = Arc::new(Mutex::new(None));
        let (received, end) = (options.start, options.end);
        let fetcher = Fetcher {
            position: options.start,
            fetch_bytes: options.fetch_bytes,
            options,
            stop: Arc::clone(&stop),
            retrying: Arc::clone(&retrying),
            giver,
            spare: Vec::new(),
        };
        std::thread::Builder::new()
            .name("kafka-reader".into())
            .spawn(move || fetcher.run())
            .expect("a thread for the Kafka reader");
        Self {
            chunks,
            stop,
            retrying,
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
            let wait = if self.pending.is_empty() && !self.ended() {
                deadline.saturating_duration_since(Instant::now())
            } else {
                Duration::ZERO
            };
            let received = match self.chunks.take(wait) {
                Taken::Item(chunk) => Some(chunk),
                Taken::Nothing => None,
                Taken::Ended if self.pending.is_empty() => return Ok(false),
                Taken::Ended => None,
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

    /// What the thread is retrying now, if its last attempt failed: a broker it cannot
    /// reach, a leader that moved (the errors the reader waits out rather than returns).
    pub fn retrying(&self) -> Option<Retrying> {
        self.retrying
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }
}

impl Drop for PartitionReader {
    fn drop(&mut self) {
        // The thread sees the flag, or the closed channel, after its current fetch.
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A run of failed attempts the reader's thread is waiting out.
#[derive(Debug, Clone)]
pub struct Retrying {
    /// The last attempt's error.
    pub error: KafkaError,
    /// When the first attempt of the run failed.
    pub since: Instant,
    /// Attempts failed in the run.
    pub attempts: u32,
}

/// The reader's thread: fetches, decodes, hands over.
struct Fetcher {
    options: ReaderOptions,
    /// The offset after the last records handed over: where a new connection fetches from.
    position: i64,
    fetch_bytes: i32,
    stop: Arc<AtomicBool>,
    retrying: Arc<Mutex<Option<Retrying>>>,
    giver: Giver<KafkaResult<Chunk>>,
    /// The last response's bytes, for the next response to reuse.
    spare: Vec<u8>,
}

/// A fetch sent whose response is not read yet.
struct InFlight {
    sent: Sent<FetchRequest>,
    offset: i64,
}

impl Fetcher {
    fn run(mut self) {
        let mut connection: Option<Connection> = None;
        let mut in_flight: Option<InFlight> = None;
        let mut backoff = Duration::from_millis(10);
        while !self.stop.load(Ordering::Relaxed) && !self.finished(self.position) {
            let step = match connection.as_mut() {
                Some(c) => self.step(c, &mut in_flight),
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
                Ok(()) => {
                    backoff = Duration::from_millis(10);
                    self.retried(None);
                }
                Err(e) if e.retriable() => {
                    self.retried(Some(e));
                    (connection, in_flight) = (None, None);
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
                Err(e) => {
                    let _ = self.giver.give(Err(e), 0);
                    return;
                }
            }
        }
    }

    /// Records an attempt: failed with `error`, or through.
    fn retried(&self, error: Option<KafkaError>) {
        let mut retrying = self
            .retrying
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *retrying = error.map(|error| match retrying.take() {
            Some(run) => Retrying {
                error,
                since: run.since,
                attempts: run.attempts + 1,
            },
            None => Retrying {
                error,
                since: Instant::now(),
                attempts: 1,
            },
        });
    }

    fn finished(&self, offset: i64) -> bool {
        self.options.end.is_some_and(|end| offset >= end)
    }

    fn send(&self, connection: &mut Connection, offset: i64) -> KafkaResult<InFlight> {
        let sent = connection.send(&FetchRequest {
            topic: self.options.topic.clone(),
            partition: self.options.partition,
            offset,
            max_wait_ms: self.options.max_wait_ms,
            max_bytes: self.fetch_bytes,
        })?;
        Ok(InFlight { sent, offset })
    }

    /// One response read (its fetch sent now if none is in flight), the next fetch sent
    /// before the response is decoded, and its records handed over.
    fn step(
        &mut self,
        connection: &mut Connection,
        in_flight: &mut Option<InFlight>,
    ) -> KafkaResult<()> {
        let fetch = match in_flight.take() {
            Some(fetch) => fetch,
            None => self.send(connection, self.position)?,
        };
        let response = connection.receive(fetch.sent, std::mem::take(&mut self.spare))?;
        let (topic, partition) = (self.options.topic.as_str(), self.options.partition);
        match response.error_code {
            0 => {}
            code::OFFSET_OUT_OF_RANGE => return Err(self.out_of_range(connection, fetch.offset)),
            code => {
                return Err(KafkaError::Broker {
                    api: FetchRequest::NAME,
                    topic: topic.to_string(),
                    partition,
                    code,
                })
            }
        }
        let records = response.records();
        let (ahead, count) = scan_batches(records, fetch.offset, self.options.end);
        if ahead.batches == 0 && !records.is_empty() {
            self.fetch_bytes = self.fetch_bytes.saturating_mul(2).min(MAX_FETCH_BYTES);
        }
        if !self.finished(ahead.next_offset) {
            *in_flight = Some(self.send(connection, ahead.next_offset)?);
        }
        if ahead.next_offset == fetch.offset {
            self.spare = response.into_body();
            return Ok(());
        }
        let mut columns = RecordColumns::with_capacity(partition, count, records.len());
        let source = BatchSource { topic, partition };
        let decoded = decode_batches(
            source,
            records,
            &response.aborted,
            fetch.offset,
            self.options.end,
            &mut columns,
        )?;
        debug_assert_eq!(
            decoded, ahead,
            "the batch headers' scan and the decoding agree"
        );
        self.spare = response.into_body();
        self.position = decoded.next_offset;
        let records = columns.finish();
        let bytes = records.get_array_memory_size();
        let chunk = Chunk {
            records,
            next_offset: decoded.next_offset,
        };
        if self.giver.give(Ok(chunk), bytes).is_err() {
            self.stop.store(true, Ordering::Relaxed); // the reader was dropped
        }
        Ok(())
    }

    /// The out-of-range error, with the partition's range as the leader tells it now.
    fn out_of_range(&self, connection: &mut Connection, offset: i64) -> KafkaError {
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
            offset,
            log_start: ask(EARLIEST),
            end: ask(LATEST),
        }
    }
}
