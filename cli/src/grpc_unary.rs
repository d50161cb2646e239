//! Unary gRPC at the HTTP/2 level, for the calls the fleet proxy must read or answer itself:
//! one length-prefixed protobuf message per direction, the status in the trailers.

use std::convert::Infallible;

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderMap, HeaderValue, Method, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use prost::Message;
use tonic::{Code, Status};

/// A body the proxy sends, whatever its source: one type for both directions.
pub type ProxyBody = http_body_util::combinators::BoxBody<Bytes, hyper::Error>;

/// `bytes` as a body.
pub fn full(bytes: Bytes) -> ProxyBody {
    Full::new(bytes)
        .map_err(|never: Infallible| match never {})
        .boxed()
}

/// `message` as one uncompressed gRPC frame.
pub fn frame(message: &impl Message) -> Bytes {
    let len = message.encoded_len();
    let mut buf = BytesMut::with_capacity(5 + len);
    buf.put_u8(0);
    buf.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
    message
        .encode(&mut buf)
        .expect("the buffer was sized for the message");
    buf.freeze()
}

/// The one message of a unary gRPC body.
pub fn unframe<M: Message + Default>(body: &[u8]) -> Result<M, Status> {
    let bad = |why: &str| Status::internal(format!("edgevol proxy: {why}"));
    let (header, rest) = body
        .split_at_checked(5)
        .ok_or_else(|| bad("a gRPC message without its 5-byte header"))?;
    if header[0] != 0 {
        return Err(Status::unimplemented(
            "edgevol proxy: compressed messages are not supported with several appliances",
        ));
    }
    let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
    if rest.len() != len {
        return Err(bad("a unary call carried other than one message"));
    }
    M::decode(rest).map_err(|e| Status::invalid_argument(format!("edgevol proxy: {e}")))
}

/// A request's headers and its whole body.
#[derive(Debug)]
pub struct Buffered {
    /// The request line and headers, as the client sent them.
    pub parts: http::request::Parts,
    /// The body: one framed message for a unary or server-streaming call.
    pub body: Bytes,
}

impl Buffered {
    /// Reads the whole body of `req`.
    pub async fn read(req: Request<Incoming>) -> Result<Buffered, Status> {
        let (parts, body) = req.into_parts();
        let body = body
            .collect()
            .await
            .map_err(|e| Status::cancelled(format!("edgevol proxy: reading the request: {e}")))?
            .to_bytes();
        Ok(Buffered { parts, body })
    }

    /// The request's message.
    pub fn message<M: Message + Default>(&self) -> Result<M, Status> {
        unframe(&self.body)
    }

    /// The same request again (headers and body), to send to an appliance as is.
    pub fn replay(&self) -> Request<ProxyBody> {
        self.with_body(self.body.clone())
    }

    /// This request's method and headers with `message` as its body.
    pub fn with_message(&self, message: &impl Message) -> Request<ProxyBody> {
        self.with_body(frame(message))
    }

    fn with_body(&self, body: Bytes) -> Request<ProxyBody> {
        let mut req = Request::new(full(body));
        *req.method_mut() = Method::POST;
        *req.uri_mut() = self.parts.uri.clone();
        *req.headers_mut() = self.parts.headers.clone();
        req.headers_mut().remove(CONTENT_LENGTH);
        req
    }

    /// This call's method path with `path` in place of its own (another method, same headers).
    pub fn to(&self, path: &'static str, message: &impl Message) -> Request<ProxyBody> {
        let mut req = self.with_message(message);
        *req.uri_mut() = http::Uri::from_static(path);
        req
    }
}

/// A new unary request of the proxy's own (no client call behind it).
pub fn request(path: &'static str, message: &impl Message) -> Request<ProxyBody> {
    let mut req = Request::new(full(frame(message)));
    *req.method_mut() = Method::POST;
    *req.uri_mut() = http::Uri::from_static(path);
    let headers = req.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert("te", HeaderValue::from_static("trailers"));
    req
}

/// The message of an appliance's unary answer, or the status it sent instead.
pub async fn answer<M: Message + Default>(resp: Response<Incoming>) -> Result<M, Status> {
    let (parts, body) = resp.into_parts();
    if !parts.status.is_success() {
        return Err(Status::unavailable(format!(
            "edgevol proxy: appliance answered HTTP {}",
            parts.status
        )));
    }
    if let Some(status) = Status::from_header_map(&parts.headers) {
        if status.code() != Code::Ok {
            return Err(status);
        }
    }
    let collected = body.collect().await.map_err(|e| {
        Status::unavailable(format!("edgevol proxy: appliance answer cut short: {e}"))
    })?;
    if let Some(status) = collected.trailers().and_then(Status::from_header_map) {
        if status.code() != Code::Ok {
            return Err(status);
        }
    }
    unframe(&collected.to_bytes())
}

/// A successful unary answer carrying `message`.
pub fn reply(message: &impl Message) -> Response<ProxyBody> {
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    let body = Full::new(frame(message))
        .map_err(|never: Infallible| match never {})
        .with_trailers(async move { Some(Ok(trailers)) })
        .boxed();
    let mut resp = Response::new(body);
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    resp
}

/// A trailers-only gRPC answer carrying `status`.
pub fn refuse(status: Status) -> Response<ProxyBody> {
    status.into_http::<()>().map(|()| {
        http_body_util::Empty::<Bytes>::new()
            .map_err(|never: Infallible| match never {})
            .boxed()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgevol_proto::csi::v1::DeleteVolumeRequest;

    #[test]
    fn a_message_survives_framing_and_bad_frames_are_refused() {
        let m = DeleteVolumeRequest {
            volume_id: "box-v1".into(),
            ..Default::default()
        };
        let framed = frame(&m);
        assert_eq!(unframe::<DeleteVolumeRequest>(&framed).unwrap(), m);
        assert_eq!(
            unframe::<DeleteVolumeRequest>(&framed[..4])
                .unwrap_err()
                .code(),
            Code::Internal
        );
        assert_eq!(
            unframe::<DeleteVolumeRequest>(&framed[..framed.len() - 1])
                .unwrap_err()
                .code(),
            Code::Internal
        );
        let mut compressed = framed.to_vec();
        compressed[0] = 1;
        assert_eq!(
            unframe::<DeleteVolumeRequest>(&compressed)
                .unwrap_err()
                .code(),
            Code::Unimplemented
        );
    }
}
