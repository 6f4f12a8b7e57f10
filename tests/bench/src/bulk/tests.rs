//! Unit tests of `ftkv-bench bulk`'s generator and encoding.
#![allow(clippy::unwrap_used)]
use super::*;

#[test]
fn the_lines_are_those_of_gen_user_summary_py() {
    // `tests/bench/gen-user-summary.py 3`.
    let mut text = Vec::new();
    for i in 0..3 {
        user_summary_line(&mut text, i);
    }
    assert_eq!(
        String::from_utf8_lossy(&text),
        "13000000000\t72.2\tBronze I\t81.12%\t363\n\
         13000000003\t55.5\tDiamond V\t80.33%\t79\n\
         13000000006\t118.8\tGold III\t80.55%\t796\n"
    );
}

#[test]
fn a_line_encodes_as_the_loader_encodes_it() {
    let (key, value) = encode_line(b"13000000000\t72.2\tBronze I\t81.12%\t363").unwrap();
    let mut want_key = PREFIX.as_bytes().to_vec();
    want_key.push(0x15);
    want_key.extend_from_slice(&(13_000_000_000u64 ^ (1 << 63)).to_be_bytes());
    assert_eq!(key, want_key);
    assert_eq!(
        rows::decode_value(&value).unwrap(),
        vec![
            rows::Field::Bytes(b"72.2".to_vec()),
            rows::Field::Bytes(b"Bronze I".to_vec()),
            rows::Field::Bytes(b"81.12%".to_vec()),
            rows::Field::Int(363),
        ]
    );
    assert!(encode_line(b"1\t2").is_err());
    assert!(encode_line(b"x\t72.2\tBronze I\t81.12%\t363").is_err());
}

#[test]
fn the_file_and_the_put_rows_agree() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("us.tsv");
    let bytes = write_user_summary(&path, 1000).unwrap();
    let text = std::fs::read(&path).unwrap();
    assert_eq!(bytes, text.len() as u64);
    assert_eq!(text.iter().filter(|&&b| b == b'\n').count(), 1000);
    let (pairs, put_bytes) = read_pairs(&path, 10).unwrap();
    assert_eq!(pairs.len(), 10);
    let ten: usize = text
        .split_inclusive(|&b| b == b'\n')
        .take(10)
        .map(<[u8]>::len)
        .sum();
    assert_eq!(put_bytes, ten as u64);
    // Sorted by user_id, so keys ascend.
    assert!(pairs.windows(2).all(|w| w[0].0 < w[1].0));
    assert!(read_pairs(&path, 1001).is_err());
    assert_eq!(prefix_end(), b"user_summary0".to_vec());
}
