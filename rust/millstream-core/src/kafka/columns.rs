//! The Arrow columns Kafka records become, in `KafkaTopic`'s schema: `key` (binary),
//! `value` (binary), `timestamp` (ms, UTC), `headers` (list of key/value structs; null when
//! a record has none), `partition` (int32) and `offset` (int64), every field nullable.

use std::sync::Arc;

use arrow_array::builder::{
    ArrayBuilder, BinaryBuilder, Int32Builder, Int64Builder, ListBuilder, StringBuilder,
    StructBuilder, TimestampMillisecondBuilder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Fields, Schema, SchemaRef, TimeUnit};

/// The fields of a header struct.
fn header_fields() -> Fields {
    Fields::from(vec![
        Field::new("key", DataType::Utf8, true),
        Field::new("value", DataType::Binary, true),
    ])
}

/// The schema of the batches the reader hands over (every column).
pub fn record_schema() -> SchemaRef {
    let headers = DataType::List(Arc::new(Field::new(
        "item",
        DataType::Struct(header_fields()),
        true,
    )));
    Arc::new(Schema::new(vec![
        Field::new("key", DataType::Binary, true),
        Field::new("value", DataType::Binary, true),
        Field::new(
            "timestamp",
            DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
            true,
        ),
        Field::new("headers", headers, true),
        Field::new("partition", DataType::Int32, true),
        Field::new("offset", DataType::Int64, true),
    ]))
}

/// One record's header.
pub type Header<'a> = (&'a str, Option<&'a [u8]>);

/// Builds the columns of records of one partition.
#[derive(Debug)]
pub struct RecordColumns {
    partition: i32,
    keys: BinaryBuilder,
    values: BinaryBuilder,
    timestamps: TimestampMillisecondBuilder,
    headers: ListBuilder<StructBuilder>,
    partitions: Int32Builder,
    offsets: Int64Builder,
}

impl RecordColumns {
    /// Empty columns for records of `partition`.
    pub fn new(partition: i32) -> Self {
        Self::with_capacity(partition, 0, 0)
    }

    /// Empty columns with room for `records` records of `partition` whose values take
    /// `value_bytes` in all, so that filling them grows no buffer.
    pub fn with_capacity(partition: i32, records: usize, value_bytes: usize) -> Self {
        let headers = StructBuilder::new(
            header_fields(),
            vec![
                Box::new(StringBuilder::new()),
                Box::new(BinaryBuilder::new()),
            ],
        );
        Self {
            partition,
            keys: BinaryBuilder::with_capacity(records, 0),
            values: BinaryBuilder::with_capacity(records, value_bytes),
            timestamps: TimestampMillisecondBuilder::with_capacity(records).with_timezone("UTC"),
            headers: ListBuilder::with_capacity(headers, records),
            partitions: Int32Builder::with_capacity(records),
            offsets: Int64Builder::with_capacity(records),
        }
    }

    /// Appends one record; `headers` is empty when it has none.
    pub fn push(
        &mut self,
        offset: i64,
        timestamp: i64,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[Header<'_>],
    ) {
        self.keys.append_option(key);
        self.values.append_option(value);
        self.timestamps.append_value(timestamp);
        if headers.is_empty() {
            self.headers.append_null();
        } else {
            let pairs = self.headers.values();
            for (k, v) in headers {
                pairs
                    .field_builder::<StringBuilder>(0)
                    .expect("a string key")
                    .append_value(k);
                pairs
                    .field_builder::<BinaryBuilder>(1)
                    .expect("a binary value")
                    .append_option(*v);
                pairs.append(true);
            }
            self.headers.append(true);
        }
        self.partitions.append_value(self.partition);
        self.offsets.append_value(offset);
    }

    /// Records appended since the last [`finish`](Self::finish).
    pub fn len(&self) -> usize {
        self.offsets.len()
    }

    /// Whether no record was appended.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The records as a batch of [`record_schema`]; the builders start again empty.
    pub fn finish(&mut self) -> RecordBatch {
        let columns: Vec<ArrayRef> = vec![
            Arc::new(self.keys.finish()),
            Arc::new(self.values.finish()),
            Arc::new(self.timestamps.finish()),
            Arc::new(self.headers.finish()),
            Arc::new(self.partitions.finish()),
            Arc::new(self.offsets.finish()),
        ];
        RecordBatch::try_new(record_schema(), columns).expect("columns of the record schema")
    }
}
