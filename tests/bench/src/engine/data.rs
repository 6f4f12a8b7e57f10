//! Deterministic data for the engine workloads: random 16-byte keys, 100-byte half-compressible
//! values, and rows shaped like the seed tables `timeline_1009` and `user_summary` (BENCH.md).
//!
//! Every key is a pure function of `(seed, index)`, so a reader can pick a random index below
//! the number of rows written and know the key exists, without keeping the keys in memory.

/// splitmix64 (Steele, Lea, Flood 2014): a fast, well-mixed 64-bit hash of a counter.
pub fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Key length of the random-key workloads, in bytes.
pub const KEY_LEN_BYTES: usize = 16;
/// Value length of the random-key workloads, in bytes.
pub const VALUE_LEN_BYTES: usize = 100;

/// The 16-byte random key number `index` of the stream `seed` (uniform over the key space).
pub fn random_key(seed: u64, index: u64) -> [u8; KEY_LEN_BYTES] {
    let a = splitmix64(seed ^ index.wrapping_mul(0xA24B_AED4_963E_E407));
    let b = splitmix64(a ^ index);
    let mut k = [0u8; KEY_LEN_BYTES];
    k[..8].copy_from_slice(&a.to_be_bytes());
    k[8..].copy_from_slice(&b.to_be_bytes());
    k
}

/// The 100-byte value of row `index`: 50 pseudo-random bytes followed by 50 bytes of repeated
/// text, so a general-purpose compressor saves about half (the "half-compressible" values of
/// the issue).
pub fn half_compressible_value(seed: u64, index: u64) -> Vec<u8> {
    const FILLER: &[u8] = b"ftkv-bench-filler-";
    let mut v = Vec::with_capacity(VALUE_LEN_BYTES);
    let mut x = splitmix64(seed.rotate_left(17) ^ index);
    while v.len() < VALUE_LEN_BYTES / 2 {
        x = splitmix64(x);
        let take = (VALUE_LEN_BYTES / 2 - v.len()).min(8);
        v.extend_from_slice(&x.to_le_bytes()[..take]);
    }
    while v.len() < VALUE_LEN_BYTES {
        let take = (VALUE_LEN_BYTES - v.len()).min(FILLER.len());
        v.extend_from_slice(&FILLER[..take]);
    }
    v
}

/// One table of the compression workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SeedTable {
    /// `timeline_1009(uid bigint unsigned PK, vflag tinyint, status_id bigint unsigned,
    /// source int, fflag int, mflag tinyint)`: key 8 bytes, row 26 bytes.
    Timeline1009,
    /// `user_summary(user_id bigint unsigned UNIQUE, weight varchar(5), level varchar(20),
    /// beat_rate varchar(12), level_num int)`: key 8 bytes, row about 42 bytes of text.
    UserSummary,
}

impl SeedTable {
    /// One-byte table prefix of the key, so both tables share one engine.
    fn prefix(self) -> u8 {
        match self {
            SeedTable::Timeline1009 => 1,
            SeedTable::UserSummary => 2,
        }
    }
}

/// Key and encoded row number `index` of `table`: key = table prefix + big-endian primary key
/// (ids spread like real user ids: increasing with random gaps, inserted in random order);
/// row = fixed-width little-endian integers and length-prefixed short strings, as a MySQL row
/// format would store them.
pub fn seed_table_row(table: SeedTable, seed: u64, index: u64) -> (Vec<u8>, Vec<u8>) {
    let h = splitmix64(seed ^ index ^ (u64::from(table.prefix()) << 56));
    // Primary key: index * 1000 + a random gap below 1000: unique, realistic spacing.
    let id = 1_000_000_000 + index * 1000 + h % 1000;
    let mut key = Vec::with_capacity(9);
    key.push(table.prefix());
    key.extend_from_slice(&id.to_be_bytes());
    let h2 = splitmix64(h);
    let mut row = Vec::with_capacity(48);
    match table {
        SeedTable::Timeline1009 => {
            row.extend_from_slice(&id.to_le_bytes()); // uid
            row.push((h2 % 4) as u8); // vflag
                                      // status_id: a snowflake-like id (timestamp high bits, sequence low bits).
            let status_id = (1_600_000_000_000u64 + (h2 >> 8) % 100_000_000_000) << 22 | (h2 & 0x3f_ffff);
            row.extend_from_slice(&status_id.to_le_bytes());
            let sources = [1u32, 2, 3, 7, 11, 42, 100, 1024];
            row.extend_from_slice(&sources[(h2 >> 3) as usize % sources.len()].to_le_bytes()); // source
            row.extend_from_slice(&(((h2 >> 13) % 16) as u32).to_le_bytes()); // fflag
            row.push(((h2 >> 17) % 2) as u8); // mflag
        }
        SeedTable::UserSummary => {
            row.extend_from_slice(&id.to_le_bytes()); // user_id
            let weight = format!("{}.{}", 40 + h2 % 80, (h2 >> 7) % 10);
            let levels = ["bronze", "silver", "gold", "platinum", "diamond", "master"];
            let level = format!(
                "{}_{}",
                levels[(h2 >> 11) as usize % levels.len()],
                (h2 >> 14) % 10
            );
            let beat_rate = format!("{}.{:02}%", (h2 >> 20) % 100, (h2 >> 27) % 100);
            for s in [weight, level, beat_rate] {
                row.push(s.len() as u8);
                row.extend_from_slice(s.as_bytes());
            }
            row.extend_from_slice(&(((h2 >> 33) % 100) as u32).to_le_bytes()); // level_num
        }
    }
    (key, row)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_deterministic_and_distinct() {
        assert_eq!(random_key(7, 3), random_key(7, 3));
        let mut keys: Vec<_> = (0..10_000).map(|i| random_key(7, i)).collect();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), 10_000);
        assert_ne!(random_key(7, 3), random_key(8, 3));
    }

    #[test]
    fn values_are_half_compressible() {
        let v = half_compressible_value(1, 2);
        assert_eq!(v.len(), VALUE_LEN_BYTES);
        assert_eq!(&v[50..68], b"ftkv-bench-filler-");
        assert_ne!(
            half_compressible_value(1, 2)[..50],
            half_compressible_value(1, 3)[..50]
        );
    }

    #[test]
    fn seed_rows_have_the_table_shapes() {
        let (k, r) = seed_table_row(SeedTable::Timeline1009, 1, 5);
        assert_eq!(k.len(), 9);
        assert_eq!(k[0], 1);
        assert_eq!(r.len(), 8 + 1 + 8 + 4 + 4 + 1);
        assert_eq!(
            &r[..8],
            &u64::from_be_bytes(k[1..9].try_into().unwrap()).to_le_bytes()
        );
        let (k2, r2) = seed_table_row(SeedTable::UserSummary, 1, 5);
        assert_eq!(k2[0], 2);
        assert!(r2.len() > 20 && r2.len() < 50, "{}", r2.len());
        // Ids grow with the index, so distinct indices give distinct keys.
        assert!(seed_table_row(SeedTable::UserSummary, 1, 6).0 > k2);
    }
}
