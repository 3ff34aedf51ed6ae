//! The mapper window path on ~100-byte rows: push (group by reducer), get_rows (encode the
//! IPC stream and copy it out once), and the full cycle push + serialize + commit + trim.
//!
//! Rows: int64 key, int64 value, 80-byte utf8 payload (100 bytes of Arrow data per row).

use std::hint::black_box;
use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray, UInt32Array};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use millstream_core::{partition, LocalMapperState, Window, WindowOptions};

const ROWS: usize = 32_768;

fn batch(rows: usize) -> RecordBatch {
    let key: ArrayRef = Arc::new(Int64Array::from_iter_values(
        (0..rows as i64).map(|i| i.wrapping_mul(0x9E37_79B9) % 100_000),
    ));
    let value: ArrayRef = Arc::new(Int64Array::from_iter_values(0..rows as i64));
    let payload: ArrayRef = Arc::new(StringArray::from_iter_values(
        (0..rows).map(|i| format!("{i:0>80}")),
    ));
    RecordBatch::try_from_iter([("key", key), ("value", value), ("payload", payload)]).unwrap()
}

/// Arrow data bytes of the rows (what a reducer receives), without allocation slack.
fn data_bytes(b: &RecordBatch) -> u64 {
    b.columns()
        .iter()
        .map(|c| {
            c.to_data()
                .buffers()
                .iter()
                .map(|x| x.len() as u64)
                .sum::<u64>()
        })
        .sum()
}

fn window(num_reducers: u32) -> Window {
    Window::new(WindowOptions {
        num_reducers,
        memory_limit_bytes: u64::MAX,
        max_payload_bytes: u64::MAX,
        initial_state: LocalMapperState::default(),
    })
    .unwrap()
}

fn reducers(b: &RecordBatch, num_reducers: u32) -> UInt32Array {
    let r = partition::partition(b, &["key"], num_reducers).unwrap();
    UInt32Array::from_iter_values(r.values().iter().map(|&v| v as u32))
}

/// Commits every reducer's rows up to `end`, which trims every entry.
fn commit_all(w: &mut Window, num_reducers: u32, end: i64) {
    for r in 0..num_reducers {
        w.pop_committed(i64::from(r), end).unwrap();
    }
}

fn bench(c: &mut Criterion) {
    let b = batch(ROWS);
    let bytes = data_bytes(&b);
    eprintln!(
        "batch: {ROWS} rows, {bytes} data bytes ({:.1} bytes/row)",
        bytes as f64 / ROWS as f64
    );

    for num_reducers in [8u32, 64] {
        let r = reducers(&b, num_reducers);
        {
            let mut w = window(num_reducers);
            for _ in 0..8 {
                let end = w.snapshot().shuffle_end_row_index;
                w.push(b.clone(), &r, end, Vec::new()).unwrap();
            }
            eprintln!(
                "{num_reducers} reducers: index overhead {:.3} bytes/row, buffered {:.1} bytes/row",
                w.snapshot().index_bytes as f64 / w.snapshot().buffered_rows as f64,
                w.snapshot().buffered_bytes as f64 / w.snapshot().buffered_rows as f64,
            );
        }

        let mut group = c.benchmark_group("window");
        group.throughput(Throughput::Bytes(bytes));
        group.sample_size(30);

        group.bench_function(BenchmarkId::new("push", num_reducers), |bench| {
            let mut w = window(num_reducers);
            bench.iter(|| {
                let end = w.snapshot().shuffle_end_row_index;
                w.push(b.clone(), &r, end, Vec::new()).unwrap();
                commit_all(&mut w, num_reducers, end + ROWS as i64);
            });
        });

        group.bench_function(BenchmarkId::new("get_rows", num_reducers), |bench| {
            let mut w = window(num_reducers);
            w.push(b.clone(), &r, 1, Vec::new()).unwrap();
            bench.iter(|| {
                for reducer in 0..num_reducers {
                    let rows = w
                        .get_rows(i64::from(reducer), -1, i64::MAX, i64::MAX)
                        .unwrap();
                    black_box(rows.to_ipc().unwrap().to_vec());
                }
            });
        });

        group.bench_function(BenchmarkId::new("cycle", num_reducers), |bench| {
            let mut w = window(num_reducers);
            let mut committed = vec![-1i64; num_reducers as usize];
            bench.iter(|| {
                let end = w.snapshot().input_end_row_index + 1;
                w.push(b.clone(), &r, end, Vec::new()).unwrap();
                for reducer in 0..num_reducers {
                    let rows = w
                        .get_rows(
                            i64::from(reducer),
                            committed[reducer as usize],
                            i64::MAX,
                            i64::MAX,
                        )
                        .unwrap();
                    black_box(rows.to_ipc().unwrap().to_vec());
                    committed[reducer as usize] = rows.last_shuffle_row_index;
                }
                for reducer in 0..num_reducers {
                    w.pop_committed(i64::from(reducer), committed[reducer as usize])
                        .unwrap();
                }
                assert_eq!(w.snapshot().num_entries, 0);
            });
        });
        group.finish();
    }
}

/// One reducer: the batch is already grouped and kept without a copy, unless it is a slice
/// of a larger batch (here a quarter of one), which the window copies into buffers of its
/// own.
fn bench_pass_through(c: &mut Criterion) {
    let b = batch(ROWS);
    let bytes = data_bytes(&b);
    let parent = batch(4 * ROWS);
    let one = UInt32Array::from(vec![0u32; ROWS]);
    let mut group = c.benchmark_group("window_pass_through");
    group.throughput(Throughput::Bytes(bytes));
    group.sample_size(30);
    group.bench_function("push_whole", |bench| {
        let mut w = window(1);
        bench.iter(|| {
            let end = w.snapshot().shuffle_end_row_index;
            w.push(b.clone(), &one, end, Vec::new()).unwrap();
            commit_all(&mut w, 1, end + ROWS as i64);
        });
    });
    group.bench_function("push_slice", |bench| {
        let mut w = window(1);
        let mut k = 0;
        bench.iter(|| {
            let end = w.snapshot().shuffle_end_row_index;
            w.push(parent.slice(k * ROWS, ROWS), &one, end, Vec::new())
                .unwrap();
            commit_all(&mut w, 1, end + ROWS as i64);
            k = (k + 1) % 4;
        });
    });
    group.finish();
}

criterion_group!(benches, bench, bench_pass_through);
criterion_main!(benches);
