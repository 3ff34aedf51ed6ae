//! One TCP connection to one broker: requests go out framed with a correlation id, and the
//! response to each is read whole before the next is sent (the reader never pipelines).

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use super::error::{KafkaError, KafkaResult};
use super::wire::{Reader, WireResult, Writer};

/// A request of the Kafka protocol at one version, and how its response decodes.
pub trait Request {
    /// The API key.
    const API_KEY: i16;
    /// The version spoken.
    const VERSION: i16;
    /// The request's name, for errors.
    const NAME: &'static str;
    /// The decoded response.
    type Response;

    /// Appends the request body (after the header).
    fn encode(&self, w: &mut Writer);

    /// Decodes a response body (after the correlation id).
    fn decode(body: Vec<u8>, at: usize) -> WireResult<Self::Response>;
}

/// A connection to one broker.
#[derive(Debug)]
pub struct Connection {
    broker: String,
    stream: TcpStream,
    correlation_id: i32,
    client_id: String,
}

impl Connection {
    /// Connects to `broker` (`host:port`); a response must come within `timeout`.
    pub fn connect(broker: &str, client_id: &str, timeout: Duration) -> KafkaResult<Self> {
        let io = |source| KafkaError::Io {
            broker: broker.to_string(),
            source: Arc::new(source),
        };
        let mut last = None;
        for address in broker.to_socket_addrs().map_err(io)? {
            match TcpStream::connect_timeout(&address, timeout) {
                Ok(stream) => {
                    stream.set_nodelay(true).map_err(io)?;
                    stream.set_read_timeout(Some(timeout)).map_err(io)?;
                    stream.set_write_timeout(Some(timeout)).map_err(io)?;
                    return Ok(Self {
                        broker: broker.to_string(),
                        stream,
                        correlation_id: 0,
                        client_id: client_id.to_string(),
                    });
                }
                Err(e) => last = Some(e),
            }
        }
        Err(io(last.unwrap_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::NotFound, "no address")
        })))
    }

    /// The broker's address.
    pub fn broker(&self) -> &str {
        &self.broker
    }

    /// Sends `request` and reads its response.
    pub fn call<R: Request>(&mut self, request: &R) -> KafkaResult<R::Response> {
        self.correlation_id = self.correlation_id.wrapping_add(1);
        let sent = self.correlation_id;
        let mut w = Writer::request(R::API_KEY, R::VERSION, sent, &self.client_id);
        request.encode(&mut w);
        let io = |source| KafkaError::Io {
            broker: self.broker.clone(),
            source: Arc::new(source),
        };
        self.stream.write_all(&w.framed()).map_err(io)?;
        let mut size = [0u8; 4];
        self.stream.read_exact(&mut size).map_err(io)?;
        let size = i32::from_be_bytes(size);
        if size < 4 {
            return Err(KafkaError::Malformed {
                broker: self.broker.clone(),
                api: R::NAME,
                source: super::wire::WireError {
                    what: "response size",
                    at: 0,
                },
            });
        }
        let mut body = vec![0u8; size as usize];
        self.stream.read_exact(&mut body).map_err(io)?;
        let got = Reader::new(&body)
            .i32("correlation id")
            .expect("four bytes");
        if got != sent {
            return Err(KafkaError::Correlation {
                broker: self.broker.clone(),
                sent,
                got,
            });
        }
        R::decode(body, 4).map_err(|source| KafkaError::Malformed {
            broker: self.broker.clone(),
            api: R::NAME,
            source,
        })
    }
}
