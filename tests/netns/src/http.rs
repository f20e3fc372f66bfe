//! A small blocking HTTP/1.1 client: one request per connection
//! (`Connection: close`), bounded in time, so that a client thread facing a
//! paused node or a lossy link gives up and records an unknown outcome
//! instead of hanging.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::Duration;

/// The longest a connection attempt may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(1_000);
/// The longest a read or a write may block.
pub const IO_TIMEOUT: Duration = Duration::from_millis(3_000);
/// The largest response read (a page of 200 small events is far below).
const RESPONSE_BYTES_MAX: u64 = 16 << 20;

/// A response, read whole.
#[derive(Debug)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The body.
    pub body: Vec<u8>,
}

/// Why a request got no response.
#[derive(Debug)]
pub enum RequestError {
    /// The connection was not made: nothing reached the node.
    Connect(std::io::Error),
    /// The request may have reached the node, but no whole answer came.
    NoAnswer(String),
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequestError::Connect(error) => write!(f, "connect: {error}"),
            RequestError::NoAnswer(why) => write!(f, "no answer: {why}"),
        }
    }
}

/// Sends one request and reads the whole answer.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: &[u8],
) -> Result<Response, RequestError> {
    request_from(None, addr, method, path, content_type, body)
}

/// The `admin` secret every node of the harness holds (the nodes listen
/// beyond loopback, so they run with secrets, and their links pass the
/// peer handshake under every fault). Not a secret: a test value.
pub const ADMIN_SECRET: &str = "meshlog-faults-admin-secret-not-secret";

/// The peer secret every node of the harness holds.
pub const PEER_SECRET: &str = "meshlog-faults-peer-secret-not-secret";

/// [`request`] from a chosen source address (the observer's), or the
/// kernel's choice with `None`.
pub fn request_from(
    source: Option<IpAddr>,
    addr: SocketAddr,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: &[u8],
) -> Result<Response, RequestError> {
    let mut stream = connect(source, addr).map_err(RequestError::Connect)?;
    let no_answer = |error: std::io::Error| RequestError::NoAnswer(error.to_string());
    stream
        .set_read_timeout(Some(IO_TIMEOUT))
        .map_err(no_answer)?;
    stream
        .set_write_timeout(Some(IO_TIMEOUT))
        .map_err(no_answer)?;
    let _ = stream.set_nodelay(true);
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-length: {}\r\nauthorization: Bearer {ADMIN_SECRET}\r\n",
        body.len()
    );
    if let Some(content_type) = content_type {
        head.push_str(&format!("content-type: {content_type}\r\n"));
    }
    head.push_str("\r\n");
    let mut raw = head.into_bytes();
    raw.extend_from_slice(body);
    stream.write_all(&raw).map_err(no_answer)?;
    let mut answer = Vec::new();
    (&mut stream)
        .take(RESPONSE_BYTES_MAX)
        .read_to_end(&mut answer)
        .map_err(no_answer)?;
    parse_response(&answer).ok_or_else(|| {
        RequestError::NoAnswer(format!(
            "not a whole HTTP response ({} bytes)",
            answer.len()
        ))
    })
}

fn connect(source: Option<IpAddr>, addr: SocketAddr) -> std::io::Result<TcpStream> {
    let Some(source) = source else {
        return TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT);
    };
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    socket.bind(&SocketAddr::new(source, 0).into())?;
    socket.connect_timeout(&addr.into(), CONNECT_TIMEOUT)?;
    Ok(socket.into())
}

/// Parses a whole HTTP/1.1 response with a content-length or chunked body.
pub fn parse_response(raw: &[u8]) -> Option<Response> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..end]).ok()?;
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let mut content_length = None;
    let mut chunked = false;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let (name, value) = (name.trim(), value.trim());
        if name.eq_ignore_ascii_case("content-length") {
            content_length = Some(value.parse::<usize>().ok()?);
        } else if name.eq_ignore_ascii_case("transfer-encoding") && value.contains("chunked") {
            chunked = true;
        }
    }
    let rest = &raw[end + 4..];
    let body = if chunked {
        let mut body = Vec::new();
        let mut rest = rest;
        loop {
            let line_end = rest.windows(2).position(|w| w == b"\r\n")?;
            let size =
                usize::from_str_radix(std::str::from_utf8(&rest[..line_end]).ok()?.trim(), 16)
                    .ok()?;
            rest = &rest[line_end + 2..];
            if size == 0 {
                break;
            }
            body.extend_from_slice(rest.get(..size)?);
            rest = rest.get(size + 2..)?;
        }
        body
    } else {
        match content_length {
            // A body cut short is no answer, not a short answer.
            Some(length) => rest.get(..length)?.to_vec(),
            None => rest.to_vec(),
        }
    };
    Some(Response { status, body })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_and_chunked_bodies_parse_and_a_cut_body_does_not() {
        let whole = parse_response(b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\n{}").unwrap();
        assert_eq!((whole.status, &whole.body[..]), (201, &b"{}"[..]));
        let chunked = parse_response(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!(&chunked.body[..], b"{}");
        assert!(parse_response(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n{}").is_none());
        assert!(parse_response(b"HTTP/1.1 200 OK\r\ncontent-le").is_none());
    }
}
