//! Per-buffer key filters stored with internal nodes: a Bloom filter over the keys of a child
//! buffer's point messages, so a point read through an internal node that is not cached can
//! skip reading and decoding that buffer (PerconaFT reads the buffer partition every time;
//! LSM trees such as RocksDB keep a Bloom filter per table for the same reason).
//!
//! 10 bits per key and 7 probes (false-positive rate about 0.8%), derived from the key's xxh3
//! hash ([`super::msg::key_hash`]) by double hashing (Kirsch and Mitzenmacher, "Less hashing,
//! same performance", 2006).

/// Bits per key.
pub(crate) const BITS_PER_KEY: usize = 10;
/// Probes per key.
pub(crate) const PROBES: u8 = 7;

/// A Bloom filter over key hashes. The empty filter built from no keys rejects everything; a
/// stored filter with 0 probes (never written: `build` uses at least one) accepts everything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyFilter {
    /// Probes per lookup; 0 = accept every key.
    pub(crate) probes: u8,
    /// The bit array, `words.len() * 64` bits.
    pub(crate) words: Vec<u64>,
}

impl KeyFilter {
    /// A filter over `hashes` (key hashes; duplicates are harmless), 10 bits per key.
    pub(crate) fn build(hashes: impl ExactSizeIterator<Item = u64>) -> Self {
        Self::build_with_bits(hashes, BITS_PER_KEY, PROBES)
    }

    /// A filter with `bits_per_key` bits per key and `probes` probes (spilled runs use 14 and
    /// 10: a point read may consult many runs, so each must rarely answer "maybe").
    pub(crate) fn build_with_bits(
        hashes: impl ExactSizeIterator<Item = u64>,
        bits_per_key: usize,
        probes: u8,
    ) -> Self {
        let n = hashes.len();
        let words = (n * bits_per_key).div_ceil(64).max(1);
        let probes = probes.clamp(1, 32);
        let mut f = KeyFilter {
            probes,
            words: vec![0; words],
        };
        if n == 0 {
            // No key: reject everything (probes over an all-zero array never match).
            return f;
        }
        for h in hashes {
            let m = f.bits();
            for bit in probe_bits(h, probes, m) {
                if let Some(w) = f.words.get_mut(bit / 64) {
                    *w |= 1 << (bit % 64);
                }
            }
        }
        f
    }

    pub(crate) fn bits(&self) -> usize {
        self.words.len() * 64
    }

    /// False only when no key with this hash was added.
    pub(crate) fn may_contain(&self, hash: u64) -> bool {
        if self.probes == 0 {
            return true;
        }
        probe_bits(hash, self.probes, self.bits()).all(|bit| {
            self.words
                .get(bit / 64)
                .is_some_and(|w| w & (1 << (bit % 64)) != 0)
        })
    }

    /// Bytes held in memory.
    pub(crate) fn size_bytes(&self) -> usize {
        16 + self.words.len() * 8
    }

    /// Appends the encoding: u8 probes, u32 word count, words as u64 little-endian.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.probes);
        // Inside partition 0, whose length is checked (see inner_len_u32).
        out.extend_from_slice(&crate::fractal::limits::inner_len_u32(self.words.len()).to_le_bytes());
        for w in &self.words {
            out.extend_from_slice(&w.to_le_bytes());
        }
    }

    /// Decodes from the front of `buf`; returns the filter and the bytes consumed.
    pub(crate) fn decode(buf: &[u8]) -> Result<(Self, usize), String> {
        let probes = *buf.first().ok_or("truncated key filter")?;
        let mut n = [0u8; 4];
        n.copy_from_slice(buf.get(1..5).ok_or("truncated key filter")?);
        let words = u32::from_le_bytes(n) as usize;
        if probes > 32 || (probes > 0 && words == 0) {
            return Err(format!("bad key filter ({probes} probes, {words} words)"));
        }
        let end = words
            .checked_mul(8)
            .and_then(|b| b.checked_add(5))
            .ok_or("key filter length overflow")?;
        let body = buf.get(5..end).ok_or("truncated key filter")?;
        let words = body
            .chunks_exact(8)
            .map(|c| {
                let mut a = [0u8; 8];
                a.copy_from_slice(c);
                u64::from_le_bytes(a)
            })
            .collect();
        Ok((KeyFilter { probes, words }, end))
    }
}

/// Bit positions probed for `hash` in an array of `m` bits.
pub(crate) fn probe_bits(hash: u64, probes: u8, m: usize) -> impl Iterator<Item = usize> {
    let h1 = hash & 0xffff_ffff;
    let h2 = (hash >> 32) | 1;
    let m = m.max(1) as u64;
    (0..u64::from(probes)).map(move |i| (h1.wrapping_add(i.wrapping_mul(h2)) % m) as usize)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::fractal::msg::key_hash;

    #[test]
    // Keys in big-endian so their byte order is their numeric order (test data, not stored).
    #[allow(clippy::big_endian_bytes)]
    fn no_false_negatives_and_few_false_positives() {
        let keys: Vec<Vec<u8>> = (0..5000u32).map(|i| i.to_be_bytes().to_vec()).collect();
        let f = KeyFilter::build(keys.iter().map(|k| key_hash(k)));
        assert!(keys.iter().all(|k| f.may_contain(key_hash(k))));
        let fp = (5000..105_000u32)
            .filter(|i| f.may_contain(key_hash(&i.to_be_bytes())))
            .count();
        // Expected about 0.8% of 100,000.
        assert!(fp < 2_000, "{fp} false positives of 100000");
        let mut enc = Vec::new();
        f.encode(&mut enc);
        let (g, used) = KeyFilter::decode(&enc).unwrap();
        assert_eq!((g, used), (f, enc.len()));
    }

    #[test]
    fn empty_rejects_and_everything_accepts() {
        let empty = KeyFilter::build(std::iter::empty());
        assert!(!empty.may_contain(key_hash(b"x")));
        let (zero_probes, _) = KeyFilter::decode(&[0, 0, 0, 0, 0]).unwrap();
        assert!(zero_probes.may_contain(key_hash(b"x")));
        assert!(KeyFilter::decode(&[7, 0, 0, 0, 0]).is_err());
        assert!(KeyFilter::decode(&[7, 1, 0, 0, 0, 1]).is_err());
    }
}
