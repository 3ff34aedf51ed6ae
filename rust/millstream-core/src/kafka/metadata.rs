//! Metadata (v1): the brokers' addresses and which broker leads each partition of a topic.

use super::connection::Request;
use super::wire::{Reader, WireResult, Writer};

/// The Metadata request for some topics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataRequest {
    /// The topics asked about.
    pub topics: Vec<String>,
}

/// A broker of the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broker {
    /// Its node id.
    pub node_id: i32,
    /// Host name.
    pub host: String,
    /// Port.
    pub port: i32,
}

impl Broker {
    /// `host:port`.
    pub fn address(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

/// One partition of a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionMetadata {
    /// Kafka's error code (0: none).
    pub error_code: i16,
    /// The partition.
    pub partition: i32,
    /// The leader's node id (-1: none).
    pub leader: i32,
}

/// One topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicMetadata {
    /// Kafka's error code (0: none).
    pub error_code: i16,
    /// The topic.
    pub name: String,
    /// Its partitions.
    pub partitions: Vec<PartitionMetadata>,
}

/// The Metadata response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataResponse {
    /// The cluster's brokers.
    pub brokers: Vec<Broker>,
    /// The topics asked about.
    pub topics: Vec<TopicMetadata>,
}

impl MetadataResponse {
    /// The address of the broker leading `partition` of `topic`, if one does.
    pub fn leader(&self, topic: &str, partition: i32) -> Option<String> {
        let topic = self.topics.iter().find(|t| t.name == topic)?;
        let p = topic.partitions.iter().find(|p| p.partition == partition)?;
        let broker = self.brokers.iter().find(|b| b.node_id == p.leader)?;
        Some(broker.address())
    }
}

fn int32_array(r: &mut Reader<'_>, what: &'static str) -> WireResult<()> {
    let n = r.array_len(4, what)?;
    r.take(4 * n, what).map(|_| ())
}

impl Request for MetadataRequest {
    const API_KEY: i16 = 3;
    const VERSION: i16 = 1;
    const NAME: &'static str = "Metadata";
    type Response = MetadataResponse;

    fn encode(&self, w: &mut Writer) {
        w.array_len(self.topics.len());
        for topic in &self.topics {
            w.string(topic);
        }
    }

    fn decode(body: Vec<u8>, at: usize) -> WireResult<MetadataResponse> {
        let mut r = Reader::new(&body[at..]);
        let n = r.array_len(12, "brokers")?;
        let mut brokers = Vec::with_capacity(n);
        for _ in 0..n {
            brokers.push(Broker {
                node_id: r.i32("node id")?,
                host: r.string("host")?,
                port: r.i32("port")?,
            });
            r.nullable_string("rack")?;
        }
        r.i32("controller id")?;
        let n = r.array_len(5, "topics")?;
        let mut topics = Vec::with_capacity(n);
        for _ in 0..n {
            let error_code = r.i16("topic error code")?;
            let name = r.string("topic name")?;
            r.bool("is internal")?;
            let m = r.array_len(18, "partitions")?;
            let mut partitions = Vec::with_capacity(m);
            for _ in 0..m {
                partitions.push(PartitionMetadata {
                    error_code: r.i16("partition error code")?,
                    partition: r.i32("partition")?,
                    leader: r.i32("leader")?,
                });
                int32_array(&mut r, "replicas")?;
                int32_array(&mut r, "isr")?;
            }
            topics.push(TopicMetadata {
                error_code,
                name,
                partitions,
            });
        }
        Ok(MetadataResponse { brokers, topics })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response_bytes() -> Vec<u8> {
        let mut w = Writer::default();
        w.i32(1).array_len(2);
        w.i32(1).string("10.0.0.1").i32(9092).nullable_string(None);
        w.i32(2)
            .string("10.0.0.2")
            .i32(9093)
            .nullable_string(Some("r1"));
        w.i32(1).array_len(1);
        w.i16(0).string("events").i8(0).array_len(2);
        for (partition, leader) in [(0, 2), (1, -1)] {
            w.i16(0).i32(partition).i32(leader);
            w.array_len(1).i32(leader).array_len(1).i32(leader);
        }
        w.into_bytes()
    }

    #[test]
    fn response_decodes_and_names_leaders() {
        let response = MetadataRequest::decode(response_bytes(), 4).unwrap();
        assert_eq!(response.brokers.len(), 2);
        assert_eq!(response.topics[0].partitions.len(), 2);
        assert_eq!(
            response.leader("events", 0).as_deref(),
            Some("10.0.0.2:9093")
        );
        assert_eq!(response.leader("events", 1), None);
        assert_eq!(response.leader("other", 0), None);
    }

    #[test]
    fn request_encodes() {
        let mut w = Writer::default();
        MetadataRequest {
            topics: vec!["ab".into()],
        }
        .encode(&mut w);
        assert_eq!(w.into_bytes(), [0, 0, 0, 1, 0, 2, b'a', b'b']);
    }

    #[test]
    fn a_truncated_response_is_an_error() {
        let mut bytes = response_bytes();
        bytes.truncate(bytes.len() - 3);
        assert!(MetadataRequest::decode(bytes, 4).is_err());
    }
}
