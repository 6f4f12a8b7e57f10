//! The embedded phase of `ftkv-bench bulk`: the same TSV through the engine's bulk path alone,
//! in this process: [`ftkv_embedded::Db::bulk_load`] on a fresh fractal database (the node's
//! defaults: 256 MiB cache, zstd level 1, 64 MiB of sort memory), no network, no Raft, no
//! replica. Timed from opening the file to the end of `bulk_load`, which includes reading and
//! parsing every line, encoding the key and value exactly as `ftkvctl load` does
//! ([`super::encode_line`]), the sort (skipped for sorted input), the bottom-up build and the
//! final checkpoint (the load is durable when it returns). Afterwards the database is closed and
//! reopened and must hold exactly `--rows` keys under the prefix (a scan, page by page), and the
//! engine directory's size is measured.
//!
//! This is the figure to compare with the seed's single-server TokuDB loader (574,217 rows/s on
//! 8 cores): the cluster phase adds the client, the wire, three replicas and their fsyncs.

use std::io::BufRead as _;
use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use ftkv_embedded::{BulkLoadOptions, Db, EmbeddedOptions};
use ftkv_engine::EngineError;
use serde::Serialize;

/// One embedded run.
#[derive(Debug, Clone, Serialize)]
pub struct EmbeddedPhase {
    /// Rows loaded.
    pub rows: u64,
    /// From opening the file to the end of `bulk_load` (its checkpoint included), seconds.
    pub secs: f64,
    /// `rows / secs`.
    pub rows_per_sec: f64,
    /// Keys under the prefix after a close and reopen (equal to `rows`).
    pub keys: u64,
    /// Whether the engine found the input sorted (and skipped the sort).
    pub input_was_sorted: bool,
    /// Leaves built bottom-up (0: the rows went in as messages).
    pub leaves_built: u64,
    /// Sorted runs spilled to temporary files.
    pub runs_spilled: u64,
    /// Sum of the file lengths under the database directory after the close, bytes.
    pub disk_bytes: u64,
}

/// Loads the first `rows` lines of `tsv` into a fresh database under `dir` (which must not
/// exist yet or be empty) and checks it.
pub(crate) fn embedded_phase(tsv: &Path, rows: u64, dir: &Path) -> anyhow::Result<EmbeddedPhase> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let db = Db::open_real(dir, EmbeddedOptions::default())
        .with_context(|| format!("cannot open a database in {}", dir.display()))?;
    let started = Instant::now();
    let file = std::fs::File::open(tsv).with_context(|| format!("cannot open {}", tsv.display()))?;
    let mut reader = std::io::BufReader::with_capacity(1 << 20, file);
    let mut line = Vec::with_capacity(128);
    let mut number = 0u64;
    let mut lines = std::iter::from_fn(|| {
        if number == rows {
            return None;
        }
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) => None,
            Ok(_) => {
                number += 1;
                let text = line.strip_suffix(b"\n").unwrap_or(&line);
                Some(
                    super::encode_line(text)
                        .map_err(|e| EngineError::InvalidArgument(format!("line {number}: {e:#}"))),
                )
            }
            Err(e) => Some(Err(EngineError::InvalidArgument(format!(
                "cannot read {}: {e}",
                tsv.display()
            )))),
        }
    });
    let report = db
        .bulk_load(&mut lines, &BulkLoadOptions::default())
        .context("embedded bulk load")?;
    let secs = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        report.rows_written == rows,
        "the embedded load wrote {} rows of {rows} (the file has fewer lines?)",
        report.rows_written
    );
    db.close().context("closing the embedded database")?;

    let db = Db::open_real(dir, EmbeddedOptions::default())
        .with_context(|| format!("cannot reopen the database in {}", dir.display()))?;
    let keys = count_keys(&db)?;
    anyhow::ensure!(
        keys == rows,
        "the reopened embedded database holds {keys} keys under {}, expected {rows}",
        super::PREFIX
    );
    db.close().context("closing the embedded database")?;
    Ok(EmbeddedPhase {
        rows,
        secs,
        rows_per_sec: rows as f64 / secs.max(1e-9),
        keys,
        input_was_sorted: report.input_was_sorted,
        leaves_built: report.leaves_built,
        runs_spilled: report.runs_spilled,
        disk_bytes: super::dir_bytes(dir)?.0,
    })
}

/// Keys under the prefix, counted page by page.
fn count_keys(db: &Db) -> anyhow::Result<u64> {
    const PAGE: usize = 50_000;
    let end = super::prefix_end();
    let mut start = super::PREFIX.as_bytes().to_vec();
    let mut keys = 0u64;
    loop {
        let page = db.scan(&start, Some(&end), PAGE).context("embedded scan")?;
        keys += page.len() as u64;
        match page.last() {
            Some((last, _)) if page.len() == PAGE => {
                start.clone_from(last);
                start.push(0);
            }
            _ => return Ok(keys),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_phase_loads_every_row_and_counts_them_after_a_reopen() {
        let tmp = tempfile::tempdir().unwrap();
        let tsv = tmp.path().join("us.tsv");
        super::super::write_user_summary(&tsv, 30_000).unwrap();
        let phase = embedded_phase(&tsv, 20_000, &tmp.path().join("db")).unwrap();
        assert_eq!(phase.rows, 20_000);
        assert_eq!(phase.keys, 20_000);
        assert!(phase.input_was_sorted, "the generated file is sorted by user_id");
        assert!(
            phase.leaves_built > 0,
            "an empty database takes the bottom-up build"
        );
        assert!(phase.disk_bytes > 0);
    }

    #[test]
    fn a_malformed_line_fails_the_embedded_phase_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        let tsv = tmp.path().join("bad.tsv");
        std::fs::write(
            &tsv,
            "13000000000\t41.1\tGold III\t1.02%\t7\nnot-a-number\tx\ty\tz\t1\n",
        )
        .unwrap();
        let err = embedded_phase(&tsv, 2, &tmp.path().join("db")).unwrap_err();
        assert!(format!("{err:#}").contains("line 2"), "{err:#}");
    }
}
