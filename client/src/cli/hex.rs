//! Hex encoding of keys and values for `ftkvctl --hex` (binary keys on a text terminal).

/// A hex string that could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HexError {
    /// The number of hex digits is odd.
    #[error("hex string {0:?} has an odd number of digits")]
    OddLength(String),
    /// A character is not a hex digit.
    #[error("hex string {text:?} has a non-hex character {ch:?} at position {position}")]
    BadDigit {
        /// The whole input.
        text: String,
        /// The offending character.
        ch: char,
        /// Its position (0-based, after an optional `0x` prefix).
        position: usize,
    },
}

/// Lower-case hex of `bytes` (`[0x01, 0xab]` -> `"01ab"`).
pub fn encode(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    s
}

/// Decodes hex (either case, optional `0x` prefix, no separators). `""` is the empty string.
pub fn decode(text: &str) -> Result<Vec<u8>, HexError> {
    let digits = text
        .strip_prefix("0x")
        .or_else(|| text.strip_prefix("0X"))
        .unwrap_or(text);
    let chars: Vec<char> = digits.chars().collect();
    if chars.len() % 2 == 1 {
        return Err(HexError::OddLength(text.to_string()));
    }
    let mut out = Vec::with_capacity(chars.len() / 2);
    for (i, pair) in chars.chunks(2).enumerate() {
        let mut byte = 0u8;
        for (j, &ch) in pair.iter().enumerate() {
            // Built lazily: copying `text` per digit made large inputs quadratic.
            let v = ch.to_digit(16).ok_or_else(|| HexError::BadDigit {
                text: text.to_string(),
                ch,
                position: i * 2 + j,
            })?;
            // to_digit(16) is < 16, so the narrowing cannot lose bits.
            byte = (byte << 4) | (v as u8);
        }
        out.push(byte);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(decode(&encode(&all)).unwrap(), all);
        assert_eq!(encode(&[0x01, 0xab, 0xff]), "01abff");
        assert_eq!(decode("0x01ABff").unwrap(), vec![0x01, 0xab, 0xff]);
        assert_eq!(decode("").unwrap(), Vec::<u8>::new());
    }

    #[test]
    fn rejects_bad_input() {
        assert_eq!(decode("abc"), Err(HexError::OddLength("abc".into())));
        assert_eq!(
            decode("zz"),
            Err(HexError::BadDigit {
                text: "zz".into(),
                ch: 'z',
                position: 0
            })
        );
        assert!(matches!(
            decode("0a0g"),
            Err(HexError::BadDigit {
                ch: 'g',
                position: 3,
                ..
            })
        ));
        assert!(decode("é0").is_err());
        assert!(decode("0a 0b").is_err());
    }
}
