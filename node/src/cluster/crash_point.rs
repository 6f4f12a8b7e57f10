//! TEST ONLY: named crash points, so tests can kill a node at an exact step of a multi-step
//! operation (the steps of a snapshot install) instead of at a random delay.
//!
//! Off unless the environment names a file in `FTKV_TEST_CRASH_POINT_FILE`. When the file holds
//! the name of the point being passed, the node removes the file (so the restarted node goes on)
//! and aborts at once: no destructor, no flush, no shutdown, like SIGKILL; in the lose-unsynced
//! test mode what was not fsynced is lost with the process memory.

/// Environment variable naming the crash-point file.
pub(crate) const CRASH_POINT_FILE_ENV: &str = "FTKV_TEST_CRASH_POINT_FILE";

/// Aborts the process if the crash-point file names `point`.
pub(crate) fn hit(point: &str) {
    let Some(path) = std::env::var_os(CRASH_POINT_FILE_ENV) else {
        return;
    };
    let Ok(wanted) = std::fs::read_to_string(&path) else {
        return;
    };
    if wanted.trim() == point {
        let _ = std::fs::remove_file(&path);
        eprintln!("ftkv TEST crash point {point}: aborting");
        std::process::abort();
    }
}
