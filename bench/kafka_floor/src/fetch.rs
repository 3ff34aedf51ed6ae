//! Kafka's Fetch request (version 4, `read_committed`) spoken directly over one TCP
//! connection, and its record batches (magic 2) walked into Arrow columns: what reading costs
//! when nothing sits between the socket and the columns.
//!
//! Enough for a benchmark, not a client: it asks the bootstrap broker (a one-broker cluster
//! leads every partition), refuses compressed batches, and stops at the first error code.
//! It does what `read_committed` asks of a consumer: control batches are skipped, and so are
//! the batches of the aborted transactions the broker lists (KIP-98).

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::TcpStream;

use arrow_array::ArrayRef;

use crate::{Columns, Target, BATCH_ROWS};

/// Bytes asked for per fetch (the broker may send more: at least one whole batch).
const FETCH_BYTES: i32 = 64 << 20;
/// How long the broker may wait for `min_bytes` (ms).
const MAX_WAIT_MS: i32 = 100;
const FETCH_API_KEY: i16 = 1;
const FETCH_VERSION: i16 = 4;
const READ_COMMITTED: u8 = 1;
const BATCH_HEADER_BYTES: usize = 61;
const ATTRIBUTE_COMPRESSION: i16 = 0x07;
const ATTRIBUTE_TRANSACTIONAL: i16 = 0x10;
const ATTRIBUTE_CONTROL: i16 = 0x20;

fn i16_at(b: &[u8], at: usize) -> i16 {
    i16::from_be_bytes(b[at..at + 2].try_into().unwrap())
}
fn i32_at(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}
fn i64_at(b: &[u8], at: usize) -> i64 {
    i64::from_be_bytes(b[at..at + 8].try_into().unwrap())
}

/// A zigzag varint at `*at`, which moves past it.
fn varint(b: &[u8], at: &mut usize) -> i64 {
    let (mut raw, mut shift) = (0u64, 0);
    loop {
        let byte = b[*at];
        *at += 1;
        raw |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            break;
        }
        shift += 7;
    }
    ((raw >> 1) as i64) ^ -((raw & 1) as i64)
}

/// A varint-length-prefixed byte string (length -1: null) at `*at`.
fn bytes<'a>(b: &'a [u8], at: &mut usize) -> Option<&'a [u8]> {
    let len = varint(b, at);
    if len < 0 {
        return None;
    }
    let out = &b[*at..*at + len as usize];
    *at += len as usize;
    Some(out)
}

fn fetch_request(target: &Target, correlation: i32, offset: i64) -> Vec<u8> {
    let mut r = Vec::with_capacity(64 + target.topic.len());
    r.extend(FETCH_API_KEY.to_be_bytes());
    r.extend(FETCH_VERSION.to_be_bytes());
    r.extend(correlation.to_be_bytes());
    r.extend(11i16.to_be_bytes());
    r.extend(b"kafka-floor");
    r.extend((-1i32).to_be_bytes()); // replica id: a consumer
    r.extend(MAX_WAIT_MS.to_be_bytes());
    r.extend(1i32.to_be_bytes()); // min bytes
    r.extend(FETCH_BYTES.to_be_bytes());
    r.push(READ_COMMITTED);
    r.extend(1i32.to_be_bytes());
    r.extend((target.topic.len() as i16).to_be_bytes());
    r.extend(target.topic.as_bytes());
    r.extend(1i32.to_be_bytes());
    r.extend(target.partition.to_be_bytes());
    r.extend(offset.to_be_bytes());
    r.extend(FETCH_BYTES.to_be_bytes());
    let mut framed = (r.len() as i32).to_be_bytes().to_vec();
    framed.extend(r);
    framed
}

/// The aborted transactions `(producer id, first offset)` and the records of a one-partition
/// Fetch v4 response.
fn partition_data(response: &[u8]) -> (Vec<(i64, i64)>, &[u8]) {
    let mut at = 4 + 4; // correlation id, throttle time
    assert_eq!(i32_at(response, at), 1, "one topic");
    at += 4;
    at += 2 + i16_at(response, at) as usize;
    assert_eq!(i32_at(response, at), 1, "one partition");
    at += 4 + 4; // count, partition
    let error = i16_at(response, at);
    assert_eq!(error, 0, "the broker answered error code {error}");
    at += 2 + 8 + 8; // error, high watermark, last stable offset
    let count = i32_at(response, at);
    at += 4;
    let mut aborted = Vec::new();
    for _ in 0..count.max(0) {
        aborted.push((i64_at(response, at), i64_at(response, at + 8)));
        at += 16;
    }
    aborted.sort_by_key(|&(_, first)| first);
    let len = i32_at(response, at).max(0) as usize;
    (aborted, &response[at + 4..at + 4 + len])
}

/// Reads `target` from its start offset to its end offset, handing each batch's columns to `sink`.
pub fn read(target: &Target, sink: &mut dyn FnMut(Vec<ArrayRef>)) {
    let mut socket = TcpStream::connect(&target.bootstrap).expect("connect to the broker");
    socket.set_nodelay(true).expect("TCP_NODELAY");
    let (mut offset, mut correlation) = (target.start, 0i32);
    let mut response = Vec::new();
    let mut columns = Columns::new();
    let mut aborting: HashSet<i64> = HashSet::new();
    while offset < target.end {
        correlation += 1;
        socket
            .write_all(&fetch_request(target, correlation, offset))
            .expect("send a fetch");
        let mut size = [0u8; 4];
        socket.read_exact(&mut size).expect("a response");
        response.resize(i32::from_be_bytes(size) as usize, 0);
        socket.read_exact(&mut response).expect("a response");
        let (aborted, records) = partition_data(&response);
        let mut aborted = aborted.into_iter().peekable();
        let mut at = 0;
        while at + BATCH_HEADER_BYTES <= records.len() && offset < target.end {
            let end = at + 12 + i32_at(records, at + 8) as usize;
            if end > records.len() {
                break; // a partial batch at the end of the response
            }
            let batch = &records[at..end];
            at = end;
            let base = i64_at(batch, 0);
            let last = base + i64::from(i32_at(batch, 23));
            if last < offset {
                continue;
            }
            let attributes = i16_at(batch, 21);
            let producer = i64_at(batch, 43);
            assert_eq!(attributes & ATTRIBUTE_COMPRESSION, 0, "compressed batches");
            while let Some((id, _)) = aborted.next_if(|&(_, first)| first <= last) {
                aborting.insert(id);
            }
            let skip = attributes & ATTRIBUTE_CONTROL != 0
                || (attributes & ATTRIBUTE_TRANSACTIONAL != 0 && aborting.contains(&producer));
            if attributes & ATTRIBUTE_CONTROL != 0 {
                let mut r = BATCH_HEADER_BYTES;
                let _ = (varint(batch, &mut r), batch[r]);
                r += 1;
                let _ = (varint(batch, &mut r), varint(batch, &mut r));
                if let Some(key) = bytes(batch, &mut r) {
                    if i16_at(key, 2) == 0 {
                        aborting.remove(&producer); // the abort marker ends the transaction
                    }
                }
            }
            if !skip {
                let timestamp = i64_at(batch, 27);
                let mut r = BATCH_HEADER_BYTES;
                for _ in 0..i32_at(batch, 57) {
                    let _length = varint(batch, &mut r);
                    r += 1; // attributes
                    let delta = varint(batch, &mut r);
                    let record = base + varint(batch, &mut r);
                    let key = bytes(batch, &mut r);
                    let value = bytes(batch, &mut r);
                    for _ in 0..varint(batch, &mut r) {
                        let _ = (bytes(batch, &mut r), bytes(batch, &mut r));
                    }
                    if record >= offset && record < target.end {
                        columns.push(key, value, timestamp + delta, record);
                        if columns.len() == BATCH_ROWS {
                            sink(columns.finish());
                        }
                    }
                }
            }
            offset = offset.max(last + 1);
        }
    }
    if columns.len() > 0 {
        sink(columns.finish());
    }
}
