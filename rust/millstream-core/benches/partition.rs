//! Stable hash partitioning of 32,768 rows by an int64 key, a ~16-byte utf8 key, a
//! dictionary-encoded utf8 key and two columns.

use std::sync::Arc;

use arrow_array::types::Int32Type;
use arrow_array::{ArrayRef, DictionaryArray, Int64Array, RecordBatch, StringArray};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use millstream_core::partition;

const ROWS: usize = 32_768;

fn bench(c: &mut Criterion) {
    let ints: ArrayRef = Arc::new(Int64Array::from_iter_values(
        (0..ROWS as i64).map(|i| i.wrapping_mul(0x9E37_79B9) % 100_000),
    ));
    let words =
        StringArray::from_iter_values((0..ROWS).map(|i| format!("word-{:0>10}", i % 100_000)));
    let names: Vec<String> = (0..ROWS)
        .map(|i| format!("word-{:0>10}", i % 1000))
        .collect();
    let dict: DictionaryArray<Int32Type> = names.iter().map(String::as_str).collect();
    let batch = RecordBatch::try_from_iter([
        ("int", ints),
        ("str", Arc::new(words) as ArrayRef),
        ("dict", Arc::new(dict) as ArrayRef),
    ])
    .unwrap();

    let mut group = c.benchmark_group("hash_partition");
    group.throughput(Throughput::Elements(ROWS as u64));
    for keys in [&["int"][..], &["str"], &["dict"], &["int", "str"]] {
        group.bench_function(BenchmarkId::from_parameter(keys.join("+")), |b| {
            b.iter(|| partition::partition(&batch, keys, 64).unwrap());
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
