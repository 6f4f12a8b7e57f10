//! Helpers shared by the log's integration tests.
#![allow(dead_code, clippy::unwrap_used)]

use std::sync::mpsc;

use bytes::Bytes;
use ftkv_log::{Log, LogError};

/// Appends and blocks until the callback fires; returns the callback's result.
pub fn append_wait(log: &Log, records: Vec<(u64, Bytes)>) -> Result<(), LogError> {
    let (tx, rx) = mpsc::channel();
    log.append(
        records,
        Box::new(move |r| {
            let _ = tx.send(r);
        }),
    )?;
    rx.recv().unwrap()
}

/// Records `start..start+n` with payloads derived from the index.
pub fn records(start: u64, n: u64, size: usize) -> Vec<(u64, Bytes)> {
    (start..start + n).map(|i| (i, payload(i, size))).collect()
}

/// A deterministic payload for index `i`.
pub fn payload(i: u64, size: usize) -> Bytes {
    Bytes::from(
        (0..size)
            .map(|j| (i as usize * 31 + j * 7) as u8)
            .collect::<Vec<u8>>(),
    )
}

/// Every record the log holds.
pub fn read_all(log: &Log) -> Vec<(u64, Bytes)> {
    log.read_range(0, u64::MAX, usize::MAX).unwrap()
}
