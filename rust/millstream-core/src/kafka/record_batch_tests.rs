//! The batch decoder against batches built as producers build them: keys, null values,
//! headers, every codec, control batches, aborted transactions, cut and corrupt batches.

use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type, TimestampMillisecondType};
use arrow_array::{Array, RecordBatch};

use super::codec::Codec;
use super::columns::RecordColumns;
use super::error::{KafkaError, KafkaResult};
use super::fetch::AbortedTransaction;
use super::record_batch::{decode_batches, scan_batches, BatchSource, Decoded};
use super::test_batches::{header_pairs, TestBatch, TestRecord};

const SOURCE: BatchSource<'static> = BatchSource {
    topic: "events",
    partition: 3,
};

fn decode(
    records: &[u8],
    aborted: &[AbortedTransaction],
    position: i64,
    end: Option<i64>,
) -> KafkaResult<(RecordBatch, Decoded)> {
    let mut columns = RecordColumns::new(SOURCE.partition);
    let decoded = decode_batches(SOURCE, records, aborted, position, end, &mut columns)?;
    // A reader sends its next fetch from where the scan of the headers says decoding ends.
    let (scanned, count) = scan_batches(records, position, end);
    assert_eq!(
        scanned, decoded,
        "the scan of the batch headers and the decoding agree"
    );
    let batch = columns.finish();
    assert!(
        count >= batch.num_rows(),
        "the scan counts every record decoded"
    );
    Ok((batch, decoded))
}

fn offsets(batch: &RecordBatch) -> Vec<i64> {
    batch
        .column(5)
        .as_primitive::<Int64Type>()
        .values()
        .to_vec()
}

fn values(batch: &RecordBatch) -> Vec<Option<&[u8]>> {
    batch.column(1).as_binary::<i32>().iter().collect()
}

fn mixed_records() -> Vec<TestRecord> {
    vec![
        TestRecord::new("k0", "v0"),
        TestRecord {
            key: None,
            value: Some(b"no key".to_vec()),
            headers: vec![("h".into(), Some(b"1".to_vec())), ("empty".into(), None)],
        },
        TestRecord {
            key: Some(b"tombstone".to_vec()),
            value: None,
            headers: Vec::new(),
        },
    ]
}

#[test]
fn every_column_of_every_codec_decodes() {
    for codec in [
        Codec::None,
        Codec::Gzip,
        Codec::Snappy,
        Codec::Lz4,
        Codec::Zstd,
    ] {
        let bytes = TestBatch::at(100).encode(codec, &mixed_records());
        let (batch, decoded) = decode(&bytes, &[], 100, None).unwrap();
        assert_eq!(
            decoded,
            Decoded {
                next_offset: 103,
                batches: 1
            },
            "{}",
            codec.name()
        );
        assert_eq!(offsets(&batch), [100, 101, 102]);
        let keys: Vec<_> = batch.column(0).as_binary::<i32>().iter().collect();
        assert_eq!(keys, [Some(&b"k0"[..]), None, Some(&b"tombstone"[..])]);
        assert_eq!(
            values(&batch),
            [Some(&b"v0"[..]), Some(&b"no key"[..]), None]
        );
        let stamps = batch.column(2).as_primitive::<TimestampMillisecondType>();
        let base = 1_700_000_000_000;
        assert_eq!(stamps.values().to_vec(), [base, base + 10, base + 20]);
        let partitions = batch.column(4).as_primitive::<Int32Type>();
        assert!(partitions.values().iter().all(|&p| p == 3));
        let headers = batch.column(3).as_list::<i32>();
        assert!(headers.is_null(0) && headers.is_null(2));
        let (names, header_values) = header_pairs(&batch, 1);
        assert_eq!(names, ["h", "empty"]);
        assert_eq!(header_values, [Some(b"1".to_vec()), None]);
    }
}

#[test]
fn records_before_the_position_and_from_the_end_on_are_left_out() {
    let records: Vec<_> = (0..5)
        .map(|i| TestRecord::new("k", &format!("v{i}")))
        .collect();
    let bytes = TestBatch::at(10).encode(Codec::Lz4, &records);
    let (batch, decoded) = decode(&bytes, &[], 12, Some(14)).unwrap();
    assert_eq!(offsets(&batch), [12, 13]);
    assert_eq!(decoded.next_offset, 14);
    let (batch, decoded) = decode(&bytes, &[], 15, None).unwrap();
    assert_eq!((batch.num_rows(), decoded.next_offset), (0, 15));
}

#[test]
fn control_batches_and_aborted_transactions_are_dropped() {
    let mut log = Vec::new();
    log.extend(TestBatch::at(0).encode(Codec::None, &[TestRecord::new("a", "plain")]));
    // producer 7 aborts offsets 1-2 (marker 3); producer 8 commits offset 4 (marker 6)
    // while 7 starts a transaction again at 5 that it aborts too (marker 7).
    log.extend(TestBatch::transactional(1, 7).encode(
        Codec::Gzip,
        &[TestRecord::new("b", "x1"), TestRecord::new("b", "x2")],
    ));
    log.extend(TestBatch::transactional(3, 7).marker(true));
    log.extend(TestBatch::transactional(4, 8).encode(Codec::Zstd, &[TestRecord::new("c", "kept")]));
    log.extend(TestBatch::transactional(5, 7).encode(Codec::None, &[TestRecord::new("d", "x3")]));
    log.extend(TestBatch::transactional(6, 8).marker(false));
    log.extend(TestBatch::transactional(7, 7).marker(true));
    log.extend(TestBatch::at(8).encode(Codec::Snappy, &[TestRecord::new("e", "last")]));
    let aborted = [
        AbortedTransaction {
            producer_id: 7,
            first_offset: 1,
        },
        AbortedTransaction {
            producer_id: 7,
            first_offset: 5,
        },
    ];
    let (batch, decoded) = decode(&log, &aborted, 0, None).unwrap();
    assert_eq!(offsets(&batch), [0, 4, 8]);
    assert_eq!(
        values(&batch),
        [Some(&b"plain"[..]), Some(&b"kept"[..]), Some(&b"last"[..])]
    );
    assert_eq!(
        decoded,
        Decoded {
            next_offset: 9,
            batches: 8
        }
    );
    // Without the aborted list (read_uncommitted), the aborted records would show.
    let (batch, _) = decode(&log, &[], 0, None).unwrap();
    assert_eq!(offsets(&batch), [0, 1, 2, 4, 5, 8]);
}

#[test]
fn a_batch_cut_by_the_fetch_size_is_left_for_the_next_fetch() {
    let mut log = TestBatch::at(0).encode(Codec::None, &[TestRecord::new("a", "1")]);
    let second = TestBatch::at(1).encode(Codec::None, &[TestRecord::new("b", "2")]);
    log.extend(&second[..second.len() - 4]);
    let (batch, decoded) = decode(&log, &[], 0, None).unwrap();
    assert_eq!(offsets(&batch), [0]);
    assert_eq!(
        decoded,
        Decoded {
            next_offset: 1,
            batches: 1
        }
    );
    let (batch, decoded) = decode(&second[..20], &[], 1, None).unwrap();
    assert_eq!(
        (batch.num_rows(), decoded.batches, decoded.next_offset),
        (0, 0, 1)
    );
}

fn corrupt_reason(bytes: &[u8]) -> (i64, String) {
    match decode(bytes, &[], 0, None) {
        Err(KafkaError::CorruptBatch {
            topic,
            partition,
            offset,
            reason,
        }) => {
            assert_eq!((topic.as_str(), partition), ("events", 3));
            (offset, reason)
        }
        other => panic!("expected a corrupt batch, got {other:?}"),
    }
}

#[test]
fn a_flipped_byte_fails_the_crc_and_names_the_batch() {
    let mut log = TestBatch::at(0).encode(Codec::None, &[TestRecord::new("a", "1")]);
    let mut second = TestBatch::at(1).encode(Codec::None, &[TestRecord::new("b", "2")]);
    let last = second.len() - 1;
    second[last] ^= 0x40;
    log.extend(second);
    let (offset, reason) = corrupt_reason(&log);
    assert_eq!(offset, 1);
    assert!(reason.contains("CRC-32C"), "{reason}");
    let message = decode(&log, &[], 0, None).unwrap_err().to_string();
    assert!(
        message.contains("partition 3") && message.contains("offset 1"),
        "{message}"
    );
}

#[test]
fn records_that_do_not_decode_are_corrupt_batches() {
    // A compressed body that is not what its codec says.
    let mut bad = TestBatch::at(0).encode(Codec::None, &[TestRecord::new("a", "1")]);
    bad[22] |= 0x04; // attributes: zstd, body left plain
    fix_crc(&mut bad);
    let (_, reason) = corrupt_reason(&bad);
    assert!(reason.contains("zstd"), "{reason}");
    // A record whose length says more than it holds.
    let mut bad = TestBatch::at(0).encode(Codec::None, &[TestRecord::new("a", "1")]);
    bad[61] = 0x7e;
    fix_crc(&mut bad);
    let (_, reason) = corrupt_reason(&bad);
    assert!(reason.starts_with("record"), "{reason}");
    // An old message format.
    let mut old = TestBatch::at(0).encode(Codec::None, &[TestRecord::new("a", "1")]);
    old[16] = 1;
    let (_, reason) = corrupt_reason(&old);
    assert!(reason.contains("message format v1"), "{reason}");
}

fn fix_crc(batch: &mut [u8]) {
    let crc = crc32c::crc32c(&batch[21..]);
    batch[17..21].copy_from_slice(&crc.to_be_bytes());
}

#[test]
fn log_append_time_gives_every_record_the_batch_time() {
    let mut batch = TestBatch::at(0).encode(
        Codec::None,
        &[TestRecord::new("a", "1"), TestRecord::new("b", "2")],
    );
    batch[22] |= 0x08;
    fix_crc(&mut batch);
    let (decoded, _) = decode(&batch, &[], 0, None).unwrap();
    let stamps = decoded.column(2).as_primitive::<TimestampMillisecondType>();
    assert_eq!(
        stamps.values().to_vec(),
        [1_700_000_000_010, 1_700_000_000_010]
    );
}
