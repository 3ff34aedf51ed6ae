//! Kafka's wire framing and primitive types: big-endian integers, strings and arrays with
//! length prefixes, zigzag varints (record batches), and the request header every request
//! starts with. [`Writer`] builds a request; [`Reader`] walks a response and fails with
//! [`WireError`] rather than reading past its end.

use std::fmt;

/// A response or record batch that ends early or holds an impossible length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireError {
    /// What was being read.
    pub what: &'static str,
    /// Where in the buffer.
    pub at: usize,
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} at byte {} is truncated or malformed",
            self.what, self.at
        )
    }
}

impl std::error::Error for WireError {}

/// Result of reading wire data.
pub type WireResult<T> = Result<T, WireError>;

/// Appends Kafka's primitive types to a buffer.
#[derive(Debug, Default)]
pub struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    /// A request body that starts with the request header (v1: api key, version,
    /// correlation id, client id).
    pub fn request(api_key: i16, version: i16, correlation_id: i32, client_id: &str) -> Self {
        let mut w = Self::default();
        w.i16(api_key).i16(version).i32(correlation_id);
        w.string(client_id);
        w
    }

    /// Appends an int8.
    pub fn i8(&mut self, v: i8) -> &mut Self {
        self.buf.extend(v.to_be_bytes());
        self
    }

    /// Appends an int16.
    pub fn i16(&mut self, v: i16) -> &mut Self {
        self.buf.extend(v.to_be_bytes());
        self
    }

    /// Appends an int32.
    pub fn i32(&mut self, v: i32) -> &mut Self {
        self.buf.extend(v.to_be_bytes());
        self
    }

    /// Appends an int64.
    pub fn i64(&mut self, v: i64) -> &mut Self {
        self.buf.extend(v.to_be_bytes());
        self
    }

    /// Appends a string (int16 length).
    pub fn string(&mut self, s: &str) -> &mut Self {
        self.i16(s.len() as i16);
        self.buf.extend(s.as_bytes());
        self
    }

    /// Appends a nullable string (length -1: null).
    pub fn nullable_string(&mut self, s: Option<&str>) -> &mut Self {
        match s {
            Some(s) => self.string(s),
            None => self.i16(-1),
        }
    }

    /// Appends an array's length (int32; -1: null).
    pub fn array_len(&mut self, len: usize) -> &mut Self {
        self.i32(len as i32)
    }

    /// Appends raw bytes.
    pub fn raw(&mut self, bytes: &[u8]) -> &mut Self {
        self.buf.extend(bytes);
        self
    }

    /// Appends a zigzag varint (record batches).
    pub fn varint(&mut self, v: i64) -> &mut Self {
        let mut raw = ((v << 1) ^ (v >> 63)) as u64;
        loop {
            let byte = (raw & 0x7f) as u8;
            raw >>= 7;
            if raw == 0 {
                self.buf.push(byte);
                return self;
            }
            self.buf.push(byte | 0x80);
        }
    }

    /// Appends varint-length-prefixed bytes (`None`: length -1).
    pub fn varbytes(&mut self, bytes: Option<&[u8]>) -> &mut Self {
        match bytes {
            Some(b) => {
                self.varint(b.len() as i64);
                self.raw(b)
            }
            None => self.varint(-1),
        }
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether nothing was written.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The bytes written.
    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }

    /// The bytes with their int32 size in front: a request as it goes on the wire.
    pub fn framed(self) -> Vec<u8> {
        let mut out = Vec::with_capacity(4 + self.buf.len());
        out.extend((self.buf.len() as i32).to_be_bytes());
        out.extend(self.buf);
        out
    }
}

/// Reads Kafka's primitive types from a buffer, front to back.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    /// A reader at the start of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf, at: 0 }
    }

    /// Bytes read so far.
    pub fn position(&self) -> usize {
        self.at
    }

    /// Bytes left.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.at
    }

    /// The next `n` bytes.
    pub fn take(&mut self, n: usize, what: &'static str) -> WireResult<&'a [u8]> {
        if n > self.remaining() {
            return Err(WireError { what, at: self.at });
        }
        let out = &self.buf[self.at..self.at + n];
        self.at += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> WireResult<[u8; N]> {
        let bytes = self.take(N, what)?;
        Ok(bytes.try_into().expect("N bytes"))
    }

    /// An int8.
    pub fn i8(&mut self, what: &'static str) -> WireResult<i8> {
        Ok(i8::from_be_bytes(self.array(what)?))
    }

    /// An int16.
    pub fn i16(&mut self, what: &'static str) -> WireResult<i16> {
        Ok(i16::from_be_bytes(self.array(what)?))
    }

    /// An int32.
    pub fn i32(&mut self, what: &'static str) -> WireResult<i32> {
        Ok(i32::from_be_bytes(self.array(what)?))
    }

    /// A uint32.
    pub fn u32(&mut self, what: &'static str) -> WireResult<u32> {
        Ok(u32::from_be_bytes(self.array(what)?))
    }

    /// An int64.
    pub fn i64(&mut self, what: &'static str) -> WireResult<i64> {
        Ok(i64::from_be_bytes(self.array(what)?))
    }

    /// A boolean (one byte).
    pub fn bool(&mut self, what: &'static str) -> WireResult<bool> {
        Ok(self.i8(what)? != 0)
    }

    /// A nullable string (int16 length, -1: null).
    pub fn nullable_string(&mut self, what: &'static str) -> WireResult<Option<String>> {
        let at = self.at;
        let len = self.i16(what)?;
        if len < 0 {
            return Ok(None);
        }
        let bytes = self.take(len as usize, what)?;
        String::from_utf8(bytes.to_vec())
            .map(Some)
            .map_err(|_| WireError { what, at })
    }

    /// A string (null reads as empty).
    pub fn string(&mut self, what: &'static str) -> WireResult<String> {
        Ok(self.nullable_string(what)?.unwrap_or_default())
    }

    /// An array's length (int32; null reads as 0), checked against the bytes left given
    /// that each element takes at least `min_element_bytes`.
    pub fn array_len(&mut self, min_element_bytes: usize, what: &'static str) -> WireResult<usize> {
        let at = self.at;
        let len = self.i32(what)?.max(0) as usize;
        if len.saturating_mul(min_element_bytes.max(1)) > self.remaining() {
            return Err(WireError { what, at });
        }
        Ok(len)
    }

    /// Bytes with an int32 length (null reads as empty).
    pub fn bytes(&mut self, what: &'static str) -> WireResult<&'a [u8]> {
        let len = self.i32(what)?.max(0) as usize;
        self.take(len, what)
    }

    /// A zigzag varint.
    pub fn varint(&mut self, what: &'static str) -> WireResult<i64> {
        let (mut raw, mut shift) = (0u64, 0u32);
        loop {
            let at = self.at;
            let byte = *self.buf.get(self.at).ok_or(WireError { what, at })?;
            self.at += 1;
            if shift > 63 {
                return Err(WireError { what, at });
            }
            raw |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(((raw >> 1) as i64) ^ -((raw & 1) as i64));
            }
            shift += 7;
        }
    }

    /// Varint-length-prefixed bytes (length -1: `None`).
    pub fn varbytes(&mut self, what: &'static str) -> WireResult<Option<&'a [u8]>> {
        let len = self.varint(what)?;
        if len < 0 {
            return Ok(None);
        }
        let len = usize::try_from(len).map_err(|_| WireError { what, at: self.at })?;
        self.take(len, what).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn primitives_round_trip() {
        let mut w = Writer::default();
        w.i8(-3).i16(-300).i32(70_000).i64(-5_000_000_000);
        w.string("topic").nullable_string(None).array_len(2);
        for v in [0, -1, 1, 63, -64, 64, 300, i64::MAX, i64::MIN] {
            w.varint(v);
        }
        w.varbytes(Some(b"abc")).varbytes(None);
        let bytes = w.into_bytes();
        let mut r = Reader::new(&bytes);
        assert_eq!(r.i8("a").unwrap(), -3);
        assert_eq!(r.i16("a").unwrap(), -300);
        assert_eq!(r.i32("a").unwrap(), 70_000);
        assert_eq!(r.i64("a").unwrap(), -5_000_000_000);
        assert_eq!(r.string("a").unwrap(), "topic");
        assert_eq!(r.nullable_string("a").unwrap(), None);
        assert_eq!(r.i32("a").unwrap(), 2);
        for v in [0, -1, 1, 63, -64, 64, 300, i64::MAX, i64::MIN] {
            assert_eq!(r.varint("a").unwrap(), v);
        }
        assert_eq!(r.varbytes("a").unwrap(), Some(&b"abc"[..]));
        assert_eq!(r.varbytes("a").unwrap(), None);
        assert_eq!(r.remaining(), 0);
    }

    #[test]
    fn golden_varints() {
        // Kafka's zigzag: 0 -> 00, -1 -> 01, 1 -> 02, 150 -> ac 02.
        let mut w = Writer::default();
        w.varint(0).varint(-1).varint(1).varint(150);
        assert_eq!(w.into_bytes(), [0x00, 0x01, 0x02, 0xac, 0x02]);
    }

    #[test]
    fn reading_past_the_end_is_an_error() {
        let mut r = Reader::new(&[0, 5, b'a']);
        let err = r.string("topic name").unwrap_err();
        assert_eq!(
            err,
            WireError {
                what: "topic name",
                at: 2
            }
        );
        assert!(Reader::new(&[0x80, 0x80]).varint("v").is_err());
        assert!(Reader::new(&[0, 0, 0, 9]).array_len(4, "n").is_err());
    }

    #[test]
    fn framed_request_header() {
        let bytes = Writer::request(18, 0, 7, "ms").framed();
        assert_eq!(
            bytes,
            [0, 0, 0, 12, 0, 18, 0, 0, 0, 0, 0, 7, 0, 2, b'm', b's']
        );
    }
}
