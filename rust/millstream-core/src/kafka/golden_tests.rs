//! The batch decoder against golden bytes: Fetch responses' records as a noida-db broker
//! served them, produced by librdkafka (confluent-kafka 2.16) with each codec, and a
//! transaction aborted then one committed (`read_committed`; the broker listed the aborted
//! transaction of producer 1000 from offset 0).
//!
//! Each codec's batch holds three records: (`key-0`, `value-0`, no headers), (null key,
//! null value, headers `h`=`x` and `n`=null) and (`k`, `value-2` four times), at
//! 1700000000000 ms, +5 and +9.

use arrow_array::cast::AsArray;
use arrow_array::types::{Int64Type, TimestampMillisecondType};
use arrow_array::{Array, RecordBatch};

use super::columns::RecordColumns;
use super::fetch::AbortedTransaction;
use super::record_batch::{decode_batches, BatchSource, Decoded};
use super::test_batches::header_pairs;

const NONE: &[&str] = &[
    "0000000000000000000000760000000002f213d4610000000000020000018bcfe568000000018bcfe56809ff",
    "ffffffffffffffffffffffffff00000003240000000a6b65792d300e76616c75652d30001a000a0201010402",
    "680278026e0146001204026b3876616c75652d3276616c75652d3276616c75652d3276616c75652d3200",
];

const GZIP: &[&str] = &[
    "000000000000000000000072000000000234102e410001000000020000018bcfe568000000018bcfe56809ff",
    "ffffffffffffffffffffffffff000000031f8b080000000000000353616060e0ca4eadd435e02b4bcc294dd5",
    "35609062e06262646461ca60aa60ca637463106261cab680481a61a51800a10b69fe45000000",
];

const SNAPPY: &[&str] = &[
    "00000000000000000000006700000000023c1200660002000000020000018bcfe568000000018bcfe56809ff",
    "ffffffffffffffffffffffffff0000000345a0240000000a6b65792d300e76616c75652d30001a000a020101",
    "0402680278026e0146001204026b3876051d003209243a07000000",
];

const LZ4: &[&str] = &[
    "0000000000000000000000760000000002dce316ed0003000000020000018bcfe568000000018bcfe56809ff",
    "ffffffffffffffffffffffffff0000000304224d1860408236000000f219240000000a6b65792d300e76616c",
    "75652d30001a000a0201010402680278026e0146001204026b381d001d3207005075652d320000000000",
];

const ZSTD: &[&str] = &[
    "00000000000000000000006e0000000002833179230004000000020000018bcfe568000000018bcfe56809ff",
    "ffffffffffffffffffffffffff0000000328b52ffd0058a50100a402240000000a6b65792d300e76616c7565",
    "2d30001a000a0201010402680278026e0146001204026b38320002002a5f000caa0c",
];

const TXN: &[&str] = &[
    "0000000000000001000000420000000002ceae654f003000000000000001a222f270f3000001a222f270f300",
    "000000000003e80000ffffffff000000012000000008000000000c0000000000000000000000000000020000",
    "00410000000002abcc969f0010000000000000018bcfe568000000018bcfe5680000000000000003e8000000",
    "000001000000011e0000000112636f6d6d697474656400000000000000000300000042000000000285ac1b7f",
    "003000000000000001a222f270f4000001a222f270f400000000000003e80000ffffffff0000000120000000",
    "08000000010c00000000000000",
];

fn bytes(hex: &[&str]) -> Vec<u8> {
    let hex: String = hex.concat();
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
        .collect()
}

fn decode(hex: &[&str], aborted: &[AbortedTransaction]) -> (RecordBatch, Decoded) {
    let source = BatchSource {
        topic: "golden",
        partition: 0,
    };
    let mut columns = RecordColumns::new(0);
    let decoded = decode_batches(source, &bytes(hex), aborted, 0, None, &mut columns).unwrap();
    (columns.finish(), decoded)
}

#[test]
fn librdkafka_batches_of_every_codec_decode() {
    for (codec, hex) in [
        ("none", NONE),
        ("gzip", GZIP),
        ("snappy", SNAPPY),
        ("lz4", LZ4),
        ("zstd", ZSTD),
    ] {
        let (batch, decoded) = decode(hex, &[]);
        assert_eq!(
            decoded,
            Decoded {
                next_offset: 3,
                batches: 1
            },
            "{codec}"
        );
        let keys: Vec<_> = batch.column(0).as_binary::<i32>().iter().collect();
        assert_eq!(
            keys,
            [Some(&b"key-0"[..]), None, Some(&b"k"[..])],
            "{codec}"
        );
        let values: Vec<_> = batch.column(1).as_binary::<i32>().iter().collect();
        let long = b"value-2".repeat(4);
        assert_eq!(
            values,
            [Some(&b"value-0"[..]), None, Some(&long[..])],
            "{codec}"
        );
        let stamps = batch.column(2).as_primitive::<TimestampMillisecondType>();
        let base = 1_700_000_000_000;
        assert_eq!(
            stamps.values().to_vec(),
            [base, base + 5, base + 9],
            "{codec}"
        );
        let headers = batch.column(3).as_list::<i32>();
        assert!(
            headers.is_null(0) && !headers.is_null(1) && headers.is_null(2),
            "{codec}"
        );
        let (names, header_values) = header_pairs(&batch, 1);
        assert_eq!(names, ["h", "n"], "{codec}");
        assert_eq!(header_values, [Some(b"x".to_vec()), None], "{codec}");
        let offsets = batch.column(5).as_primitive::<Int64Type>();
        assert_eq!(offsets.values().to_vec(), [0, 1, 2], "{codec}");
    }
}

#[test]
fn a_committed_transaction_after_an_aborted_one_decodes() {
    let aborted = [AbortedTransaction {
        producer_id: 1000,
        first_offset: 0,
    }];
    let (batch, decoded) = decode(TXN, &aborted);
    let values: Vec<_> = batch.column(1).as_binary::<i32>().iter().collect();
    assert_eq!(values, [Some(&b"committed"[..])]);
    assert_eq!(batch.column(5).as_primitive::<Int64Type>().value(0), 2);
    assert_eq!(decoded.next_offset, 4);
}
