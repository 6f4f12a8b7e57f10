//! Measures group commit on real files: N threads append concurrently, each waiting for its own
//! callback (like Raft followers and the leader waiting on their flush).
//!
//! Usage: `cargo run -p ftkv-log --release --example group_commit -- [threads] [appends_per_thread]
//! [payload_bytes] [dir]` (defaults 8, 1000, 128, a temporary directory).

use std::sync::{mpsc, Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use ftkv_log::{Log, LogOptions};
use ftkv_vfs::{RealVfs, Vfs};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize, default: u64| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(default);
    let threads = arg(1, 8);
    let per_thread = arg(2, 1000);
    let payload_bytes = arg(3, 128) as usize;
    let tmp = tempfile::tempdir()?;
    let dir = args
        .get(4)
        .map_or_else(|| tmp.path().to_path_buf(), std::path::PathBuf::from);
    let vfs: Arc<dyn Vfs> = RealVfs::new();
    let log = Log::open(vfs, &dir.join("log"), LogOptions::default())?;
    let next = Arc::new(Mutex::new(log.last_index().map_or(1, |l| l + 1)));
    let payload = Bytes::from(vec![0xA5u8; payload_bytes]);
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            let (log, next, payload) = (log.clone(), next.clone(), payload.clone());
            s.spawn(move || {
                for _ in 0..per_thread {
                    let (tx, rx) = mpsc::channel();
                    {
                        let mut n = next.lock().unwrap_or_else(|e| e.into_inner());
                        let cb = Box::new(move |r| {
                            let _ = tx.send(r);
                        });
                        if let Err(e) = log.append(vec![(*n, payload.clone())], cb) {
                            eprintln!("append failed: {e}");
                            return;
                        }
                        *n += 1;
                    }
                    match rx.recv() {
                        Ok(Ok(())) => {}
                        other => {
                            eprintln!("flush failed: {other:?}");
                            return;
                        }
                    }
                }
            });
        }
    });
    let secs = start.elapsed().as_secs_f64();
    let st = log.stats();
    println!(
        "threads {threads}: {} appends, {} fsyncs, {:.2} appends/fsync, {:.0} appends/s, {:.1} µs/fsync-round",
        st.append_calls,
        st.fsyncs,
        st.append_calls as f64 / st.fsyncs.max(1) as f64,
        st.append_calls as f64 / secs,
        secs * 1e6 / st.fsyncs.max(1) as f64,
    );
    Ok(())
}
