//! Unit tests of the fault file system and the real one.
#![allow(clippy::unwrap_used)]

use super::*;

fn p(s: &str) -> PathBuf {
    PathBuf::from(s)
}

fn read_all(f: &dyn VfsFile) -> Vec<u8> {
    let len = f.len().unwrap() as usize;
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, 0).unwrap();
    buf
}

fn setup() -> (Arc<FaultVfs>, Arc<dyn VfsFile>) {
    let vfs = FaultVfs::new(7);
    vfs.create_dir_all(&p("/d")).unwrap();
    let f = vfs.open(&p("/d/a"), true).unwrap();
    vfs.sync_dir(&p("/d")).unwrap();
    (vfs, f)
}

#[test]
fn unsynced_data_is_dropped_and_synced_kept() {
    let (vfs, f) = setup();
    f.write_all_at(b"hello", 0).unwrap();
    f.sync_data().unwrap();
    f.write_all_at(b" world", 5).unwrap();
    assert_eq!(read_all(&*f), b"hello world");
    vfs.crash(false);
    assert!(f.len().is_err(), "old handles are stale after a crash");
    let f = vfs.open(&p("/d/a"), false).unwrap();
    assert_eq!(read_all(&*f), b"hello");
}

#[test]
fn unsynced_set_len_is_reverted() {
    let (vfs, f) = setup();
    f.write_all_at(&[1u8; 100], 0).unwrap();
    f.sync_data().unwrap();
    f.set_len(10).unwrap();
    assert_eq!(f.len().unwrap(), 10);
    vfs.crash(false);
    let f = vfs.open(&p("/d/a"), false).unwrap();
    assert_eq!(f.len().unwrap(), 100);
}

#[test]
fn created_file_without_dir_sync_vanishes() {
    let vfs = FaultVfs::new(1);
    vfs.create_dir_all(&p("/d")).unwrap();
    let f = vfs.open(&p("/d/new"), true).unwrap();
    f.write_all_at(b"x", 0).unwrap();
    f.sync_data().unwrap();
    assert!(vfs.exists(&p("/d/new")));
    vfs.crash(false);
    assert!(!vfs.exists(&p("/d/new")));
    assert!(vfs.open(&p("/d/new"), false).is_err());
    assert!(vfs.exists(&p("/d")), "directories are durable at once");
}

#[test]
fn unsynced_rename_is_forgotten_and_synced_rename_kept() {
    let (vfs, f) = setup();
    f.write_all_at(b"data", 0).unwrap();
    f.sync_data().unwrap();
    vfs.rename(&p("/d/a"), &p("/d/b")).unwrap();
    assert_eq!(vfs.list_dir(&p("/d")).unwrap(), vec![p("/d/b")]);
    vfs.crash(false);
    assert_eq!(vfs.list_dir(&p("/d")).unwrap(), vec![p("/d/a")]);

    vfs.rename(&p("/d/a"), &p("/d/b")).unwrap();
    vfs.sync_dir(&p("/d")).unwrap();
    vfs.crash(false);
    assert_eq!(vfs.list_dir(&p("/d")).unwrap(), vec![p("/d/b")]);
    let f = vfs.open(&p("/d/b"), false).unwrap();
    assert_eq!(read_all(&*f), b"data");
}

#[test]
fn rename_replaces_target_atomically() {
    let vfs = FaultVfs::new(3);
    vfs.create_dir_all(&p("/d")).unwrap();
    let old = vfs.open(&p("/d/meta"), true).unwrap();
    old.write_all_at(b"old", 0).unwrap();
    old.sync_data().unwrap();
    vfs.sync_dir(&p("/d")).unwrap();
    let tmp = vfs.open(&p("/d/meta.tmp"), true).unwrap();
    tmp.write_all_at(b"new", 0).unwrap();
    tmp.sync_data().unwrap();
    vfs.rename(&p("/d/meta.tmp"), &p("/d/meta")).unwrap();
    vfs.sync_dir(&p("/d")).unwrap();
    vfs.crash(true);
    assert_eq!(vfs.list_dir(&p("/d")).unwrap(), vec![p("/d/meta")]);
    let f = vfs.open(&p("/d/meta"), false).unwrap();
    assert_eq!(read_all(&*f), b"new");
}

#[test]
fn unsynced_remove_is_forgotten() {
    let (vfs, f) = setup();
    f.write_all_at(b"keep", 0).unwrap();
    f.sync_data().unwrap();
    vfs.remove_file(&p("/d/a")).unwrap();
    assert!(!vfs.exists(&p("/d/a")));
    assert_eq!(read_all(&*f), b"keep", "open handles survive unlink");
    vfs.crash(false);
    assert!(vfs.exists(&p("/d/a")));
    vfs.remove_file(&p("/d/a")).unwrap();
    vfs.sync_dir(&p("/d")).unwrap();
    vfs.crash(false);
    assert!(!vfs.exists(&p("/d/a")));
}

#[test]
fn torn_write_keeps_a_sector_prefix_or_garbles_last_sector() {
    let mut saw_prefix_cut = false;
    let mut saw_garbage = false;
    let mut saw_none = false;
    for seed in 0..200 {
        let vfs = FaultVfs::new(seed);
        vfs.create_dir_all(&p("/d")).unwrap();
        let f = vfs.open(&p("/d/a"), true).unwrap();
        vfs.sync_dir(&p("/d")).unwrap();
        f.write_all_at(&[0xAAu8; 1000], 0).unwrap();
        f.sync_data().unwrap();
        f.write_all_at(&[0x11u8; 500], 1000).unwrap(); // dropped: not the last write
        f.write_all_at(&[0xBBu8; 2000], 1000).unwrap(); // torn
        vfs.crash(true);
        let f = vfs.open(&p("/d/a"), false).unwrap();
        let img = read_all(&*f);
        assert_eq!(&img[..1000], &[0xAAu8; 1000][..], "synced bytes never change");
        let len = img.len();
        if len == 1000 {
            saw_none = true;
        } else if len < 3000 {
            assert_eq!(len % 512, 0, "prefix cut at a sector boundary, got {len}");
            assert!(img[1000..].iter().all(|&b| b == 0xBB));
            saw_prefix_cut = true;
        } else {
            assert_eq!(len, 3000);
            // Bytes before the last sector (2560..3000) are intact; the earlier 0x11 write is gone.
            assert!(img[1000..2560].iter().all(|&b| b == 0xBB));
            if img[2560..].iter().any(|&b| b != 0xBB) {
                saw_garbage = true;
            }
        }
    }
    assert!(saw_prefix_cut && saw_garbage && saw_none);
}

#[test]
fn torn_crash_without_pending_writes_is_clean() {
    let (vfs, f) = setup();
    f.write_all_at(b"abc", 0).unwrap();
    f.sync_data().unwrap();
    vfs.crash(true);
    let f = vfs.open(&p("/d/a"), false).unwrap();
    assert_eq!(read_all(&*f), b"abc");
}

#[test]
fn fail_after_trips_every_operation_until_crash() {
    let (vfs, f) = setup();
    vfs.fail_after(Some(2));
    f.write_all_at(b"a", 0).unwrap();
    f.sync_data().unwrap();
    assert!(f.write_all_at(b"b", 1).is_err());
    assert!(vfs.is_tripped());
    let mut buf = [0u8; 1];
    assert!(f.read_at(&mut buf, 0).is_err(), "reads fail too once tripped");
    assert!(f.sync_data().is_err());
    vfs.crash(false);
    assert!(!vfs.is_tripped());
    let f = vfs.open(&p("/d/a"), false).unwrap();
    assert_eq!(read_all(&*f), b"a");
}

#[test]
fn crash_point_counts_mutations() {
    let (vfs, f) = setup();
    let base = vfs.op_count();
    f.write_all_at(b"12", 0).unwrap();
    f.sync_data().unwrap();
    assert_eq!(vfs.op_count(), base + 2);
    let mut buf = [0u8; 2];
    f.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(vfs.op_count(), base + 2, "reads are not counted");
    vfs.set_crash_point(Some(base + 3));
    f.write_all_at(b"3", 2).unwrap();
    assert!(f.sync_data().is_err());
    vfs.crash(false);
    let f = vfs.open(&p("/d/a"), false).unwrap();
    assert_eq!(read_all(&*f), b"12");
}

#[test]
fn punch_hole_zeroes_and_keeps_size() {
    let (_vfs, f) = setup();
    f.write_all_at(&[9u8; 100], 0).unwrap();
    f.punch_hole(10, 1000).unwrap();
    let img = read_all(&*f);
    assert_eq!(img.len(), 100);
    assert!(img[..10].iter().all(|&b| b == 9));
    assert!(img[10..].iter().all(|&b| b == 0));
}

#[test]
fn read_exact_past_end_is_unexpected_eof() {
    let (_vfs, f) = setup();
    f.write_all_at(b"ab", 0).unwrap();
    let mut buf = [0u8; 4];
    let err = f.read_exact_at(&mut buf, 0).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    assert_eq!(f.read_at(&mut buf, 10).unwrap(), 0);
}

#[test]
fn inject_bytes_plants_durable_corruption() {
    let (vfs, f) = setup();
    f.write_all_at(b"good", 0).unwrap();
    f.sync_data().unwrap();
    vfs.inject_bytes(&p("/d/a"), 1, b"X").unwrap();
    vfs.crash(false);
    let f = vfs.open(&p("/d/a"), false).unwrap();
    assert_eq!(read_all(&*f), b"gXod");
    assert_eq!(vfs.durable_len(&p("/d/a")), Some(4));
}

#[test]
fn real_vfs_round_trip_and_punch_hole() {
    let dir = tempfile::tempdir().unwrap();
    let vfs = RealVfs::new();
    let sub = dir.path().join("x");
    vfs.create_dir_all(&sub).unwrap();
    let path = sub.join("f");
    assert!(vfs.open(&path, false).is_err());
    let f = vfs.open(&path, true).unwrap();
    f.write_all_at(&[5u8; 16384], 0).unwrap();
    f.sync_data().unwrap();
    f.punch_hole(4096, 8192).unwrap();
    let img = read_all(&*f);
    assert_eq!(img.len(), 16384);
    assert!(img[..4096].iter().all(|&b| b == 5));
    assert!(img[4096..12288].iter().all(|&b| b == 0));
    assert!(img[12288..].iter().all(|&b| b == 5));
    f.set_len(100).unwrap();
    assert_eq!(f.len().unwrap(), 100);
    vfs.rename(&path, &sub.join("g")).unwrap();
    vfs.sync_dir(&sub).unwrap();
    vfs.create_dir_all(&sub.join("nested")).unwrap();
    assert_eq!(vfs.list_dir(&sub).unwrap(), vec![sub.join("g")]);
    vfs.remove_file(&sub.join("g")).unwrap();
    assert!(!vfs.exists(&sub.join("g")));
}

#[cfg(target_os = "linux")]
#[test]
fn transparent_huge_pages_are_off_after_the_call() {
    // The process flag itself (PR_GET_THP_DISABLE), which also holds on kernels without THP.
    // Other tests in this binary never turn it on, so it starts off unless inherited.
    crate::disable_transparent_huge_pages().unwrap();
    assert!(crate::transparent_huge_pages_disabled().unwrap());
}

#[test]
fn a_full_disk_fails_growth_with_enospc_until_space_is_freed() {
    let vfs = FaultVfs::new(1);
    vfs.create_dir_all(&p("/d")).unwrap();
    vfs.set_capacity(Some(1000));
    let a = vfs.open(&p("/d/a"), true).unwrap();
    a.write_all_at(&[1u8; 600], 0).unwrap();
    let b = vfs.open(&p("/d/b"), true).unwrap();
    let err = b.write_all_at(&[2u8; 500], 0).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
    assert_eq!(err.kind(), std::io::ErrorKind::StorageFull);
    assert_eq!(b.len().unwrap(), 0, "a refused write changes nothing");
    assert_eq!(b.set_len(500).unwrap_err().raw_os_error(), Some(libc::ENOSPC));
    // Overwriting in place needs no space; the fault is not sticky.
    a.write_all_at(&[3u8; 600], 0).unwrap();
    b.write_all_at(&[2u8; 400], 0).unwrap();
    assert_eq!(vfs.used_bytes(), 1000);
    // Freeing space (a removed file no longer counts) lets growth go on.
    vfs.remove_file(&p("/d/a")).unwrap();
    b.write_all_at(&[2u8; 500], 400).unwrap();
    assert_eq!(vfs.used_bytes(), 900);
    vfs.set_capacity(None);
    b.set_len(10_000).unwrap();
}
