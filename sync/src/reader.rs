//! [`FrameReader`]: whole frames from a tokio byte stream.
//!
//! The only part of `frame` that does I/O, kept out of the core crate
//! (`meshlog-sync-core`) so the codec stays synchronous, free of tokio and
//! total on byte slices (what the fuzz target drives),
//! while the reader owns what reading a socket adds: a buffer that survives
//! a cancelled read, and a prefix refused before its payload is buffered.

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

use meshlog_sync_core::frame::{
    peek_len, FRAME_BYTES_CEILING, FRAME_BYTES_MAX, LENGTH_PREFIX_BYTES,
};
// Named by the reader's docs only.
#[cfg(doc)]
use meshlog_sync_core::frame::FrameError;

/// Reads length-prefixed frames from a byte stream, one whole frame at a
/// time.
///
/// Cancel-safe: [`FrameReader::read_payload`] keeps partial input in the reader,
/// so it can be a branch of `tokio::select!` that loses the race without
/// losing bytes. The buffer never holds more than one frame's worth plus one
/// read: a prefix above its limit ([`FRAME_BYTES_MAX`] unless set) is refused before its payload is
/// buffered.
#[derive(Debug, Default)]
pub struct FrameReader {
    buf: BytesMut,
    /// The frame limit, in payload bytes; [`FRAME_BYTES_MAX`] unless set.
    limit: Option<usize>,
}

/// How much buffer a read asks for at a time: large frames are read in
/// chunks rather than reserved whole up front.
const READ_CHUNK_BYTES: usize = 64 * 1024;

impl FrameReader {
    /// A reader with an empty buffer and the default frame limit,
    /// [`FRAME_BYTES_MAX`].
    pub fn new() -> Self {
        Self::default()
    }

    /// A reader with an empty buffer that takes frames of up to `limit`
    /// payload bytes (at most [`FRAME_BYTES_CEILING`]): what a session whose
    /// `frame_bytes_max` is raised reads with.
    pub fn with_limit(limit: usize) -> Self {
        FrameReader {
            buf: BytesMut::new(),
            limit: Some(limit.min(FRAME_BYTES_CEILING)),
        }
    }

    /// The next whole frame's payload (without the prefix), or `Ok(None)` at
    /// a clean end of stream (between frames).
    ///
    /// An end of stream inside a frame is an
    /// [`std::io::ErrorKind::UnexpectedEof`] error; a prefix above the limit
    /// is an [`std::io::ErrorKind::InvalidData`] error wrapping
    /// [`FrameError::TooLarge`] (see [`FrameError::of_io`]).
    pub async fn read_payload<R: AsyncRead + Unpin>(
        &mut self,
        source: &mut R,
    ) -> std::io::Result<Option<Bytes>> {
        Ok(self
            .read_frame(source)
            .await?
            .map(|raw| raw.slice(LENGTH_PREFIX_BYTES..)))
    }

    /// The next whole frame's raw bytes, prefix included: what the
    /// testkit's fault proxy forwards. Same contract as
    /// [`FrameReader::read_payload`]; the prefix is checked, the payload is
    /// not decoded. Only with the `testkit` feature: a session never needs a
    /// frame it has not decoded.
    #[cfg(feature = "testkit")]
    pub async fn read_raw<R: AsyncRead + Unpin>(
        &mut self,
        source: &mut R,
    ) -> std::io::Result<Option<Bytes>> {
        self.read_frame(source).await
    }

    /// The next whole frame, prefix included (see `read_raw`).
    async fn read_frame<R: AsyncRead + Unpin>(
        &mut self,
        source: &mut R,
    ) -> std::io::Result<Option<Bytes>> {
        loop {
            let len = peek_len(&self.buf, self.limit.unwrap_or(FRAME_BYTES_MAX))
                .map_err(|error| std::io::Error::new(std::io::ErrorKind::InvalidData, error))?;
            if let Some(len) = len {
                if self.buf.len() >= LENGTH_PREFIX_BYTES + len {
                    return Ok(Some(self.buf.split_to(LENGTH_PREFIX_BYTES + len).freeze()));
                }
            }
            let missing = match len {
                Some(len) => LENGTH_PREFIX_BYTES + len - self.buf.len(),
                None => LENGTH_PREFIX_BYTES - self.buf.len(),
            };
            self.buf.reserve(missing.min(READ_CHUNK_BYTES));
            let read = source.read_buf(&mut self.buf).await?;
            if read == 0 {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!(
                        "stream ended inside a frame ({} bytes of it read)",
                        self.buf.len()
                    ),
                ));
            }
        }
    }
}
