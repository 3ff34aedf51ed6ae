//! A reducer's bucket: which of the window's rows that reducer has not committed yet.
//!
//! The thesis keeps an explicit queue of shuffle indices per bucket. Here the queue is
//! implicit: rows of one window entry are stored grouped by reducer in shuffle order, so the
//! queue is "this reducer's rows of entry `first_entry_index` from position `position` on,
//! then its rows of every later entry". That costs no memory per row beyond the entry's
//! shuffle offsets, and popping is a binary search per entry.

/// State of one bucket (thesis 4.3.1, `BucketState`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bucket {
    /// Absolute index of the window entry holding the first uncommitted row; meaningful only
    /// when `len > 0`.
    pub first_entry_index: u64,
    /// Position of that row among the reducer's rows of that entry.
    pub position: u32,
    /// Rows in the bucket (buffered and not committed by the reducer).
    pub len: u64,
    /// Highest committed index the reducer has sent, -1 before its first call. Rows at or
    /// below it are never buffered again, even when a restarted mapper re-produces them.
    pub committed_row_index: i64,
    /// Highest shuffle index of the reducer's rows written to the store by a straggler
    /// spill, -1 if none: rows at or below it left the bucket and are never buffered again.
    pub spilled_row_index: i64,
}

impl Bucket {
    /// An empty bucket of a reducer that has committed nothing yet.
    pub fn new() -> Self {
        Self {
            committed_row_index: -1,
            spilled_row_index: -1,
            ..Self::default()
        }
    }

    /// True when the reducer has no uncommitted rows in the window.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}
