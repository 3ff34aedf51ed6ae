//! Model test: random pushes, GetRows calls and straggler spills against a plain reference
//! model of the thesis algorithm (explicit per-reducer queues), checked step by step.

use std::sync::{Arc, OnceLock};

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{ArrayRef, Int64Array, RecordBatch, UInt32Array};
use arrow_buffer::Buffer;
use millstream_core::window::{COMPACT_RATIO, COMPACT_SLACK_BYTES};
use millstream_core::{ipc, Error, LocalMapperState, Window, WindowOptions, SHUFFLE_INDEX_COLUMN};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Push {
        reducers: Vec<u32>,
        input_advance: i64,
        /// Push a zero-copy slice of a large batch (as `map` passing its input through).
        slice: bool,
    },
    GetRows {
        reducer: u32,
        committed_delta: i64,
        max_rows: i64,
        small_bytes: bool,
    },
    /// A well-behaved reducer: commit what was returned last time, read more.
    CommitReturned { reducer: u32, max_rows: i64 },
    /// Spill every row only these stragglers still need, in chunks of this many bytes.
    Spill {
        stragglers: Vec<u32>,
        chunk_bytes: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (prop::collection::vec(0u32..8, 0..20), 0i64..5, any::<bool>())
            .prop_map(|(reducers, input_advance, slice)| Op::Push { reducers, input_advance, slice }),
        2 => (0u32..8, -3i64..25, 0i64..12, any::<bool>()).prop_map(
            |(reducer, committed_delta, max_rows, small_bytes)| Op::GetRows {
                reducer,
                committed_delta,
                max_rows,
                small_bytes,
            }
        ),
        3 => (0u32..8, 1i64..12).prop_map(|(reducer, max_rows)| Op::CommitReturned { reducer, max_rows }),
        1 => (prop::collection::vec(0u32..8, 0..4), prop_oneof![Just(1u64), 200u64..4000])
            .prop_map(|(stragglers, chunk_bytes)| Op::Spill { stragglers, chunk_bytes }),
    ]
}

#[derive(Debug, Clone)]
struct ModelEntry {
    input_end: i64,
    shuffle_begin: i64,
    shuffle_end: i64,
    token: Vec<u8>,
    /// (shuffle index, reducer) of rows kept at push time.
    rows: Vec<(i64, u32)>,
}

#[derive(Debug)]
struct Model {
    num_reducers: u32,
    entries: Vec<ModelEntry>,
    first_entry_index: u64,
    /// Per reducer: the highest committed index it sent.
    watermark: Vec<i64>,
    /// Per reducer: kept rows not yet committed, in shuffle order.
    queue: Vec<Vec<i64>>,
    /// Per reducer: last index returned (for CommitReturned).
    last_returned: Vec<i64>,
    /// Per reducer: the highest spilled index.
    spilled: Vec<i64>,
    local: LocalMapperState,
    input_end: i64,
    shuffle_end: i64,
}

impl Model {
    fn pointer_counts(&self) -> Vec<u32> {
        let mut counts = vec![0; self.entries.len()];
        for q in &self.queue {
            if let Some(&first) = q.first() {
                let at = self
                    .entries
                    .iter()
                    .position(|e| e.shuffle_begin <= first && first < e.shuffle_end)
                    .expect("a pending row lies in an entry");
                counts[at] += 1;
            }
        }
        counts
    }

    fn trim(&mut self) {
        let counts = self.pointer_counts();
        let trimmed = counts.iter().take_while(|&&c| c == 0).count();
        for e in self.entries.drain(..trimmed) {
            self.local = LocalMapperState {
                input_unread_row_index: e.input_end,
                shuffle_unread_row_index: e.shuffle_end,
                continuation_token: e.token,
            };
            self.first_entry_index += 1;
        }
    }

    fn push(&mut self, reducers: &[u32], input_end: i64, token: Vec<u8>) {
        let begin = self.shuffle_end;
        let mut rows = Vec::new();
        for (i, &r) in reducers.iter().enumerate() {
            let idx = begin + i as i64;
            if idx > self.watermark[r as usize].max(self.spilled[r as usize]) {
                rows.push((idx, r));
                self.queue[r as usize].push(idx);
            }
        }
        self.entries.push(ModelEntry {
            input_end,
            shuffle_begin: begin,
            shuffle_end: begin + reducers.len() as i64,
            token,
            rows,
        });
        self.shuffle_end += reducers.len() as i64;
        self.input_end = input_end;
        self.trim();
    }

    /// Returns the pending rows after popping, or the expected error kind.
    fn pop(&mut self, reducer: u32, committed: i64) -> Result<&[i64], &'static str> {
        let r = reducer as usize;
        if committed < -1 {
            return Err("invalid");
        }
        if committed < self.watermark[r] {
            return Err("backwards");
        }
        self.watermark[r] = committed;
        self.queue[r].retain(|&i| i > committed);
        self.trim();
        Ok(&self.queue[r])
    }

    /// The rows a spill takes, per reducer: from the front, the pending rows of every entry
    /// that some reducer with rows in it has passed and only stragglers still need.
    fn spill(&self, stragglers: &[u32]) -> Vec<Vec<i64>> {
        let mut out = vec![Vec::new(); self.num_reducers as usize];
        for e in &self.entries {
            let mut having: Vec<u32> = e.rows.iter().map(|&(_, r)| r).collect();
            having.sort_unstable();
            having.dedup();
            let inside = |i: &i64| e.shuffle_begin <= *i && *i < e.shuffle_end;
            let waiting: Vec<u32> = having
                .iter()
                .copied()
                .filter(|&r| self.queue[r as usize].iter().any(inside))
                .collect();
            if waiting.is_empty() {
                continue;
            }
            if waiting.len() == having.len() || waiting.iter().any(|r| !stragglers.contains(r)) {
                break;
            }
            for r in waiting {
                out[r as usize].extend(self.queue[r as usize].iter().copied().filter(inside));
            }
        }
        out
    }

    fn mark_spilled(&mut self, reducer: usize, through: i64) {
        self.spilled[reducer] = self.spilled[reducer].max(through);
        self.queue[reducer].retain(|&i| i > through);
        self.trim();
    }

    fn buffered_rows(&self) -> u64 {
        self.entries.iter().map(|e| e.rows.len() as u64).sum()
    }
}

fn batch(begin: i64, n: usize) -> RecordBatch {
    let v: ArrayRef = Arc::new(Int64Array::from_iter_values(begin..begin + n as i64));
    let s: ArrayRef = Arc::new(arrow_array::StringArray::from_iter_values(
        (begin..begin + n as i64).map(|i| format!("row {i}")),
    ));
    RecordBatch::try_from_iter([("v", v), ("s", s)]).unwrap()
}

/// Rows 0..PARENT_ROWS, of which pushes take slices (row i holds shuffle index i).
const PARENT_ROWS: usize = 100_000;

fn parent() -> &'static RecordBatch {
    static PARENT: OnceLock<RecordBatch> = OnceLock::new();
    PARENT.get_or_init(|| batch(0, PARENT_ROWS))
}

/// Upper bound of what an entry of `rows` rows of [`batch`] may be charged: its rows' own
/// bytes (int64, an offset and at most 9 string bytes each, padded), twice over when kept
/// without a copy, plus the index.
fn entry_bytes_bound(rows: u64, num_reducers: u32, token: usize) -> u64 {
    let own = 21 * rows + 4 * 8;
    let index = 4 * rows + 4 * u64::from(num_reducers + 1) + token as u64 + 512;
    COMPACT_RATIO * own + COMPACT_SLACK_BYTES + index
}

fn values(batches: &[RecordBatch]) -> Vec<i64> {
    batches
        .iter()
        .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
        .collect()
}

fn check(window: &Window, model: &Model) {
    assert_eq!(window.bucket_pointer_counts(), model.pointer_counts());
    let ranges: Vec<_> = model
        .entries
        .iter()
        .map(|e| (e.input_end, e.shuffle_begin, e.shuffle_end))
        .collect();
    assert_eq!(window.entry_ranges(), ranges);
    assert_eq!(window.snapshot().first_entry_index, model.first_entry_index);
    assert_eq!(window.local_state(), &model.local);
    assert_eq!(window.snapshot().input_end_row_index, model.input_end);
    assert_eq!(window.snapshot().shuffle_end_row_index, model.shuffle_end);
    assert_eq!(window.snapshot().buffered_rows, model.buffered_rows());
    assert_eq!(
        window.snapshot().buffered_bytes == 0,
        model.entries.is_empty()
    );
    // Memory: every entry is charged what it holds (its rows, not the buffers it was sliced
    // from), and trimming frees exactly what entries were charged.
    let charged = window.entry_bytes();
    assert_eq!(
        charged.iter().sum::<u64>(),
        window.snapshot().buffered_bytes
    );
    for (e, &bytes) in model.entries.iter().zip(&charged) {
        let bound = entry_bytes_bound(e.rows.len() as u64, model.num_reducers, e.token.len());
        assert!(
            bytes <= bound,
            "entry of {} rows charged {bytes} bytes, more than {bound}",
            e.rows.len()
        );
    }
    for r in 0..model.num_reducers {
        let q = &model.queue[r as usize];
        assert_eq!(window.pending_shuffle_indices(i64::from(r)).unwrap(), *q);
        assert_eq!(window.bucket_len(i64::from(r)).unwrap(), q.len() as u64);
        // A fetch position anywhere in the bucket: the rows after it, and how many.
        let positions = [
            q.first().map_or(-1, |&i| i - 1),
            q.get(q.len() / 3).copied().unwrap_or(-1),
            q.get(q.len() / 2).copied().unwrap_or(-1),
            q.last().copied().unwrap_or(-1),
        ];
        for after in positions {
            let expected: Vec<i64> = q.iter().copied().filter(|&i| i > after).collect();
            let len = window.bucket_len_after(i64::from(r), after).unwrap();
            assert_eq!(len, expected.len() as u64, "rows after {after}");
            let rows = window
                .peek_rows(i64::from(r), after, i64::MAX, i64::MAX, true)
                .unwrap();
            assert_eq!(values(&rows.batches), expected, "rows after {after}");
            assert_eq!(rows.shuffle_indices.as_ref(), Some(&expected));
            let last = expected
                .last()
                .copied()
                .unwrap_or(after.max(window.bucket(i64::from(r)).unwrap().committed_row_index));
            assert_eq!(rows.last_shuffle_row_index, last);
        }
    }
}

fn run(num_reducers: u32, start: i64, ops: Vec<Op>) {
    let initial = LocalMapperState {
        input_unread_row_index: start * 2,
        shuffle_unread_row_index: start,
        continuation_token: b"start".to_vec(),
    };
    let mut window = Window::new(WindowOptions {
        num_reducers,
        memory_limit_bytes: u64::MAX,
        max_payload_bytes: u64::MAX,
        initial_state: initial.clone(),
    })
    .unwrap();
    let mut model = Model {
        num_reducers,
        entries: Vec::new(),
        first_entry_index: 0,
        watermark: vec![-1; num_reducers as usize],
        queue: vec![Vec::new(); num_reducers as usize],
        last_returned: vec![-1; num_reducers as usize],
        spilled: vec![-1; num_reducers as usize],
        input_end: initial.input_unread_row_index,
        shuffle_end: initial.shuffle_unread_row_index,
        local: initial,
    };
    for op in ops {
        match op {
            Op::Push {
                reducers,
                input_advance,
                slice,
            } => {
                let reducers: Vec<u32> = reducers.into_iter().map(|r| r % num_reducers).collect();
                let input_end = model.input_end + input_advance;
                let token = input_end.to_le_bytes().to_vec();
                let begin = model.shuffle_end as usize;
                let rows = if slice && begin + reducers.len() <= PARENT_ROWS {
                    parent().slice(begin, reducers.len())
                } else {
                    batch(model.shuffle_end, reducers.len())
                };
                let range = window
                    .push(
                        rows,
                        &UInt32Array::from(reducers.clone()),
                        input_end,
                        token.clone(),
                    )
                    .unwrap();
                assert_eq!(
                    range,
                    (model.shuffle_end, model.shuffle_end + reducers.len() as i64)
                );
                model.push(&reducers, input_end, token);
            }
            Op::GetRows {
                reducer,
                committed_delta,
                max_rows,
                small_bytes,
            } => {
                let reducer = reducer % num_reducers;
                let committed = model.watermark[reducer as usize] + committed_delta;
                get_rows(
                    &mut window,
                    &mut model,
                    reducer,
                    committed,
                    max_rows,
                    small_bytes,
                );
            }
            Op::CommitReturned { reducer, max_rows } => {
                let reducer = reducer % num_reducers;
                let committed = model.last_returned[reducer as usize];
                get_rows(&mut window, &mut model, reducer, committed, max_rows, false);
            }
            Op::Spill {
                stragglers,
                chunk_bytes,
            } => {
                let stragglers: Vec<u32> = stragglers.iter().map(|r| r % num_reducers).collect();
                spill(&mut window, &mut model, &stragglers, chunk_bytes)
            }
        }
        check(&window, &model);
    }
    // Every reducer commits everything: the window empties.
    for r in 0..num_reducers {
        let end = model.shuffle_end.max(model.watermark[r as usize]);
        window.get_rows(i64::from(r), end, 10, 1 << 20).unwrap();
        model.pop(r, end).unwrap();
        check(&window, &model);
    }
    assert_eq!(window.snapshot().buffered_bytes, 0);
    assert_eq!(window.snapshot().num_entries, 0);
    assert_eq!(
        window.local_state().shuffle_unread_row_index,
        model.shuffle_end
    );
}

fn get_rows(
    window: &mut Window,
    model: &mut Model,
    reducer: u32,
    committed: i64,
    max_rows: i64,
    small_bytes: bool,
) {
    let max_bytes = if small_bytes { 40 } else { 1 << 20 };
    let got = window.get_rows(i64::from(reducer), committed, max_rows, max_bytes);
    match model.pop(reducer, committed).map(<[i64]>::to_vec) {
        Err("invalid") => assert!(matches!(got, Err(Error::CommittedIndexInvalid { .. }))),
        Err(_) => assert!(matches!(got, Err(Error::CommittedIndexBackwards { .. }))),
        Ok(pending) => {
            let rows = got.unwrap();
            let wanted = pending.len().min(max_rows as usize);
            let n = rows.row_count as usize;
            if small_bytes {
                assert!(n <= wanted && (n > 0 || wanted == 0), "{n} of {wanted}");
            } else {
                assert_eq!(n, wanted);
            }
            let expected = pending[..n].to_vec();
            assert_eq!(values(&rows.batches), expected);
            let last = expected.last().copied().unwrap_or(committed);
            let expected = &expected[..];
            assert_eq!(rows.last_shuffle_row_index, last);
            model.last_returned[reducer as usize] = last;
            if n > 0 {
                let decoded =
                    ipc::decode_concat([Buffer::from_vec(rows.to_ipc().unwrap().to_vec())])
                        .unwrap();
                assert_eq!(values(&[decoded]), expected);
            }
        }
    }
}

fn spill(window: &mut Window, model: &mut Model, stragglers: &[u32], chunk_bytes: u64) {
    let before = window.snapshot();
    let chunks = window
        .peek_spill(stragglers, 0, u64::MAX, chunk_bytes)
        .unwrap();
    assert_eq!(window.snapshot(), before, "peek_spill changes nothing");
    let expected = model.spill(stragglers);
    let mut got = vec![Vec::new(); model.num_reducers as usize];
    for c in &chunks {
        assert!(c.row_count == 1 || c.payload.len() as u64 <= chunk_bytes);
        let decoded = ipc::decode_concat([Buffer::from_vec(c.payload.to_vec())]).unwrap();
        let index = decoded
            .column_by_name(SHUFFLE_INDEX_COLUMN)
            .unwrap()
            .as_primitive::<Int64Type>()
            .values()
            .to_vec();
        assert_eq!(
            values(&[decoded]),
            index,
            "each row keeps its own shuffle index"
        );
        assert_eq!(
            (
                c.first_shuffle_row_index,
                c.last_shuffle_row_index,
                c.row_count
            ),
            (index[0], *index.last().unwrap(), index.len() as u64)
        );
        got[c.reducer_index as usize].extend(index);
    }
    assert_eq!(got, expected);
    for (r, rows) in expected.iter().enumerate() {
        if let Some(&last) = rows.last() {
            window.mark_spilled(r as i64, last).unwrap();
            model.mark_spilled(r, last);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn window_matches_the_model(
        num_reducers in 1u32..5,
        start in prop_oneof![Just(0i64), 0i64..20],
        ops in prop::collection::vec(op(), 1..60),
    ) {
        run(num_reducers, start, ops);
    }
}

#[test]
fn restarted_mapper_never_returns_rows_reducers_committed() {
    // Reducer 0 committed up to 7 before the mapper restarted from persisted index 2.
    run(
        2,
        2,
        vec![
            Op::GetRows {
                reducer: 0,
                committed_delta: 8,
                max_rows: 5,
                small_bytes: false,
            },
            Op::Push {
                reducers: vec![0, 1, 0, 0, 1, 0, 0, 0],
                input_advance: 3,
                slice: true,
            },
            Op::CommitReturned {
                reducer: 0,
                max_rows: 10,
            },
        ],
    );
}
