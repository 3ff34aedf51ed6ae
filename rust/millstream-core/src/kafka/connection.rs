//! One TCP connection to one broker: requests go out framed with a correlation id and their
//! responses come back in the order the requests went out (Kafka answers a connection's
//! requests in order), so a caller may send the next request before it reads the answer to
//! the last ([`Connection::send`], then [`Connection::receive`]).

use std::io::{Read, Write};
use std::marker::PhantomData;
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
        let sent = self.send(request)?;
        self.receive(sent, Vec::new())
    }

    /// Sends `request`; its response is read with [`receive`](Self::receive), after the
    /// responses to the requests sent before it.
    pub fn send<R: Request>(&mut self, request: &R) -> KafkaResult<Sent<R>> {
        self.correlation_id = self.correlation_id.wrapping_add(1);
        let correlation_id = self.correlation_id;
        let mut w = Writer::request(R::API_KEY, R::VERSION, correlation_id, &self.client_id);
        request.encode(&mut w);
        self.stream.write_all(&w.framed()).map_err(|e| self.io(e))?;
        Ok(Sent {
            correlation_id,
            request: PhantomData,
        })
    }

    /// Reads the response to `sent`, the oldest request not answered yet, into `buffer`
    /// (cleared first; its allocation is reused, so a caller that hands back the last
    /// response's bytes allocates and faults in no new memory).
    pub fn receive<R: Request>(
        &mut self,
        sent: Sent<R>,
        buffer: Vec<u8>,
    ) -> KafkaResult<R::Response> {
        let mut size = [0u8; 4];
        self.stream.read_exact(&mut size).map_err(|e| self.io(e))?;
        let size = i32::from_be_bytes(size);
        let malformed = |what| KafkaError::Malformed {
            broker: self.broker.clone(),
            api: R::NAME,
            source: super::wire::WireError { what, at: 0 },
        };
        let Some(size) = usize::try_from(size).ok().filter(|size| *size >= 4) else {
            return Err(malformed("response size"));
        };
        let mut body = buffer;
        body.clear();
        body.reserve(size);
        // Reads into the spare capacity as it is: no zeroing of a buffer about to be filled.
        let got = (&mut self.stream)
            .take(size as u64)
            .read_to_end(&mut body)
            .map_err(|e| self.io(e))?;
        if got != size {
            let cut = std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("the connection closed after {got} of the response's {size} bytes"),
            );
            return Err(self.io(cut));
        }
        let got = Reader::new(&body)
            .i32("correlation id")
            .expect("four bytes");
        if got != sent.correlation_id {
            return Err(KafkaError::Correlation {
                broker: self.broker.clone(),
                sent: sent.correlation_id,
                got,
            });
        }
        R::decode(body, 4).map_err(|source| KafkaError::Malformed {
            broker: self.broker.clone(),
            api: R::NAME,
            source,
        })
    }

    fn io(&self, source: std::io::Error) -> KafkaError {
        KafkaError::Io {
            broker: self.broker.clone(),
            source: Arc::new(source),
        }
    }
}

/// A request sent whose response is not read yet: [`Connection::receive`] takes it.
#[derive(Debug)]
#[must_use = "the response must be received before the next one can be"]
pub struct Sent<R> {
    correlation_id: i32,
    request: PhantomData<fn() -> R>,
}
