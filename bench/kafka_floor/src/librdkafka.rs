//! librdkafka (the `rdkafka` crate, its sources built and linked statically) reading into
//! Arrow columns, with the settings of millstream's `KafkaTopic` reader: one `poll` per
//! record, or librdkafka's batch consume on the consumer's queue. Both stop at the end
//! offset or at the partition's end, whichever comes first (the last offsets of a
//! transactional partition are markers, never delivered).

use std::time::Duration;

use arrow_array::ArrayRef;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use rdkafka_sys as sys;

use crate::{Columns, Target, BATCH_ROWS};

fn consumer(target: &Target) -> BaseConsumer {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &target.bootstrap)
        .set("group.id", "kafka-floor")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "true")
        .set("auto.offset.reset", "error")
        .set("isolation.level", "read_committed")
        .set("max.partition.fetch.bytes", "8388608")
        .set("fetch.max.bytes", "67108864")
        .set("queued.min.messages", "200000")
        .create()
        .expect("a consumer");
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(
            &target.topic,
            target.partition,
            Offset::Offset(target.start),
        )
        .expect("an assignment");
    consumer.assign(&assignment).expect("assign the partition");
    consumer
}

/// One `poll` per record.
pub fn read_polling(target: &Target, sink: &mut dyn FnMut(Vec<ArrayRef>)) {
    let consumer = consumer(target);
    let mut columns = Columns::new();
    let mut next = target.start;
    while next < target.end {
        match consumer.poll(Duration::from_millis(100)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(_))) => break,
            Some(Err(e)) => panic!("the consumer failed: {e}"),
            Some(Ok(m)) => {
                let timestamp = m.timestamp().to_millis().unwrap_or(-1);
                columns.push(m.key(), m.payload(), timestamp, m.offset());
                next = m.offset() + 1;
                if columns.len() == BATCH_ROWS {
                    sink(columns.finish());
                }
            }
        }
    }
    if columns.len() > 0 {
        sink(columns.finish());
    }
}

/// `rd_kafka_consume_batch_queue` on the consumer's queue, up to a batch at a time.
pub fn read_batches(target: &Target, sink: &mut dyn FnMut(Vec<ArrayRef>)) {
    let consumer = consumer(target);
    // SAFETY: the queue and the messages are used while `consumer` lives, and each is
    // destroyed once, as librdkafka's API asks.
    unsafe {
        let queue = sys::rd_kafka_queue_get_consumer(consumer.client().native_ptr());
        let mut messages = vec![std::ptr::null_mut(); BATCH_ROWS];
        let mut columns = Columns::new();
        let mut next = target.start;
        while next < target.end {
            let n =
                sys::rd_kafka_consume_batch_queue(queue, 100, messages.as_mut_ptr(), BATCH_ROWS);
            for &message in &messages[..n.max(0) as usize] {
                let m = &*message;
                if m.err == sys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__PARTITION_EOF {
                    next = target.end;
                } else if m.err == sys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
                    let slice = |p: *mut std::ffi::c_void, len: usize| {
                        (!p.is_null()).then(|| std::slice::from_raw_parts(p as *const u8, len))
                    };
                    let mut kind = sys::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
                    let timestamp = sys::rd_kafka_message_timestamp(message, &mut kind);
                    columns.push(
                        slice(m.key, m.key_len),
                        slice(m.payload, m.len),
                        timestamp,
                        m.offset,
                    );
                    next = m.offset + 1;
                }
                sys::rd_kafka_message_destroy(message);
            }
            if columns.len() > 0 {
                sink(columns.finish());
            }
        }
        sys::rd_kafka_queue_destroy(queue);
    }
}
