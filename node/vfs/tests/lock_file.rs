//! `try_lock_file`: the data directory lock of the node and of embedded mode.
#![allow(clippy::unwrap_used)]

use ftkv_vfs::{try_lock_file, FileLock};

#[test]
fn a_held_lock_file_is_refused_with_the_holders_pid_and_free_again_once_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("LOCK");
    let FileLock::Locked(first) = try_lock_file(&path).unwrap() else {
        panic!("a fresh lock file must lock");
    };
    // A second open file description (as another process would have) is refused.
    match try_lock_file(&path).unwrap() {
        FileLock::HeldBy(holder) => assert_eq!(holder, std::process::id().to_string()),
        FileLock::Locked(_) => panic!("the lock was taken twice"),
    }
    drop(first);
    assert!(matches!(try_lock_file(&path).unwrap(), FileLock::Locked(_)));
    // A lock file in a missing directory is an error, not a panic.
    assert!(try_lock_file(&dir.path().join("missing/LOCK")).is_err());
}
