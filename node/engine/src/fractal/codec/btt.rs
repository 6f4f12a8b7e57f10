//! The block translation table block.

use super::*;

/// Encodes a BTT block (magic, version, roots, meta, entries, crc32c).
pub(crate) fn encode_btt(b: &BttImage) -> Vec<u8> {
    let mut w = W::default();
    w.0.extend_from_slice(BTT_MAGIC);
    w.u32(FORMAT_VERSION);
    w.u32(0);
    w.u64(b.counter);
    w.u64(b.root);
    w.u64(b.next_msn);
    w.u64(b.next_node_id);
    match &b.meta {
        Some(m) => {
            w.u8(1);
            w.bytes(m);
        }
        None => w.u8(0),
    }
    w.u64(b.entries.len() as u64);
    for (id, loc) in &b.entries {
        w.u64(*id);
        w.u64(loc.offset);
        w.u32(loc.size);
        w.u32(loc.crc);
    }
    let crc = crc32c::crc32c(&w.0);
    w.u32(crc);
    w.0
}

/// Decodes a BTT block read from `location`, verifying its checksum.
pub(crate) fn decode_btt(buf: &[u8], location: &(impl std::fmt::Display + ?Sized)) -> Result<BttImage> {
    let body = verify_trailing_crc(buf, location)?;
    let mut r = R::new(body);
    let res = (|| -> Result<Result<BttImage>, Detail> {
        if let Err(e) = read_prelude(&mut r, BTT_MAGIC, "BTT")? {
            return Ok(Err(e));
        }
        let _flags = r.u32()?;
        let counter = r.u64()?;
        let root = r.u64()?;
        let next_msn = r.u64()?;
        let next_node_id = r.u64()?;
        let meta = match r.u8()? {
            0 => None,
            1 => Some(r.bytes()?),
            t => return Err(format!("bad meta tag {t}")),
        };
        let n = r.u64()?;
        let mut entries = Vec::with_capacity(n.min(1 << 20) as usize);
        for _ in 0..n {
            let id = r.u64()?;
            let offset = r.u64()?;
            let size = r.u32()?;
            let crc = r.u32()?;
            entries.push((id, BlockLoc { offset, size, crc }));
        }
        r.done()?;
        Ok(Ok(BttImage {
            counter,
            root,
            next_msn,
            next_node_id,
            meta,
            entries,
        }))
    })();
    res.map_err(|d| corruption(location, d))?
}
