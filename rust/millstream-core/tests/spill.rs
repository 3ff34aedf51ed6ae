//! Straggler spill: which rows leave the window, in which chunks, and what stays.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray, UInt32Array};
use millstream_core::ipc::decode_concat;
use millstream_core::{LocalMapperState, Window, WindowOptions, SHUFFLE_INDEX_COLUMN};

fn window(num_reducers: u32) -> Window {
    Window::new(WindowOptions {
        num_reducers,
        memory_limit_bytes: u64::MAX,
        max_payload_bytes: u64::MAX,
        initial_state: LocalMapperState::default(),
    })
    .unwrap()
}

/// `n` rows whose `v` is their row number within the batch plus `base`.
fn rows(n: usize, base: i64) -> RecordBatch {
    let v: ArrayRef = Arc::new(Int64Array::from_iter_values(base..base + n as i64));
    let s: ArrayRef = Arc::new(StringArray::from_iter_values(
        (0..n).map(|i| format!("{i:0>60}")),
    ));
    RecordBatch::try_from_iter([("v", v), ("s", s)]).unwrap()
}

/// Row `i` goes to reducer `i % num_reducers`.
fn round_robin(n: usize, num_reducers: u32) -> UInt32Array {
    UInt32Array::from_iter_values((0..n as u32).map(|i| i % num_reducers))
}

/// Every spilled row of `reducer` as (shuffle index, v), decoded from the chunks.
fn spilled(chunks: &[millstream_core::SpillChunk], reducer: u32) -> Vec<(i64, i64)> {
    let payloads = chunks
        .iter()
        .filter(|c| c.reducer_index == reducer)
        .map(|c| arrow_buffer::Buffer::from_vec(c.payload.to_vec()));
    let batch = decode_concat(payloads).unwrap();
    if batch.num_rows() == 0 {
        return Vec::new();
    }
    let index = batch
        .column_by_name(SHUFFLE_INDEX_COLUMN)
        .unwrap()
        .as_primitive::<Int64Type>();
    let v = batch
        .column_by_name("v")
        .unwrap()
        .as_primitive::<Int64Type>();
    index
        .values()
        .iter()
        .copied()
        .zip(v.values().iter().copied())
        .collect()
}

/// A window of two reducers holding `entries` entries of 100 rows, dealt round robin.
fn filled(entries: i64) -> Window {
    let mut w = window(2);
    for e in 0..entries {
        w.push(
            rows(100, 100 * e),
            &round_robin(100, 2),
            100 * (e + 1),
            Vec::new(),
        )
        .unwrap();
    }
    w
}

#[test]
fn the_straggler_rows_of_entries_the_others_passed_are_spilled_and_freed() {
    let mut w = filled(4);
    // Reducer 1 commits everything; reducer 0 (the straggler) nothing.
    w.get_rows(1, 399, 0, i64::MAX).unwrap();
    let before = w.snapshot();
    let chunks = w.peek_spill(&[0], 0, u64::MAX, u64::MAX).unwrap();
    assert_eq!(w.snapshot(), before, "peek_spill changes nothing");
    let rows0 = spilled(&chunks, 0);
    assert_eq!(
        rows0,
        (0..400).step_by(2).map(|i| (i, i)).collect::<Vec<_>>()
    );
    assert!(
        spilled(&chunks, 1).is_empty(),
        "reducer 1's rows are never spilled"
    );
    let last = chunks
        .iter()
        .map(|c| c.last_shuffle_row_index)
        .max()
        .unwrap();
    assert!(w.mark_spilled(0, last).unwrap());
    let after = w.snapshot();
    assert_eq!((after.num_entries, after.buffered_bytes), (0, 0));
    assert_eq!(after.local_state.input_unread_row_index, 400);
    assert_eq!(w.spilled_row_index(0).unwrap(), 398);
    // The committed index stays: the reducer still asks from -1, and gets no window rows.
    let r = w.get_rows(0, -1, 1000, i64::MAX).unwrap();
    assert_eq!((r.row_count, r.last_shuffle_row_index), (0, -1));
}

#[test]
fn only_the_named_stragglers_are_spilled_and_only_past_someone() {
    let mut w = window(3);
    w.push(rows(90, 0), &round_robin(90, 3), 90, Vec::new())
        .unwrap();
    // Nobody has moved past the entry: spilling would let nobody read on.
    assert!(w
        .peek_spill(&[0, 1, 2], 0, u64::MAX, u64::MAX)
        .unwrap()
        .is_empty());
    w.get_rows(2, 89, 0, i64::MAX).unwrap();
    // Reducer 1 still needs the entry and is not named a straggler.
    assert!(w
        .peek_spill(&[0], 0, u64::MAX, u64::MAX)
        .unwrap()
        .is_empty());
    let chunks = w.peek_spill(&[0, 1], 0, u64::MAX, u64::MAX).unwrap();
    assert_eq!(spilled(&chunks, 0).len(), 30);
    assert_eq!(spilled(&chunks, 1).len(), 30);
    assert!(
        w.peek_spill(&[3], 0, u64::MAX, u64::MAX).is_err(),
        "no reducer 3"
    );
    let mut one = window(1);
    one.push(rows(10, 0), &round_robin(10, 1), 10, Vec::new())
        .unwrap();
    assert!(one
        .peek_spill(&[0], 0, u64::MAX, u64::MAX)
        .unwrap()
        .is_empty());
}

#[test]
fn spilling_stops_at_the_target_and_the_byte_budget() {
    let mut w = filled(10);
    w.get_rows(1, 999, 0, i64::MAX).unwrap();
    let bytes = w.entry_bytes();
    let total: u64 = bytes.iter().sum();
    // Down to what the last 6 entries hold: the first 4 entries go.
    let target = bytes[4..].iter().sum::<u64>();
    let chunks = w.peek_spill(&[0], target, u64::MAX, u64::MAX).unwrap();
    assert_eq!(spilled(&chunks, 0).last().unwrap().0, 398);
    assert!(target < total);
    // A small budget takes one entry at least.
    let chunks = w.peek_spill(&[0], 0, 1, u64::MAX).unwrap();
    assert_eq!(spilled(&chunks, 0).len(), 50);
}

#[test]
fn chunks_stay_under_their_size_and_keep_every_row_in_order() {
    let mut w = window(2);
    for e in 0..3 {
        w.push(
            rows(1000, 1000 * e),
            &round_robin(1000, 2),
            1000 * (e + 1),
            Vec::new(),
        )
        .unwrap();
    }
    w.get_rows(1, 2999, 0, i64::MAX).unwrap();
    let chunks = w.peek_spill(&[0], 0, u64::MAX, 8_192).unwrap();
    assert!(chunks.len() > 10);
    for c in &chunks {
        assert!(
            c.payload.len() <= 8_192,
            "a chunk of {} bytes",
            c.payload.len()
        );
        assert!(c.first_shuffle_row_index <= c.last_shuffle_row_index);
    }
    for pair in chunks.windows(2) {
        assert!(pair[0].last_shuffle_row_index < pair[1].first_shuffle_row_index);
    }
    let rows0 = spilled(&chunks, 0);
    assert_eq!(
        rows0,
        (0..3000).step_by(2).map(|i| (i, i)).collect::<Vec<_>>()
    );
    assert_eq!(chunks.iter().map(|c| c.row_count).sum::<u64>(), 1500);
}

#[test]
fn a_partly_fetched_bucket_spills_from_its_front_and_rows_never_come_back() {
    let mut w = window(2);
    w.push(rows(100, 0), &round_robin(100, 2), 100, Vec::new())
        .unwrap();
    w.get_rows(1, 99, 0, i64::MAX).unwrap();
    w.get_rows(0, 49, 0, i64::MAX).unwrap(); // reducer 0 committed rows 0..=49
    let chunks = w.peek_spill(&[0], 0, u64::MAX, u64::MAX).unwrap();
    let rows0 = spilled(&chunks, 0);
    assert_eq!(rows0.first().unwrap().0, 50);
    assert_eq!(rows0.last().unwrap().0, 98);
    w.mark_spilled(0, 98).unwrap();
    assert_eq!(w.snapshot().num_entries, 0);
    // A restarted mapper's window told what was spilled drops those rows when re-produced.
    let mut again = window(2);
    again.mark_spilled(0, 98).unwrap();
    again
        .push(rows(100, 0), &round_robin(100, 2), 100, Vec::new())
        .unwrap();
    assert_eq!(again.bucket_len(0).unwrap(), 0);
    assert_eq!(again.bucket_len(1).unwrap(), 50);
    // Marking less than already spilled changes nothing.
    assert!(!w.mark_spilled(0, 10).unwrap());
}
