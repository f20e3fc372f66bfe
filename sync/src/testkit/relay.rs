//! A relay in the middle of a real session that rewrites deltas: an
//! in-memory link whose frames one way (the writer's side to the
//! receiver's) are decoded, each delta handed to the test to change, and
//! sent on re-encoded; every other frame, and everything the other way,
//! passes as it is. With `meshlog_testkit::hostile::tamperings` it plays
//! the hostile relay of `docs/SIGNING.md` between two `Session`s: one that
//! forges, alters, reorders or truncates a writer's sealed run, or cuts or
//! swaps its seal.

use meshlog_replica::Delta;
use tokio::io::{AsyncWriteExt, DuplexStream};

use crate::frame::{self, Frame};
use crate::FrameReader;

/// A connected pair of in-memory byte streams, `(writer_side,
/// receiver_side)`: what is written to `writer_side` is read from
/// `receiver_side` frame by frame, each delta frame as `tamper` rewrites it
/// (given its number and delta, it answers the delta to send in its
/// place), and what is written to `receiver_side` is read from
/// `writer_side` unchanged. A frame that does not decode passes as it is
/// (the receiver refuses it); either side closing closes the other.
///
/// Must be called within a tokio runtime: it spawns the link's two pumps.
///
/// # Panics
///
/// In the pump, if `tamper` answers a delta the encoder refuses (a test's
/// own mistake): the link then closes.
pub fn tampering_link<F>(mut tamper: F) -> (DuplexStream, DuplexStream)
where
    F: FnMut(u64, Delta) -> Delta + Send + 'static,
{
    let (writer_side, relay_in) = tokio::io::duplex(1 << 20);
    let (relay_out, receiver_side) = tokio::io::duplex(1 << 20);
    let (mut in_read, mut in_write) = tokio::io::split(relay_in);
    let (mut out_read, mut out_write) = tokio::io::split(relay_out);
    tokio::spawn(async move {
        let mut reader = FrameReader::new();
        while let Ok(Some(raw)) = reader.read_raw(&mut in_read).await {
            let bytes = match frame::decode(&raw) {
                Ok(Frame::Delta { number, delta }) => {
                    frame::encode(&Frame::delta(number, tamper(number, delta)))
                        .expect("a tampered delta the encoder takes")
                }
                _ => raw.to_vec(),
            };
            if out_write.write_all(&bytes).await.is_err() {
                break;
            }
        }
        let _ = out_write.shutdown().await;
    });
    tokio::spawn(async move {
        let _ = tokio::io::copy(&mut out_read, &mut in_write).await;
        let _ = in_write.shutdown().await;
    });
    (writer_side, receiver_side)
}
