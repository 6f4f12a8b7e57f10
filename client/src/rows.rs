//! Row encoding of `ftkvctl load` (the `LOAD DATA INFILE ... (col, ...)` of ftkv), for
//! programs that read loaded rows back.
//!
//! **Key**: the load's prefix bytes, then each key column in order, order-preserving (keys
//! compare bytewise as the column values compare, first column first), after FoundationDB's
//! tuple layer:
//! - `int` (i64): `0x15`, then the value with its sign bit flipped, 8 bytes big-endian;
//! - `str` (UTF-8 text) and `bytes`: `0x02`, the bytes with each `0x00` written `0x00 0xFF`,
//!   then a `0x00` terminator (so `"a"` < `"a\0"` < `"ab"`, and a column never runs into the next).
//!
//! **Value**: `0x01` (format version), then each other column in order:
//! - NULL (the field `\N`, as MySQL writes it): `0x00`;
//! - `int`: `0x15`, 8 bytes little-endian two's complement;
//! - `str`/`bytes`: `0x02`, length u32 little-endian, the bytes.

use std::fmt;

/// Type of a column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnType {
    /// A 64-bit signed integer (decimal text).
    Int,
    /// UTF-8 text.
    Str,
    /// Any bytes.
    Bytes,
}

impl ColumnType {
    /// Parses `int`, `str` (or `text`, `string`) and `bytes`.
    pub fn parse(name: &str) -> Option<ColumnType> {
        match name {
            "int" | "integer" | "i64" | "bigint" => Some(ColumnType::Int),
            "str" | "text" | "string" | "varchar" => Some(ColumnType::Str),
            "bytes" | "blob" | "binary" => Some(ColumnType::Bytes),
            _ => None,
        }
    }
}

/// A field that does not fit its column type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Why (e.g. "not an integer: \"12x\"").
    pub reason: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

const INT_TAG: u8 = 0x15;
const BYTES_TAG: u8 = 0x02;
const NULL_TAG: u8 = 0x00;
/// Version byte of an encoded value.
pub const VALUE_VERSION: u8 = 0x01;

/// The NULL field (MySQL's `\N`).
pub const NULL_FIELD: &[u8] = b"\\N";

fn parse_int(field: &[u8]) -> Result<i64, FieldError> {
    std::str::from_utf8(field)
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
        .ok_or_else(|| FieldError {
            reason: format!("not an integer: {:?}", String::from_utf8_lossy(field)),
        })
}

fn check_text(field: &[u8]) -> Result<(), FieldError> {
    std::str::from_utf8(field).map(|_| ()).map_err(|e| FieldError {
        reason: format!("invalid UTF-8 at byte {}", e.valid_up_to()),
    })
}

/// Appends key column `field` of type `ty` to `key`. NULL is not allowed in a key.
pub fn encode_key_field(key: &mut Vec<u8>, ty: ColumnType, field: &[u8]) -> Result<(), FieldError> {
    match ty {
        ColumnType::Int => {
            let v = parse_int(field)?;
            key.push(INT_TAG);
            key.extend_from_slice(&((v as u64) ^ (1 << 63)).to_be_bytes());
        }
        ColumnType::Str | ColumnType::Bytes => {
            if ty == ColumnType::Str {
                check_text(field)?;
            }
            key.push(BYTES_TAG);
            for &b in field {
                key.push(b);
                if b == 0 {
                    key.push(0xFF);
                }
            }
            key.push(0x00);
        }
    }
    Ok(())
}

/// Starts a value: its version byte.
pub fn begin_value(value: &mut Vec<u8>) {
    value.push(VALUE_VERSION);
}

/// Appends value column `field` of type `ty` (`\N` = NULL) to `value`.
pub fn encode_value_field(value: &mut Vec<u8>, ty: ColumnType, field: &[u8]) -> Result<(), FieldError> {
    if field == NULL_FIELD {
        value.push(NULL_TAG);
        return Ok(());
    }
    match ty {
        ColumnType::Int => {
            let v = parse_int(field)?;
            value.push(INT_TAG);
            value.extend_from_slice(&v.to_le_bytes());
        }
        ColumnType::Str | ColumnType::Bytes => {
            if ty == ColumnType::Str {
                check_text(field)?;
            }
            let len = u32::try_from(field.len()).map_err(|_| FieldError {
                reason: format!("field of {} bytes is over 4 GiB", field.len()),
            })?;
            value.push(BYTES_TAG);
            value.extend_from_slice(&len.to_le_bytes());
            value.extend_from_slice(field);
        }
    }
    Ok(())
}

/// A decoded value column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Field {
    /// NULL.
    Null,
    /// An integer.
    Int(i64),
    /// Text or bytes.
    Bytes(Vec<u8>),
}

/// Decodes a value written by [`encode_value_field`]s after [`begin_value`].
pub fn decode_value(value: &[u8]) -> Result<Vec<Field>, FieldError> {
    let bad = |reason: &str| FieldError {
        reason: reason.to_string(),
    };
    let mut rest = match value.split_first() {
        Some((&VALUE_VERSION, rest)) => rest,
        _ => return Err(bad("not a version-1 row value")),
    };
    let mut out = Vec::new();
    while let Some((&tag, tail)) = rest.split_first() {
        match tag {
            NULL_TAG => {
                out.push(Field::Null);
                rest = tail;
            }
            INT_TAG => {
                let b: [u8; 8] = tail
                    .get(..8)
                    .and_then(|b| b.try_into().ok())
                    .ok_or_else(|| bad("truncated int"))?;
                out.push(Field::Int(i64::from_le_bytes(b)));
                rest = tail.get(8..).unwrap_or_default();
            }
            BYTES_TAG => {
                let len: [u8; 4] = tail
                    .get(..4)
                    .and_then(|b| b.try_into().ok())
                    .ok_or_else(|| bad("truncated length"))?;
                let len = u32::from_le_bytes(len) as usize;
                let bytes = tail.get(4..4 + len).ok_or_else(|| bad("truncated field"))?;
                out.push(Field::Bytes(bytes.to_vec()));
                rest = tail.get(4 + len..).unwrap_or_default();
            }
            _ => return Err(bad("unknown field tag")),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_of(fields: &[(ColumnType, &[u8])]) -> Vec<u8> {
        let mut k = Vec::new();
        for (ty, f) in fields {
            encode_key_field(&mut k, *ty, f).unwrap();
        }
        k
    }

    #[test]
    fn keys_sort_as_their_values() {
        let ints = [i64::MIN, -1_000_000, -1, 0, 1, 2, 255, 256, 1 << 40, i64::MAX];
        for w in ints.windows(2) {
            let a = key_of(&[(ColumnType::Int, w[0].to_string().as_bytes())]);
            let b = key_of(&[(ColumnType::Int, w[1].to_string().as_bytes())]);
            assert!(a < b, "{} !< {}", w[0], w[1]);
        }
        let strs: [&[u8]; 5] = [b"", b"a", b"a\0", b"a\0b", b"ab"];
        for w in strs.windows(2) {
            assert!(key_of(&[(ColumnType::Bytes, w[0])]) < key_of(&[(ColumnType::Bytes, w[1])]));
        }
        // Composite keys: first column first, whatever the second holds.
        let a = key_of(&[(ColumnType::Str, b"a"), (ColumnType::Int, b"99")]);
        let b = key_of(&[(ColumnType::Str, b"ab"), (ColumnType::Int, b"1")]);
        assert!(a < b);
    }

    #[test]
    fn values_round_trip_and_bad_fields_say_why() {
        let mut v = Vec::new();
        begin_value(&mut v);
        encode_value_field(&mut v, ColumnType::Int, b"-42").unwrap();
        encode_value_field(&mut v, ColumnType::Str, b"hello").unwrap();
        encode_value_field(&mut v, ColumnType::Str, NULL_FIELD).unwrap();
        assert_eq!(
            decode_value(&v).unwrap(),
            vec![Field::Int(-42), Field::Bytes(b"hello".to_vec()), Field::Null]
        );
        let e = encode_value_field(&mut v, ColumnType::Int, b"12x").unwrap_err();
        assert!(e.reason.contains("not an integer"), "{e}");
        let e = encode_key_field(&mut v, ColumnType::Str, b"ok\xff").unwrap_err();
        assert!(e.reason.contains("invalid UTF-8 at byte 2"), "{e}");
        // Cut inside the text field (the last byte is the NULL field's tag).
        assert!(decode_value(&v[..v.len() - 2]).is_err());
    }
}
