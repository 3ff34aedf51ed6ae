//! Window behaviour not covered by the model test: memory, schema, threads.

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use arrow_array::{ArrayRef, Int32Array, Int64Array, RecordBatch, StringArray, UInt32Array};
use arrow_buffer::Buffer;
use millstream_core::{
    ipc, Error, LocalMapperState, Room, SharedWindow, Window, WindowOptions, SHUFFLE_INDEX_COLUMN,
};

fn window(num_reducers: u32, memory_limit_bytes: u64) -> Window {
    Window::new(WindowOptions {
        num_reducers,
        memory_limit_bytes,
        max_payload_bytes: u64::MAX,
        initial_state: LocalMapperState::default(),
    })
    .unwrap()
}

fn rows(n: usize) -> RecordBatch {
    let v: ArrayRef = Arc::new(Int64Array::from_iter_values(0..n as i64));
    let s: ArrayRef = Arc::new(StringArray::from_iter_values(
        (0..n).map(|i| format!("{i:0>80}")),
    ));
    RecordBatch::try_from_iter([("v", v), ("s", s)]).unwrap()
}

fn spread(n: usize, num_reducers: u32) -> UInt32Array {
    UInt32Array::from_iter_values(
        (0..n as u32).map(|i| i.wrapping_mul(2_654_435_761) % num_reducers),
    )
}

#[test]
fn index_overhead_is_at_most_eight_bytes_per_row() {
    let mut w = window(64, u64::MAX);
    for _ in 0..10 {
        w.push(rows(10_000), &spread(10_000, 64), 1, Vec::new())
            .unwrap();
    }
    let per_row = w.snapshot().index_bytes as f64 / w.snapshot().buffered_rows as f64;
    assert!(per_row <= 8.0, "{per_row} index bytes per row");
}

#[test]
fn a_batch_over_the_limit_is_rejected_without_side_effects() {
    let mut w = window(2, 10_000);
    let e = w
        .push(rows(1000), &spread(1000, 2), 5, Vec::new())
        .unwrap_err();
    assert!(matches!(
        e,
        Error::BatchOverMemoryLimit {
            memory_limit_bytes: 10_000,
            ..
        }
    ));
    assert!(e.to_string().contains("smaller input batches"));
    assert_eq!(
        (
            w.snapshot().num_entries,
            w.snapshot().input_end_row_index,
            w.snapshot().shuffle_end_row_index
        ),
        (0, 0, 0)
    );
}

#[test]
fn schema_is_fixed_by_the_first_batch_with_rows() {
    let mut w = window(1, u64::MAX);
    w.push(rows(2), &spread(2, 1), 1, Vec::new()).unwrap();
    let other =
        RecordBatch::try_from_iter([("v", Arc::new(Int32Array::from(vec![1])) as ArrayRef)])
            .unwrap();
    let e = w.push(other, &spread(1, 1), 2, Vec::new()).unwrap_err();
    assert!(matches!(e, Error::SchemaMismatch { .. }), "{e}");
}

#[test]
fn sorted_batches_are_kept_without_a_copy() {
    let mut w = window(4, u64::MAX);
    let b = rows(100);
    let reducers = UInt32Array::from_iter_values((0..100).map(|i| i / 25));
    w.push(b.clone(), &reducers, 1, Vec::new()).unwrap();
    let got = w.get_rows(2, -1, 100, i64::MAX).unwrap();
    assert_eq!(got.batches.len(), 1);
    assert_eq!(got.batches[0], b.slice(50, 25));
    let original = b.column(1).to_data().buffers()[1].as_ptr();
    assert_eq!(
        got.batches[0].column(1).to_data().buffers()[1].as_ptr(),
        original
    );
}

#[test]
fn waiters_wake_when_reducers_commit_or_the_window_closes() {
    let entry_bytes = {
        let mut probe = window(1, u64::MAX);
        probe.push(rows(10), &spread(10, 1), 1, Vec::new()).unwrap();
        probe.snapshot().buffered_bytes
    };
    let mut w = window(1, entry_bytes + 1);
    w.push(rows(10), &spread(10, 1), 1, Vec::new()).unwrap();
    w.push(rows(10), &spread(10, 1), 1, Vec::new()).unwrap();
    let shared = Arc::new(SharedWindow::new(w));
    assert_eq!(
        shared
            .wait_for_room(Some(Duration::from_millis(1)))
            .unwrap(),
        Room::TimedOut
    );
    let waiter = {
        let shared = shared.clone();
        thread::spawn(move || shared.wait_for_room(None).unwrap())
    };
    shared.get_rows(0, 9, 1, 1).unwrap();
    assert_eq!(waiter.join().unwrap(), Room::Available);

    shared
        .push(rows(10), &spread(10, 1), 2, Vec::new(), None)
        .unwrap();
    assert!(!shared.with(Window::has_room).unwrap());
    let waiter = {
        let shared = shared.clone();
        thread::spawn(move || shared.wait_for_room(None).unwrap())
    };
    shared.close().unwrap();
    assert_eq!(waiter.join().unwrap(), Room::Closed);
    assert!(matches!(
        shared.push(rows(1), &spread(1, 1), 3, Vec::new(), None),
        Err(Error::Closed)
    ));
}

#[test]
fn concurrent_push_and_get_rows_deliver_every_row_once() {
    let num_reducers = 3;
    let shared = Arc::new(SharedWindow::new(window(num_reducers, 1 << 16)));
    let total = 20_000i64;
    let pusher = {
        let shared = shared.clone();
        thread::spawn(move || {
            for b in 0..(total / 500) {
                let batch = RecordBatch::try_from_iter([(
                    "v",
                    Arc::new(Int64Array::from_iter_values(b * 500..(b + 1) * 500)) as ArrayRef,
                )])
                .unwrap();
                let reducers =
                    UInt32Array::from_iter_values((b * 500..(b + 1) * 500).map(|i| (i % 3) as u32));
                shared
                    .push(batch, &reducers, (b + 1) * 500, Vec::new(), None)
                    .unwrap();
                while shared
                    .wait_for_room(Some(Duration::from_millis(10)))
                    .unwrap()
                    != Room::Available
                {}
            }
        })
    };
    let readers: Vec<_> = (0..num_reducers)
        .map(|r| {
            let shared = shared.clone();
            thread::spawn(move || {
                let mut committed = -1;
                let mut seen = 0;
                let mine = (0..total).filter(|i| i % 3 == i64::from(r)).count() as i64;
                while seen < mine {
                    let got = shared
                        .get_rows(i64::from(r), committed, 300, 1 << 20)
                        .unwrap();
                    if got.row_count == 0 {
                        thread::yield_now();
                        continue;
                    }
                    seen += got.row_count as i64;
                    committed = got.last_shuffle_row_index;
                }
                shared.get_rows(i64::from(r), committed, 1, 1).unwrap();
                seen
            })
        })
        .collect();
    pusher.join().unwrap();
    let seen: i64 = readers.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(seen, total);
    let w = shared
        .with(|w| (w.snapshot().buffered_bytes, w.local_state().clone()))
        .unwrap();
    assert_eq!(w.0, 0);
    assert_eq!(w.1.shuffle_unread_row_index, total);
}

/// Rows for reducer 0 of `big` bytes each, one in `every`; the others small, for reducer 1.
fn skewed(n: usize, every: usize, big: usize) -> (RecordBatch, UInt32Array) {
    let s: ArrayRef = Arc::new(StringArray::from_iter_values((0..n).map(|i| {
        if i % every == 0 {
            "x".repeat(big)
        } else {
            format!("{i}")
        }
    })));
    let v: ArrayRef = Arc::new(Int64Array::from_iter_values(0..n as i64));
    let reducers = UInt32Array::from_iter_values((0..n).map(|i| u32::from(i % every != 0)));
    (
        RecordBatch::try_from_iter([("v", v), ("s", s)]).unwrap(),
        reducers,
    )
}

#[test]
fn get_rows_byte_cap_holds_with_skewed_row_sizes() {
    // Reducer 0's rows are 100 KB each, reducer 1's a few bytes: the average row is ~5 KB.
    let (batch, reducers) = skewed(4_000, 20, 100_000);
    let mut w = window(2, u64::MAX);
    w.push(batch, &reducers, 1, Vec::new()).unwrap();
    let cap = 1 << 20;
    let (mut committed, mut seen, mut responses) = (-1, 0, 0);
    loop {
        let rows = w.get_rows(0, committed, i64::MAX, cap).unwrap();
        if rows.is_empty() {
            break;
        }
        let payload = rows.to_ipc().unwrap().len() as i64;
        assert!(payload <= cap, "{} rows in {payload} bytes", rows.row_count);
        assert!(rows.row_count >= 9, "only {} rows fit", rows.row_count);
        seen += rows.row_count;
        committed = rows.last_shuffle_row_index;
        responses += 1;
    }
    assert_eq!((seen, responses), (200, 20));
    // Reducer 1's small rows are not held back by reducer 0's large ones.
    let rows = w.get_rows(1, -1, i64::MAX, 64 * 1024).unwrap();
    assert!(rows.to_ipc().unwrap().len() <= 64 * 1024);
    assert!(rows.row_count > 1_000, "{} rows", rows.row_count);
}

#[test]
fn a_row_larger_than_the_cap_is_returned_alone() {
    let (batch, reducers) = skewed(100, 10, 50_000);
    let mut w = window(2, u64::MAX);
    w.push(batch, &reducers, 1, Vec::new()).unwrap();
    let rows = w.get_rows(0, -1, 100, 1_000).unwrap();
    assert_eq!((rows.row_count, rows.last_shuffle_row_index), (1, 0));
    let rows = w.get_rows(0, 0, 100, 1_000).unwrap();
    assert_eq!((rows.row_count, rows.last_shuffle_row_index), (1, 10));
}

#[test]
fn a_row_over_the_payload_limit_is_refused_at_push() {
    let (batch, reducers) = skewed(100, 10, 50_000);
    let mut w = Window::new(WindowOptions {
        num_reducers: 2,
        memory_limit_bytes: u64::MAX,
        max_payload_bytes: 40_000,
        initial_state: LocalMapperState::default(),
    })
    .unwrap();
    let e = w.push(batch, &reducers, 1, Vec::new()).unwrap_err();
    assert!(
        matches!(
            e,
            Error::RowOverPayloadLimit {
                shuffle_row_index: 0,
                reducer_index: 0,
                max_payload_bytes: 40_000,
                row_bytes,
            } if row_bytes > 50_000
        ),
        "{e}"
    );
    assert!(e.to_string().contains("grpc_max_message_bytes"), "{e}");
    assert_eq!(
        (w.snapshot().num_entries, w.snapshot().shuffle_end_row_index),
        (0, 0)
    );
    // Rows that fit are served within the limit, whatever the caller's cap.
    let (batch, reducers) = skewed(100, 10, 30_000);
    w.push(batch, &reducers, 1, Vec::new()).unwrap();
    let rows = w.get_rows(0, -1, 100, i64::MAX).unwrap();
    assert_eq!(rows.row_count, 1);
    assert!(rows.to_ipc().unwrap().len() <= 40_000);
}

#[test]
fn a_small_slice_of_a_large_batch_is_charged_its_own_bytes() {
    // 160,000 rows of ~100 bytes (16 MB); a window of 1 MiB takes a 16 KB slice of them.
    let big = rows(160_000);
    let mut w = window(1, 1 << 20);
    let slice = big.slice(100_000, 160);
    w.push(slice.clone(), &spread(160, 1), 1, Vec::new())
        .unwrap();
    assert!(
        w.snapshot().buffered_bytes < 64 * 1024,
        "{}",
        w.snapshot().buffered_bytes
    );
    let got = w.get_rows(0, -1, 1_000, i64::MAX).unwrap();
    assert_eq!(got.batches, vec![slice]);
}

#[test]
fn slices_of_one_batch_are_charged_once_in_total() {
    let big = rows(160_000);
    let mut probe = window(1, u64::MAX);
    probe
        .push(big.clone(), &spread(160_000, 1), 1, Vec::new())
        .unwrap();
    let whole = probe.snapshot().buffered_bytes;
    let mut w = window(1, u64::MAX);
    for k in 0..8 {
        let part = big.slice(k * 20_000, 20_000);
        w.push(part, &spread(20_000, 1), 1, Vec::new()).unwrap();
    }
    assert!(
        w.snapshot().buffered_bytes <= whole + whole / 10,
        "8 slices charged {} bytes, the whole batch {whole}",
        w.snapshot().buffered_bytes
    );
}

#[test]
fn a_get_rows_without_rows_encodes_nothing() {
    let shared = SharedWindow::new(window(2, u64::MAX));
    shared
        .push(
            rows(10),
            &UInt32Array::from(vec![0; 10]),
            10,
            Vec::new(),
            None,
        )
        .unwrap();
    // The acknowledgement of a commit (0 rows), and a reducer with nothing buffered.
    let ack = shared.get_rows(0, 4, 0, 1 << 20).unwrap();
    assert_eq!((ack.row_count, ack.last_shuffle_row_index), (0, 4));
    assert!(ack.payload.is_empty(), "{} bytes", ack.payload.len());
    let idle = shared.get_rows(1, -1, 100, 1 << 20).unwrap();
    assert_eq!((idle.row_count, idle.last_shuffle_row_index), (0, -1));
    assert!(idle.payload.is_empty(), "{} bytes", idle.payload.len());
    let served = shared.get_rows(0, 4, 100, 1 << 20).unwrap();
    assert_eq!((served.row_count, served.last_shuffle_row_index), (5, 9));
    assert!(!served.payload.is_empty());
}

#[test]
fn a_snapshot_takes_every_figure_at_once() {
    let shared = SharedWindow::new(
        Window::new(WindowOptions {
            num_reducers: 2,
            memory_limit_bytes: 1 << 30,
            max_payload_bytes: 1 << 20,
            initial_state: LocalMapperState {
                input_unread_row_index: 100,
                shuffle_unread_row_index: 40,
                continuation_token: b"t".to_vec(),
            },
        })
        .unwrap(),
    );
    shared
        .push(rows(6), &spread(6, 2), 110, b"a".to_vec(), None)
        .unwrap();
    shared
        .push(
            rows(4),
            &UInt32Array::from(vec![1; 4]),
            120,
            b"b".to_vec(),
            None,
        )
        .unwrap();
    let s = shared.snapshot().unwrap();
    assert_eq!(
        (s.num_reducers, s.memory_limit_bytes, s.max_payload_bytes),
        (2, 1 << 30, 1 << 20)
    );
    assert_eq!(
        (s.num_entries, s.first_entry_index, s.buffered_rows),
        (2, 0, 10)
    );
    assert_eq!((s.input_end_row_index, s.shuffle_end_row_index), (120, 50));
    assert_eq!(s.local_state.input_unread_row_index, 100);
    assert!(s.index_bytes > 0 && s.buffered_bytes > s.index_bytes);
    assert!(!s.closed);
    // Both reducers commit all their rows: every entry is trimmed.
    shared.get_rows(0, 45, 0, 0).unwrap();
    shared.get_rows(1, 49, 0, 0).unwrap();
    shared.close().unwrap();
    let s = shared.snapshot().unwrap();
    assert_eq!(
        (s.num_entries, s.first_entry_index, s.buffered_rows),
        (0, 2, 0)
    );
    assert_eq!((s.buffered_bytes, s.index_bytes), (0, 0));
    assert_eq!(
        s.local_state,
        LocalMapperState {
            input_unread_row_index: 120,
            shuffle_unread_row_index: 50,
            continuation_token: b"b".to_vec(),
        }
    );
    assert!(s.closed);
}

#[test]
fn room_can_be_reserved_for_the_next_batch() {
    let entry_bytes = {
        let mut probe = window(1, 1 << 20);
        probe.push(rows(10), &spread(10, 1), 1, Vec::new()).unwrap();
        probe.snapshot().buffered_bytes
    };
    let mut w = window(1, 3 * entry_bytes);
    w.push(rows(10), &spread(10, 1), 1, Vec::new()).unwrap();
    w.push(rows(10), &spread(10, 1), 1, Vec::new()).unwrap();
    assert!(w.has_room());
    assert!(w.has_room_for(entry_bytes));
    assert!(!w.has_room_for(entry_bytes + 1));
    let shared = SharedWindow::new(w);
    assert_eq!(
        shared
            .wait_for_room_for(Some(Duration::from_millis(1)), entry_bytes + 1)
            .unwrap(),
        Room::TimedOut
    );
    shared.get_rows(0, 19, 1, 1).unwrap();
    assert_eq!(
        shared
            .wait_for_room_for(Some(Duration::from_millis(1)), 100 * entry_bytes)
            .unwrap(),
        Room::Available,
        "an empty window always has room"
    );
}

#[test]
fn a_fetch_position_serves_rows_after_it_with_their_shuffle_indices() {
    // Reducer 0 holds every 20th row: shuffle indices 0, 20, 40, ...
    let (batch, reducers) = skewed(1_000, 20, 10);
    let mut w = window(2, u64::MAX);
    w.push(batch, &reducers, 1, Vec::new()).unwrap();
    let reducer_0 = |n: i64| (0..n).map(|i| i * 20).collect::<Vec<_>>();
    // Fetched through 200, committed nothing: the rows after 200, and the bucket keeps all.
    let rows = w.peek_rows(0, 200, i64::MAX, i64::MAX, true).unwrap();
    assert_eq!(rows.shuffle_indices.as_deref(), Some(&reducer_0(50)[11..]));
    assert_eq!(rows.last_shuffle_row_index, 980);
    assert_eq!(w.bucket_len(0).unwrap(), 50);
    assert_eq!(w.bucket_len_after(0, 200).unwrap(), 39);
    assert_eq!(w.bucket_len_after(0, 980).unwrap(), 0);
    // The stream carries the indices as its last column, and the byte cap counts them.
    let cap = 1_000;
    let rows = w.peek_rows(0, 200, i64::MAX, cap, true).unwrap();
    let payload = rows.to_ipc().unwrap();
    assert!(payload.len() as i64 <= cap, "{} bytes", payload.len());
    assert!(
        rows.row_count > 1 && rows.row_count < 39,
        "{} rows",
        rows.row_count
    );
    let decoded = ipc::decode_concat([Buffer::from_vec(payload.to_vec())]).unwrap();
    let column = decoded.column(decoded.num_columns() - 1);
    let indices = column.as_any().downcast_ref::<Int64Array>().unwrap();
    assert_eq!(indices.values().to_vec(), rows.shuffle_indices.unwrap());
    assert_eq!(
        decoded.schema().field(decoded.num_columns() - 1).name(),
        SHUFFLE_INDEX_COLUMN
    );
}
