//! Rows shaped like the seed's `timeline_1009(uid bigint unsigned PK, vflag tinyint, status_id
//! bigint unsigned, source int, fflag int, mflag tinyint)` (the seeds' storage table; the shape
//! is quoted in the module docs of [`crate::storage`]), with the skew of a real timeline table:
//!
//! - `uid`: unique (the primary key), increasing with heavy-tailed gaps (a Pareto-like gap,
//!   `alpha` = 1.1: most users registered in dense runs, a few large jumps), inserted in random
//!   order;
//! - `source` (the client that posted): Zipf-distributed over 1,000 sources (exponent 1.1), so
//!   a handful of sources carry most rows;
//! - `status_id`: a snowflake-like id (milliseconds within 90 days in the high bits, a worker
//!   and a sequence in the low 22 bits);
//! - `vflag`, `fflag`, `mflag`: mostly 0 (92 %, 95 %, 97 %), else a small value or one bit.
//!
//! Encoding, the way a MySQL row format stores the columns (fixed width, little-endian): key =
//! `timeline_1009/` + `uid` big-endian (8 bytes, so keys sort by uid); value = `vflag` (1 byte),
//! `status_id` (8), `source` (4), `fflag` (4), `mflag` (1): 18 bytes. Every target gets the same
//! bytes; "raw bytes" are the key and value bytes written.

use rand::seq::SliceRandom;
use rand::SeedableRng;

use crate::engine::data::splitmix64;

/// Key prefix of the table.
pub const PREFIX: &[u8] = b"timeline_1009/";
/// Encoded value length, bytes.
pub const VALUE_LEN_BYTES: usize = 18;
/// Distinct `source` values.
const SOURCES: usize = 1000;
/// First uid.
const FIRST_UID: u64 = 1_000_000_000;
/// 2013-01-01 in Unix milliseconds: the window `status_id` timestamps fall in.
const EPOCH_MS: u64 = 1_356_998_400_000;
const WINDOW_MS: u64 = 90 * 24 * 3600 * 1000;

/// `rows` rows of the table in insertion (random) order.
pub struct Timeline {
    uids: Vec<u64>,
    source_cdf: Vec<f64>,
    seed: u64,
}

impl Timeline {
    /// The table of `rows` rows drawn from `seed`.
    pub fn new(rows: u64, seed: u64) -> Self {
        let mut state = splitmix64(seed);
        let mut uid = FIRST_UID;
        let mut uids = Vec::with_capacity(usize::try_from(rows).unwrap_or(0));
        for _ in 0..rows {
            uids.push(uid);
            state = splitmix64(state);
            uid += pareto_gap(state);
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        uids.shuffle(&mut rng);
        Self {
            uids,
            source_cdf: zipf_cdf(SOURCES, 1.1),
            seed,
        }
    }

    /// Rows in the table.
    pub fn len(&self) -> u64 {
        self.uids.len() as u64
    }

    /// True when the table has no rows.
    pub fn is_empty(&self) -> bool {
        self.uids.is_empty()
    }

    /// Key and value of row `index` (0-based, insertion order); `None` past the end.
    pub fn row(&self, index: u64) -> Option<(Vec<u8>, Vec<u8>)> {
        let uid = *self.uids.get(usize::try_from(index).ok()?)?;
        let mut key = Vec::with_capacity(PREFIX.len() + 8);
        key.extend_from_slice(PREFIX);
        key.extend_from_slice(&uid.to_be_bytes());
        let mut h = splitmix64(self.seed ^ uid);
        let mut next = || {
            h = splitmix64(h);
            h
        };
        let vflag: u8 = match next() % 100 {
            0..=91 => 0,
            92..=98 => 1,
            _ => 2,
        };
        let ts_ms = EPOCH_MS + next() % WINDOW_MS;
        let status_id = ((ts_ms - EPOCH_MS) << 22) | (next() & 0x3f_ffff);
        let source = self.source(next());
        let fflag: u32 = if next() % 100 < 95 { 0 } else { 1 << (next() % 8) };
        let mflag: u8 = u8::from(next() % 100 >= 97);
        let mut value = Vec::with_capacity(VALUE_LEN_BYTES);
        value.push(vflag);
        value.extend_from_slice(&status_id.to_le_bytes());
        value.extend_from_slice(&source.to_le_bytes());
        value.extend_from_slice(&fflag.to_le_bytes());
        value.push(mflag);
        Some((key, value))
    }

    /// A source id (1-based) for the uniform 64-bit draw `x`, Zipf-distributed.
    fn source(&self, x: u64) -> u32 {
        let u = (x >> 11) as f64 / (1u64 << 53) as f64;
        let i = self.source_cdf.partition_point(|c| *c < u);
        u32::try_from(i.min(SOURCES - 1) + 1).unwrap_or(1)
    }
}

/// A uid gap >= 1 from the uniform draw `x`: `floor(u^(-1/1.1))`, capped at 1,000,000.
fn pareto_gap(x: u64) -> u64 {
    let u = ((x >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
    let gap = u.powf(-1.0 / 1.1).floor();
    (gap as u64).clamp(1, 1_000_000)
}

/// The cumulative distribution of a Zipf law with exponent `s` over `n` ranks.
fn zipf_cdf(n: usize, s: f64) -> Vec<f64> {
    let weights: Vec<f64> = (1..=n).map(|k| 1.0 / (k as f64).powf(s)).collect();
    let total: f64 = weights.iter().sum();
    let mut acc = 0.0;
    weights
        .iter()
        .map(|w| {
            acc += w / total;
            acc
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn rows_have_the_shape_unique_keys_and_skew() {
        let t = Timeline::new(20_000, 7);
        let rows: Vec<_> = (0..t.len()).map(|i| t.row(i).unwrap()).collect();
        assert!(t.row(t.len()).is_none());
        let mut keys: Vec<_> = rows.iter().map(|(k, _)| k.clone()).collect();
        assert!(keys
            .iter()
            .all(|k| k.len() == PREFIX.len() + 8 && k.starts_with(PREFIX)));
        assert!(rows.iter().all(|(_, v)| v.len() == VALUE_LEN_BYTES));
        // Random insertion order, unique keys.
        assert!(!keys.windows(2).all(|w| w[0] < w[1]));
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), 20_000);
        // Flags mostly 0; the top source carries far more than a uniform share.
        let vflag_zero = rows.iter().filter(|(_, v)| v[0] == 0).count();
        assert!(vflag_zero > 17_000 && vflag_zero < 19_500, "{vflag_zero}");
        let source_1 = rows
            .iter()
            .filter(|(_, v)| u32::from_le_bytes(v[9..13].try_into().unwrap()) == 1)
            .count();
        assert!(source_1 > 1_000, "{source_1}");
        // Deterministic.
        assert_eq!(Timeline::new(100, 7).row(5), Timeline::new(100, 7).row(5));
    }
}
