//! Byte primitives: the little-endian writer and reader, corruption errors, trailing crc32c.

use super::*;

#[derive(Default)]
pub(crate) struct W(pub(crate) Vec<u8>);

impl W {
    pub(crate) fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    pub(crate) fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    /// A length-prefixed byte string (see [`inner_len_u32`] for why this cannot fail).
    pub(crate) fn bytes(&mut self, b: &[u8]) {
        self.u32(inner_len_u32(b.len()));
        self.0.extend_from_slice(b);
    }
}

pub(crate) struct R<'a> {
    pub(crate) buf: &'a [u8],
    pub(crate) pos: usize,
}

pub(crate) type Detail = String;

impl<'a> R<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        R { buf, pos: 0 }
    }
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], Detail> {
        let end = self.pos.checked_add(n).ok_or("length overflow")?;
        let s = self
            .buf
            .get(self.pos..end)
            .ok_or_else(|| format!("truncated at byte {}", self.pos))?;
        self.pos = end;
        Ok(s)
    }
    /// The next `N` bytes as an array.
    pub(crate) fn array<const N: usize>(&mut self) -> Result<[u8; N], Detail> {
        let s = self.take(N)?;
        s.try_into()
            .map_err(|_| format!("took {} bytes, wanted {N}", s.len()))
    }
    pub(crate) fn u8(&mut self) -> Result<u8, Detail> {
        Ok(u8::from_le_bytes(self.array()?))
    }
    pub(crate) fn u32(&mut self) -> Result<u32, Detail> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub(crate) fn u64(&mut self) -> Result<u64, Detail> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    pub(crate) fn bytes(&mut self) -> Result<Vec<u8>, Detail> {
        Ok(self.slice()?.to_vec())
    }
    /// A length-prefixed byte string, borrowed.
    pub(crate) fn slice(&mut self) -> Result<&'a [u8], Detail> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    pub(crate) fn done(&self) -> Result<(), Detail> {
        if self.pos == self.buf.len() {
            Ok(())
        } else {
            Err(format!("{} trailing bytes", self.buf.len() - self.pos))
        }
    }
}

pub(crate) fn corruption(
    location: &(impl std::fmt::Display + ?Sized),
    detail: impl Into<String>,
) -> EngineError {
    EngineError::Corruption {
        location: location.to_string(),
        detail: detail.into(),
    }
}

pub(crate) fn verify_trailing_crc<'a>(
    buf: &'a [u8],
    location: &(impl std::fmt::Display + ?Sized),
) -> Result<&'a [u8]> {
    if buf.len() < 4 {
        return Err(corruption(location, "block shorter than its checksum"));
    }
    let (body, tail) = buf.split_at(buf.len() - 4);
    let mut c = [0u8; 4];
    c.copy_from_slice(tail);
    let stored = u32::from_le_bytes(c);
    let actual = crc32c::crc32c(body);
    if stored != actual {
        return Err(corruption(
            location,
            format!("crc32c mismatch (stored {stored:#010x}, computed {actual:#010x})"),
        ));
    }
    Ok(body)
}

/// The one magic-and-version check every record starts with: reads the 8-byte `magic` and the
/// u32 format version. A different magic is a corruption (`bad {what} magic`); any version but
/// [`FORMAT_VERSION`] (older ones included: the format is frozen and older files are not read)
/// is `Ok(Err(UnsupportedVersion))`, which callers return as it is.
pub(crate) fn read_prelude(r: &mut R<'_>, magic: &[u8; 8], what: &str) -> Result<Result<()>, Detail> {
    if r.take(8)? != magic {
        return Err(format!("bad {what} magic"));
    }
    let version = r.u32()?;
    if version != FORMAT_VERSION {
        return Ok(Err(EngineError::UnsupportedVersion {
            found: version,
            supported: FORMAT_VERSION,
        }));
    }
    Ok(Ok(()))
}
