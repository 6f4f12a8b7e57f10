//! Cutting sorted entries into node- or basement-sized pieces.

use super::*;

/// Cuts entries with counted sizes `sizes` into consecutive index ranges of at most
/// `target_bytes` each (a single larger entry gets a range of its own).
pub(crate) fn chunk_ranges(sizes: &[usize], target_bytes: usize) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut cur_bytes = 0;
    for (i, &s) in sizes.iter().enumerate() {
        if i > start && cur_bytes + s > target_bytes {
            out.push(start..i);
            start = i;
            cur_bytes = 0;
        }
        cur_bytes += s;
    }
    if start < sizes.len() {
        out.push(start..sizes.len());
    }
    out
}

/// Cuts entries with counted sizes `sizes` into at most `pieces` consecutive, non-empty index
/// ranges of about equal bytes.
pub(crate) fn even_ranges(sizes: &[usize], pieces: usize) -> Vec<std::ops::Range<usize>> {
    let total: usize = sizes.iter().sum();
    let target = total.div_ceil(pieces.max(1)).max(1);
    let n = sizes.len();
    let mut out = Vec::new();
    let mut start = 0;
    let mut cur_bytes = 0;
    for (i, &s) in sizes.iter().enumerate() {
        cur_bytes += s;
        let remaining = n - i - 1;
        if cur_bytes >= target && remaining > 0 && out.len() + 1 < pieces {
            out.push(start..i + 1);
            start = i + 1;
            cur_bytes = 0;
        }
    }
    if start < n {
        out.push(start..n);
    }
    out
}

/// Moves `entries` into consecutive chunks along `ranges` (from [`chunk_ranges`] or
/// [`even_ranges`]).
pub(crate) fn cut_entries(
    entries: Vec<(Vec<u8>, Vec<u8>)>,
    ranges: Vec<std::ops::Range<usize>>,
) -> Vec<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut it = entries.into_iter();
    ranges
        .into_iter()
        .map(|r| it.by_ref().take(r.len()).collect())
        .collect()
}

/// Cuts sorted entries into chunks of at most `target_bytes` (counted sizes).
pub(crate) fn chunk_entries(
    entries: Vec<(Vec<u8>, Vec<u8>)>,
    target_bytes: usize,
) -> Vec<Vec<(Vec<u8>, Vec<u8>)>> {
    let sizes: Vec<usize> = entries.iter().map(entry_size).collect();
    let ranges = chunk_ranges(&sizes, target_bytes);
    cut_entries(entries, ranges)
}

/// Cuts sorted entries into at most `pieces` chunks of about equal bytes.
pub(crate) fn split_entries_even(
    entries: Vec<(Vec<u8>, Vec<u8>)>,
    pieces: usize,
) -> Vec<Vec<(Vec<u8>, Vec<u8>)>> {
    let sizes: Vec<usize> = entries.iter().map(entry_size).collect();
    let ranges = even_ranges(&sizes, pieces);
    cut_entries(entries, ranges)
}
