//! A hand-rolled sync peer: upgrades `GET /sync` (with the peer handshake,
//! a right or wrong key, or without one on a node with no peer secrets),
//! sends a hello and then whatever the test says, and reads what the node
//! answers. Tests send it what no honest peer would.

use std::net::SocketAddr;
use std::time::Duration;

use meshlog_cursor::{StreamId, VersionVector};
use meshlog_node::auth::SecretSources;
use meshlog_sync::frame::{self, Frame, Hello, FRAME_BYTES_MAX, PROTOCOL_VERSION};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::read_head;

/// A peer the test drives frame by frame.
pub struct RawPeer {
    /// The upgraded connection: the node's frames come on it.
    pub stream: TcpStream,
}

impl RawPeer {
    /// Dials with the peer handshake, proving `secret` under the key id
    /// of `key_id_of` (the two differ: a forger). The upgrade's status
    /// where it is not `101`.
    pub async fn connect(addr: SocketAddr, secret: &str, key_id_of: &str) -> Result<RawPeer, u16> {
        let key = |secret: &str| {
            meshlog_node::auth::Auth::load(SecretSources {
                peer: vec![secret.into()],
                ..SecretSources::default()
            })
            .unwrap()
            .peer_keys()
            .remove(0)
        };
        // The id of one secret with the key of another: a forger.
        let key = meshlog_node::auth::PeerKey {
            id: key(key_id_of).id,
            key: key(secret).key,
        };
        let dialer = meshlog_node::peer_auth::Dialer::new(&key);
        let (mut stream, text) = upgrade(addr, dialer.request_headers()).await?;
        let mut headers = hyper::HeaderMap::new();
        for line in text.lines().skip(1) {
            if let Some((name, value)) = line.split_once(':') {
                if let (Ok(name), Ok(value)) = (
                    hyper::header::HeaderName::from_bytes(name.trim().as_bytes()),
                    hyper::header::HeaderValue::from_str(value.trim()),
                ) {
                    headers.insert(name, value);
                }
            }
        }
        let proof = dialer.finish(&headers).unwrap_or([7u8; 32]);
        stream.write_all(&proof).await.unwrap();
        Ok(RawPeer { stream })
    }

    /// Dials a node with no peer secrets: the upgrade alone.
    pub async fn open(addr: SocketAddr) -> Result<RawPeer, u16> {
        let (stream, _) = upgrade(addr, Vec::<(String, String)>::new()).await?;
        Ok(RawPeer { stream })
    }

    pub async fn send(&mut self, frame: &Frame) {
        let bytes = frame::encode(frame).unwrap();
        let _ = self.stream.write_all(&bytes).await;
    }

    /// Sends a frame whose payload (`payload`, without its length prefix)
    /// need not be one this build can encode: a later build's kind.
    pub async fn send_payload(&mut self, payload: &[u8]) {
        let len = u32::try_from(payload.len()).unwrap();
        let _ = self.stream.write_all(&len.to_le_bytes()).await;
        let _ = self.stream.write_all(payload).await;
    }

    /// Says hello as `stream`, holding nothing.
    pub async fn hello(&mut self, stream: u64) {
        self.send(&Frame::Hello(Hello {
            protocol: PROTOCOL_VERSION,
            stream: StreamId::new(stream),
            marks: VersionVector::new(),
            floor: VersionVector::new(),
            frame_bytes_max: FRAME_BYTES_MAX as u32,
        }))
        .await;
    }

    /// Reads the node's frames until one acknowledges our delta `number`
    /// (`true`), or the link closes or `within` passes (`false`).
    pub async fn acknowledges_within(&mut self, number: u64, within: Duration) -> bool {
        let mut bytes = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        let read = async {
            loop {
                while bytes.len() >= 4 {
                    let len = u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize;
                    if bytes.len() < 4 + len {
                        break;
                    }
                    let frame = frame::decode_payload(&bytes[4..4 + len]);
                    bytes.drain(..4 + len);
                    let received = match frame {
                        Ok(Frame::Ack(receipt) | Frame::Heartbeat(receipt)) => receipt.received,
                        Ok(Frame::BareAck(received)) => received,
                        _ => 0,
                    };
                    if received >= number {
                        return true;
                    }
                }
                match self.stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return false,
                    Ok(n) => bytes.extend_from_slice(&buf[..n]),
                }
            }
        };
        tokio::time::timeout(within, read).await.unwrap_or(false)
    }

    /// Reads (and drops) what the node sends until it closes the link;
    /// `true` if it did within `within`.
    pub async fn closed_within(mut self, within: Duration) -> bool {
        let mut buf = vec![0u8; 64 << 10];
        tokio::time::timeout(within, async {
            loop {
                match self.stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await
        .is_ok()
    }
}

/// Sends `GET /sync` asking the upgrade, with `headers`; the connection
/// and the answer's head, or its status where it is not `101`. Nothing
/// past the head is read: the node's frames follow it.
async fn upgrade<K: std::fmt::Display, V: std::fmt::Display>(
    addr: SocketAddr,
    headers: impl IntoIterator<Item = (K, V)>,
) -> Result<(TcpStream, String), u16> {
    let mut head = format!(
        "GET /sync HTTP/1.1\r\nhost: {addr}\r\nconnection: upgrade\r\nupgrade: meshlog-sync\r\n"
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    let (status, text) = read_head(&mut stream).await;
    if status != 101 {
        return Err(status);
    }
    Ok((stream, text))
}
