//! The one error type of the core. Every message says what was wrong and what to do; the
//! Python bindings map each variant onto an exception of `millstream.exceptions`.

use arrow_schema::ArrowError;

/// Result alias of the core.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the core.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A reducer index outside `0..num_reducers`.
    #[error(
        "reducer index {reducer_index} is out of range: this window has {num_reducers} \
         reducers, so indices must be in [0, {num_reducers})"
    )]
    ReducerOutOfRange {
        /// The offending index.
        reducer_index: i64,
        /// Reducers of the window.
        num_reducers: u32,
    },

    /// The reducer index array does not have one entry per row.
    #[error(
        "the mapped batch has {batch_rows} rows but {reducer_indices} reducer indices were \
         given; pass exactly one reducer index per row"
    )]
    LengthMismatch {
        /// Rows of the batch.
        batch_rows: usize,
        /// Length of the reducer index array.
        reducer_indices: usize,
    },

    /// The reducer index array is not usable (nulls, not an integer type).
    #[error("invalid reducer indices: {0}")]
    InvalidReducerIndices(String),

    /// A reducer sent a committed index lower than one it sent before.
    #[error(
        "reducer {reducer_index} sent committed_row_index {committed_row_index}, lower than \
         {previous} which it sent before; committed indices never go backwards, so another \
         instance of this reducer with stale state is probably running (split brain)"
    )]
    CommittedIndexBackwards {
        /// The reducer.
        reducer_index: u32,
        /// The index it sent now.
        committed_row_index: i64,
        /// The highest index it sent before.
        previous: i64,
    },

    /// A committed index that no shuffle numbering can produce.
    #[error(
        "reducer {reducer_index} sent committed_row_index {committed_row_index}, which is \
         beyond what is possible: it must be -1 (nothing committed yet) or a shuffle index >= 0"
    )]
    CommittedIndexInvalid {
        /// The reducer.
        reducer_index: u32,
        /// The index it sent.
        committed_row_index: i64,
    },

    /// A batch whose schema differs from the window's.
    #[error(
        "the mapped batch's schema differs from this window's: {difference}; every batch \
         that `map` returns within one mapper must have the same schema (cast the columns, \
         or restart the mapper to change the schema)"
    )]
    SchemaMismatch {
        /// The first difference found.
        difference: String,
    },

    /// One batch needs more memory than the window may hold at all.
    #[error(
        "a mapped batch needs {entry_bytes} bytes in the window, more than the whole memory \
         limit of {memory_limit_bytes} bytes; read smaller input batches or raise the \
         mapper's memory limit"
    )]
    BatchOverMemoryLimit {
        /// Bytes the entry would take.
        entry_bytes: u64,
        /// The window's limit.
        memory_limit_bytes: u64,
    },

    /// A mapped row too large for any GetRows response.
    #[error(
        "mapped row {shuffle_row_index} (for reducer {reducer_index}) takes {row_bytes} bytes \
         in a GetRows response, more than the largest response of {max_payload_bytes} bytes \
         the transport can carry; no reducer could ever receive it. Make the rows `map` \
         returns smaller, or raise the gRPC message limit (tuning.grpc_max_message_bytes)"
    )]
    RowOverPayloadLimit {
        /// Shuffle index of the row.
        shuffle_row_index: i64,
        /// Its reducer.
        reducer_index: u32,
        /// Bytes of a response holding only this row.
        row_bytes: u64,
        /// The window's limit.
        max_payload_bytes: u64,
    },

    /// The input end of a pushed batch lies before the window's input end.
    #[error(
        "input_end_row_index {input_end_row_index} is before the window's input end \
         {window_input_end}; the input numbering only moves forward"
    )]
    InputIndexBackwards {
        /// The pushed input end.
        input_end_row_index: i64,
        /// The window's input end before the push.
        window_input_end: i64,
    },

    /// The window was closed; no more pushes.
    #[error("the window is closed; create a new window to push more batches")]
    Closed,

    /// A panic in another thread left the window in an unknown state.
    #[error("the window is unusable after a panic in another thread; restart the mapper")]
    Poisoned,

    /// A key column named for partitioning does not exist.
    #[error("key column {name:?} is not in the batch; its columns are {available:?}")]
    KeyColumnNotFound {
        /// The requested name.
        name: String,
        /// The batch's column names.
        available: Vec<String>,
    },

    /// A key column of a type the partition hash does not define.
    #[error(
        "key column {name:?} has type {data_type}, which hash partitioning does not support; \
         supported: integers, utf8/large_utf8/string_view, binary/large_binary and \
         dictionaries of those (cast other types, e.g. dates to int64)"
    )]
    UnsupportedKeyType {
        /// The column name.
        name: String,
        /// Its type, displayed.
        data_type: String,
    },

    /// A bad argument not covered above.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// GetRows payloads that do not decode, or whose rows do not share one schema.
    #[error("cannot decode the Arrow IPC payloads of GetRows: {0}")]
    Decode(String),

    /// A FoundationDB operation failed with this error code (the caller translates it as
    /// the binding's own errors are translated).
    #[error("FoundationDB error {code}")]
    Fdb {
        /// The `fdb_error_t`.
        code: i32,
    },

    /// Reading a Kafka partition failed.
    #[error(transparent)]
    Kafka(#[from] crate::kafka::KafkaError),

    /// An Arrow error (kernels, encoding).
    #[error("arrow: {0}")]
    Arrow(#[from] ArrowError),
}
