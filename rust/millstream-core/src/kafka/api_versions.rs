//! ApiVersions (v0): which versions of each request a broker speaks, asked once per
//! connection so that a broker too old for the reader is refused with a clear error.

use super::connection::Request;
use super::wire::{Reader, WireResult, Writer};

/// The ApiVersions request (no body at v0).
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiVersionsRequest;

/// The versions a broker supports of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiVersionRange {
    /// The API key.
    pub api_key: i16,
    /// Lowest version.
    pub min: i16,
    /// Highest version.
    pub max: i16,
}

/// The ApiVersions response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiVersionsResponse {
    /// Kafka's error code (0: none).
    pub error_code: i16,
    /// One range per request the broker speaks.
    pub apis: Vec<ApiVersionRange>,
}

impl ApiVersionsResponse {
    /// The range of `api_key`, if the broker speaks it.
    pub fn range(&self, api_key: i16) -> Option<ApiVersionRange> {
        self.apis.iter().copied().find(|a| a.api_key == api_key)
    }
}

impl Request for ApiVersionsRequest {
    const API_KEY: i16 = 18;
    const VERSION: i16 = 0;
    const NAME: &'static str = "ApiVersions";
    type Response = ApiVersionsResponse;

    fn encode(&self, _w: &mut Writer) {}

    fn decode(body: Vec<u8>, at: usize) -> WireResult<ApiVersionsResponse> {
        let mut r = Reader::new(&body[at..]);
        let error_code = r.i16("error code")?;
        let n = r.array_len(6, "api versions")?;
        let mut apis = Vec::with_capacity(n);
        for _ in 0..n {
            apis.push(ApiVersionRange {
                api_key: r.i16("api key")?,
                min: r.i16("min version")?,
                max: r.i16("max version")?,
            });
        }
        Ok(ApiVersionsResponse { error_code, apis })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_decodes() {
        let mut w = Writer::default();
        w.i32(9).i16(0).array_len(2);
        w.i16(1).i16(0).i16(11).i16(18).i16(0).i16(3);
        let response = ApiVersionsRequest::decode(w.into_bytes(), 4).unwrap();
        assert_eq!(response.error_code, 0);
        assert_eq!(
            response.range(1),
            Some(ApiVersionRange {
                api_key: 1,
                min: 0,
                max: 11
            })
        );
        assert_eq!(response.range(3), None);
    }

    #[test]
    fn request_has_no_body() {
        let mut w = Writer::default();
        ApiVersionsRequest.encode(&mut w);
        assert!(w.is_empty());
    }

    #[test]
    fn a_truncated_response_is_an_error() {
        let mut w = Writer::default();
        w.i32(9).i16(0).array_len(2).i16(1);
        assert!(ApiVersionsRequest::decode(w.into_bytes(), 4).is_err());
    }
}
