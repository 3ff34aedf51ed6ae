//! Finding and connecting to the broker that leads a partition: Metadata asked of the
//! bootstrap brokers in turn, then ApiVersions asked of the leader, which must speak the
//! versions the reader sends.

use std::time::Duration;

use super::api_versions::ApiVersionsRequest;
use super::connection::{Connection, Request};
use super::error::{code, KafkaError, KafkaResult};
use super::fetch::FetchRequest;
use super::list_offsets::ListOffsetsRequest;
use super::metadata::MetadataRequest;

/// How to reach a cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// Bootstrap brokers, `host:port` each.
    pub bootstrap: Vec<String>,
    /// The client id sent with each request.
    pub client_id: String,
    /// How long connecting and each response may take.
    pub timeout: Duration,
}

impl ClusterConfig {
    /// A config from Kafka's `bootstrap.servers` form (`host:port,...`, an optional
    /// `PLAINTEXT://` in front of each).
    pub fn from_servers(servers: &str, client_id: &str, timeout: Duration) -> Self {
        let bootstrap = servers
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| s.strip_prefix("PLAINTEXT://").unwrap_or(s).to_string())
            .collect();
        Self {
            bootstrap,
            client_id: client_id.to_string(),
            timeout,
        }
    }

    fn connect(&self, broker: &str) -> KafkaResult<Connection> {
        Connection::connect(broker, &self.client_id, self.timeout)
    }

    /// A connection to the leader of `partition` of `topic`, checked to speak Fetch and
    /// ListOffsets at the reader's versions.
    pub fn connect_leader(&self, topic: &str, partition: i32) -> KafkaResult<Connection> {
        let mut last = None;
        for broker in &self.bootstrap {
            match self.leader(broker, topic, partition) {
                Ok(leader) => return self.checked(&leader),
                Err(e) if e.retriable() => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| KafkaError::Io {
            broker: String::new(),
            source: std::sync::Arc::new(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "no bootstrap server",
            )),
        }))
    }

    fn leader(&self, broker: &str, topic: &str, partition: i32) -> KafkaResult<String> {
        let metadata = self.connect(broker)?.call(&MetadataRequest {
            topics: vec![topic.to_string()],
        })?;
        let no_leader = |code| KafkaError::Broker {
            api: MetadataRequest::NAME,
            topic: topic.to_string(),
            partition,
            code,
        };
        let found = metadata.topics.iter().find(|t| t.name == topic);
        let error = found.map_or(code::UNKNOWN_TOPIC_OR_PARTITION, |t| {
            let p = t.partitions.iter().find(|p| p.partition == partition);
            match (t.error_code, p) {
                (0, Some(p)) => p.error_code,
                (0, None) => code::UNKNOWN_TOPIC_OR_PARTITION,
                (e, _) => e,
            }
        });
        if error != 0 && error != code::REPLICA_NOT_AVAILABLE {
            return Err(no_leader(error));
        }
        metadata
            .leader(topic, partition)
            .ok_or_else(|| no_leader(code::LEADER_NOT_AVAILABLE))
    }

    fn checked(&self, broker: &str) -> KafkaResult<Connection> {
        let mut connection = self.connect(broker)?;
        let versions = connection.call(&ApiVersionsRequest)?;
        for (key, version, api) in [
            (
                FetchRequest::API_KEY,
                FetchRequest::VERSION,
                FetchRequest::NAME,
            ),
            (
                ListOffsetsRequest::API_KEY,
                ListOffsetsRequest::VERSION,
                ListOffsetsRequest::NAME,
            ),
        ] {
            let range = versions.range(key);
            if !range.is_some_and(|r| r.min <= version && version <= r.max) {
                let (min, max) = range.map_or((-1, -1), |r| (r.min, r.max));
                return Err(KafkaError::UnsupportedVersion {
                    broker: broker.to_string(),
                    api,
                    version,
                    min,
                    max,
                });
            }
        }
        Ok(connection)
    }
}
