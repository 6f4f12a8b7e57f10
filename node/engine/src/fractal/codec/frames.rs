//! Frames: cutting a stream of items into compressed frames, and the frame tables.

use super::*;

/// The stored bytes of `frames` back to back (a partition) and their total raw length.
pub(crate) fn concat_frames(frames: &[EncFrame]) -> Result<(Vec<u8>, u32)> {
    let total_raw = len_u32(frames.iter().map(|f| f.raw_len as usize).sum(), "partition")?;
    let mut stored = Vec::with_capacity(frames.iter().map(|f| f.stored.len()).sum());
    for f in frames {
        stored.extend_from_slice(&f.stored);
    }
    Ok((stored, total_raw))
}

/// Checks that frames of `(stored, raw)` lengths add up to a partition's stored and raw
/// lengths; `what` names them in the error.
pub(crate) fn check_frame_lengths(
    lens: impl Iterator<Item = (u32, u32)>,
    stored_len: usize,
    raw_len: usize,
    what: &str,
) -> Result<(), Detail> {
    let (stored, raw) = lens.fold((0u64, 0u64), |(s, r), (fs, fr)| {
        (s + u64::from(fs), r + u64::from(fr))
    });
    if stored != stored_len as u64 || raw != raw_len as u64 {
        return Err(format!(
            "{what} hold {stored} stored / {raw} raw bytes, partition {stored_len} / {raw_len}"
        ));
    }
    Ok(())
}

/// One encoded frame of a run or basement.
pub(crate) struct EncFrame {
    pub(crate) first_key: Vec<u8>,
    /// Messages or entries in it.
    pub(crate) count: u32,
    pub(crate) raw_len: u32,
    /// `stored.len()`, checked to fit its u32 field.
    pub(crate) stored_len: u32,
    pub(crate) stored: Vec<u8>,
}

/// Cuts a stream of encoded items (run messages, basement entries) into frames of about
/// `target_raw_bytes`, each compressed alone. Callers announce each item with
/// [`FrameWriter::begin_item`], then append its bytes to `raw`.
pub(crate) struct FrameWriter {
    pub(crate) target_raw_bytes: usize,
    pub(crate) level: Option<i32>,
    pub(crate) frames: Vec<EncFrame>,
    pub(crate) raw: W,
    pub(crate) first_key: Option<Vec<u8>>,
    pub(crate) count: u32,
}

impl FrameWriter {
    pub(crate) fn new(target_raw_bytes: usize, level: Option<i32>) -> Self {
        FrameWriter {
            target_raw_bytes,
            level,
            frames: Vec::new(),
            raw: W(Vec::with_capacity(target_raw_bytes + 1024)),
            first_key: None,
            count: 0,
        }
    }

    /// Starts an item with key `key`; a full frame is closed first when `may_cut` (callers
    /// forbid cuts inside one key's messages).
    pub(crate) fn begin_item(&mut self, key: &[u8], may_cut: bool) -> Result<()> {
        if may_cut && self.first_key.is_some() && self.raw.0.len() >= self.target_raw_bytes {
            self.cut()?;
        }
        if self.first_key.is_none() {
            self.first_key = Some(key.to_vec());
        }
        self.count += 1;
        Ok(())
    }

    pub(crate) fn cut(&mut self) -> Result<()> {
        let Some(first_key) = self.first_key.take() else {
            return Ok(());
        };
        let raw = std::mem::replace(&mut self.raw.0, Vec::with_capacity(self.target_raw_bytes + 1024));
        let raw_len = len_u32(raw.len(), "frame")?;
        let stored = compress(raw, self.level)?;
        self.frames.push(EncFrame {
            first_key,
            count: std::mem::take(&mut self.count),
            raw_len,
            stored_len: len_u32(stored.len(), "frame")?,
            stored,
        });
        Ok(())
    }

    pub(crate) fn finish(mut self) -> Result<Vec<EncFrame>> {
        self.cut()?;
        Ok(self.frames)
    }
}

/// One row of a frame table as stored.
pub(crate) struct FrameRow {
    pub(crate) first_key: Vec<u8>,
    pub(crate) count: u32,
    pub(crate) stored_len: u32,
    pub(crate) raw_len: u32,
    pub(crate) crc: u32,
}

/// Reads `n` rows of a frame table ([`write_frame_table`]'s layout), checking that first keys
/// strictly increase and no frame is empty; `what` names the table in errors.
pub(crate) fn read_frame_rows(r: &mut R<'_>, n: usize, what: &str) -> Result<Vec<FrameRow>, Detail> {
    let mut rows: Vec<FrameRow> = Vec::with_capacity(n.min(1 << 16));
    for _ in 0..n {
        let row = FrameRow {
            first_key: r.bytes()?,
            count: r.u32()?,
            stored_len: r.u32()?,
            raw_len: r.u32()?,
            crc: r.u32()?,
        };
        if rows.last().is_some_and(|p| p.first_key >= row.first_key) {
            return Err(format!("{what}: frames not in key order"));
        }
        if row.count == 0 {
            return Err(format!("{what}: empty frame"));
        }
        rows.push(row);
    }
    Ok(rows)
}

/// Writes a frame table: per frame the first key, u32 count, u32 stored length, u32 raw
/// length and u32 crc32c of the stored bytes.
pub(crate) fn write_frame_table(frames: &[EncFrame], out: &mut W) {
    for f in frames {
        out.bytes(&f.first_key);
        out.u32(f.count);
        out.u32(f.stored_len);
        out.u32(f.raw_len);
        out.u32(crc32c::crc32c(&f.stored));
    }
}
