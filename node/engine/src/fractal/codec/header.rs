//! The checkpoint header (one per slot).

use super::*;

/// Encodes a header into `HEADER_BYTES` bytes.
pub(crate) fn encode_header(h: &Header) -> Vec<u8> {
    let mut w = W::default();
    w.0.extend_from_slice(HEADER_MAGIC);
    w.u32(FORMAT_VERSION);
    w.u32(const { const_len_u32(HEADER_BYTES) });
    w.u64(h.counter);
    w.u64(h.btt.offset);
    w.u32(h.btt.size);
    w.u32(h.btt.crc);
    w.0.resize(HEADER_BYTES - 4, 0);
    let crc = crc32c::crc32c(&w.0);
    w.u32(crc);
    w.0
}

/// Decodes a header slot; `Ok(None)` when the slot does not hold a valid header (never written,
/// torn, or zeroed), `Err(UnsupportedVersion)` when it is valid but of another format version.
pub(crate) fn decode_header(buf: &[u8]) -> Result<Option<Header>> {
    let Some(body) = buf.get(..HEADER_BYTES) else {
        return Ok(None);
    };
    let (data, crc_bytes) = body.split_at(HEADER_BYTES - 4);
    let mut crc = [0u8; 4];
    crc.copy_from_slice(crc_bytes);
    if data.get(..8) != Some(HEADER_MAGIC.as_slice()) || crc32c::crc32c(data) != u32::from_le_bytes(crc) {
        return Ok(None);
    }
    let mut r = R::new(data);
    let parsed = (|| -> Result<Result<Header>, Detail> {
        if let Err(e) = read_prelude(&mut r, HEADER_MAGIC, "header")? {
            return Ok(Err(e));
        }
        let _len = r.u32()?;
        let counter = r.u64()?;
        let offset = r.u64()?;
        let size = r.u32()?;
        let bcrc = r.u32()?;
        Ok(Ok(Header {
            counter,
            btt: BlockLoc {
                offset,
                size,
                crc: bcrc,
            },
        }))
    })();
    match parsed {
        Ok(Ok(h)) => Ok(Some(h)),
        Ok(Err(e)) => Err(e),
        Err(_) => Ok(None),
    }
}
