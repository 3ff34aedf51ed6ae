//! The reducer's decode and the acknowledgement path, on the window bench's ~100-byte rows.
//!
//! `decode_concat`: one mapper's payload of 32,768 rows (decoded in place) and four
//! mappers' payloads (decoded and concatenated once). `ack`: a GetRows for 0 rows, which
//! encodes nothing, beside the schema-only stream it used to encode.

use std::hint::black_box;
use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray, UInt32Array};
use arrow_buffer::Buffer;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use millstream_core::{ipc, LocalMapperState, SharedWindow, Window, WindowOptions};

const ROWS: usize = 32_768;

fn batch(rows: usize, seed: i64) -> RecordBatch {
    let key: ArrayRef = Arc::new(Int64Array::from_iter_values(
        (0..rows as i64).map(|i| (i + seed).wrapping_mul(0x9E37_79B9) % 100_000),
    ));
    let value: ArrayRef = Arc::new(Int64Array::from_iter_values(0..rows as i64));
    let payload: ArrayRef = Arc::new(StringArray::from_iter_values(
        (0..rows).map(|i| format!("{i:0>80}")),
    ));
    RecordBatch::try_from_iter([("key", key), ("value", value), ("payload", payload)]).unwrap()
}

fn bench_decode(c: &mut Criterion) {
    let mut group = c.benchmark_group("decode_concat");
    group.sample_size(30);
    for mappers in [1usize, 4] {
        let payloads: Vec<Buffer> = (0..mappers)
            .map(|m| {
                let b = batch(ROWS, m as i64);
                Buffer::from_vec(ipc::encode(&b.schema(), &[b]).unwrap().to_vec())
            })
            .collect();
        let bytes: usize = payloads.iter().map(Buffer::len).sum();
        group.throughput(Throughput::Bytes(bytes as u64));
        group.bench_function(BenchmarkId::new("payloads", mappers), |bench| {
            bench.iter(|| black_box(ipc::decode_concat(payloads.clone()).unwrap()));
        });
    }
    group.finish();
}

fn bench_ack(c: &mut Criterion) {
    let window = Window::new(WindowOptions {
        num_reducers: 2,
        memory_limit_bytes: u64::MAX,
        max_payload_bytes: u64::MAX,
        initial_state: LocalMapperState::default(),
    })
    .unwrap();
    let shared = SharedWindow::new(window);
    let b = batch(ROWS, 0);
    let schema = b.schema();
    let reducers = UInt32Array::from_iter_values((0..ROWS as u32).map(|i| i % 2));
    shared
        .push(b, &reducers, ROWS as i64, Vec::new(), None)
        .unwrap();
    let mut group = c.benchmark_group("ack");
    group.bench_function("get_rows_0_rows", |bench| {
        bench.iter(|| black_box(shared.get_rows(0, -1, 0, 1 << 20).unwrap()));
    });
    group.bench_function("schema_only_stream", |bench| {
        bench.iter(|| black_box(ipc::encode(&schema, &[]).unwrap().to_vec()));
    });
    group.finish();
}

criterion_group!(benches, bench_decode, bench_ack);
criterion_main!(benches);
