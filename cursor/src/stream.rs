//! `StreamId`: the name of one writer's stream.

use std::fmt;
use std::str::FromStr;

/// The id of a writer stream: one per runtime that appends events.
///
/// A `u64`, because ids are compared and stored on every hot path (a key in
/// every version vector, the first half of every event's name), because a
/// random 64-bit id lets runtimes pick their own without a coordinator (two of
/// a thousand writers collide with odds near 3·10⁻¹⁴), and because small
/// configured ids (1, 2, 3, ...) still encode in one byte in a token.
///
/// The text form is lowercase hexadecimal without leading zeros (`0`, `1f`,
/// `9e3779b97f4a7c15`): short, copyable, and safe in JSON as a string where a
/// 64-bit number would lose precision.
///
/// ```
/// use meshlog_cursor::StreamId;
/// let id: StreamId = "1f".parse()?;
/// assert_eq!(id, StreamId::new(31));
/// assert_eq!(id.to_string(), "1f");
/// # Ok::<(), meshlog_cursor::ParseStreamIdError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct StreamId(u64);

impl StreamId {
    /// Wraps a raw id.
    pub const fn new(id: u64) -> Self {
        StreamId(id)
    }

    /// The raw id.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl From<u64> for StreamId {
    fn from(id: u64) -> Self {
        StreamId(id)
    }
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:x}", self.0)
    }
}

impl fmt::Debug for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StreamId({:x})", self.0)
    }
}

/// A stream id's text form was not 1 to 16 lowercase hex digits without
/// leading zeros.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("stream id {text:?} is not 1 to 16 lowercase hex digits without leading zeros")]
pub struct ParseStreamIdError {
    text: String,
}

impl FromStr for StreamId {
    type Err = ParseStreamIdError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let canonical = !text.is_empty()
            && text.len() <= 16
            && text
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            && (text == "0" || !text.starts_with('0'));
        if !canonical {
            // Keep the error small whatever the input's size.
            let text = text.chars().take(32).collect();
            return Err(ParseStreamIdError { text });
        }
        // Cannot fail: at most 16 hex digits always fit a u64.
        let id = u64::from_str_radix(text, 16).map_err(|_| ParseStreamIdError {
            text: text.to_owned(),
        })?;
        Ok(StreamId(id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_form_round_trips_and_is_canonical() {
        for id in [0, 1, 0x1f, u64::MAX, 0x9e37_79b9_7f4a_7c15] {
            let text = StreamId::new(id).to_string();
            assert_eq!(text.parse::<StreamId>(), Ok(StreamId::new(id)));
        }
        for bad in ["", "01", "1F", "x", "-1", "+1", "12345678901234567", " 1"] {
            assert!(bad.parse::<StreamId>().is_err(), "{bad:?} parsed");
        }
    }
}
