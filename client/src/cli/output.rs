//! Output formats of `ftkvctl` (`-w simple|json|table`, as etcdctl's `--write-out`) and the
//! rendering of keys and values (`--hex`).

use serde_json::{json, Value};

use crate::{KeyValue, Membership, NodeStatus};

/// How results are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Plain lines, etcdctl-like (key line, value line).
    Simple,
    /// One JSON document on stdout.
    Json,
    /// An ASCII table.
    Table,
}

/// How keys and values are rendered. Every rendering is lossless except `table` (a view for
/// humans):
///
/// - `simple` ([`Bytes::raw`]): with `--hex` lower-case hex, else the bytes verbatim (binary
///   values reach stdout byte for byte, e.g. `ftkvctl get k --print-value-only > file`).
/// - `json` ([`Bytes::insert_json`]): a field holds the text when the bytes are valid UTF-8 and
///   `--hex` is off; otherwise it holds lower-case hex and a sibling field `<name>_encoding` is
///   `"hex"` (e.g. `"value":"00ff","value_encoding":"hex"`).
/// - `table` ([`Bytes::show`]): hex with `--hex`, else text with each invalid UTF-8 byte shown as
///   `\xNN`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bytes {
    /// Print as lower-case hex.
    pub hex: bool,
}

impl Bytes {
    /// Renders one key or value as text for a table cell: hex with `--hex`, else UTF-8 text
    /// with each byte that is not valid UTF-8 written `\xNN`.
    pub fn show(&self, bytes: &[u8]) -> String {
        if self.hex {
            return super::hex::encode(bytes);
        }
        let mut out = String::with_capacity(bytes.len());
        for chunk in bytes.utf8_chunks() {
            out.push_str(chunk.valid());
            for b in chunk.invalid() {
                out.push_str(&format!("\\x{b:02x}"));
            }
        }
        out
    }

    /// The bytes of one key or value for `simple` output: hex text with `--hex`, else the bytes
    /// themselves, unchanged.
    pub fn raw<'a>(&self, bytes: &'a [u8]) -> std::borrow::Cow<'a, [u8]> {
        if self.hex {
            std::borrow::Cow::Owned(super::hex::encode(bytes).into_bytes())
        } else {
            std::borrow::Cow::Borrowed(bytes)
        }
    }

    /// Sets `obj[name]` to the bytes, losslessly: UTF-8 text when they are valid UTF-8 and
    /// `--hex` is off, else lower-case hex plus `obj["<name>_encoding"] = "hex"`.
    pub fn insert_json(&self, obj: &mut serde_json::Map<String, Value>, name: &str, bytes: &[u8]) {
        match std::str::from_utf8(bytes) {
            Ok(text) if !self.hex => {
                obj.insert(name.to_string(), Value::from(text));
            }
            _ => {
                obj.insert(name.to_string(), Value::from(super::hex::encode(bytes)));
                obj.insert(format!("{name}_encoding"), Value::from("hex"));
            }
        }
    }

    /// A JSON object of named byte fields (see [`Bytes::insert_json`]).
    pub fn json_object(&self, fields: &[(&str, &[u8])]) -> serde_json::Map<String, Value> {
        let mut obj = serde_json::Map::new();
        for (name, bytes) in fields {
            self.insert_json(&mut obj, name, bytes);
        }
        obj
    }
}

/// Joins byte lines with `\n` (no trailing newline), as `simple` output does.
pub fn join_lines<'a>(lines: impl IntoIterator<Item = std::borrow::Cow<'a, [u8]>>) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, line) in lines.into_iter().enumerate() {
        if i > 0 {
            out.push(b'\n');
        }
        out.extend_from_slice(&line);
    }
    out
}

/// Writes one line to stderr, ignoring failure (a closed stderr must not panic as `eprintln!`
/// does).
pub fn stderr_line(line: &str) {
    use std::io::Write;
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(line.as_bytes());
    let _ = err.write_all(b"\n");
}

/// Replaces control characters by `\xNN` so that a cell stays on one line and aligned.
fn escape_controls(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() {
            out.push_str(&format!("\\x{:02x}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}

/// Renders rows under headers as an ASCII table (`+---+` borders, etcdctl style).
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| r.iter().map(|c| escape_controls(c)).collect())
        .collect();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let border = {
        let mut s = String::from("+");
        for w in &widths {
            s.push_str(&"-".repeat(w + 2));
            s.push('+');
        }
        s
    };
    let line = |cells: Vec<&str>| {
        let mut s = String::from("|");
        for (i, w) in widths.iter().enumerate() {
            let cell = cells.get(i).copied().unwrap_or("");
            let pad = w.saturating_sub(cell.chars().count());
            s.push(' ');
            s.push_str(cell);
            s.push_str(&" ".repeat(pad + 1));
            s.push('|');
        }
        s
    };
    let mut out = vec![border.clone(), line(headers.to_vec()), border.clone()];
    for row in &rows {
        out.push(line(row.iter().map(String::as_str).collect()));
    }
    out.push(border);
    out.join("\n")
}

/// Key-value pairs in the chosen format: `simple` is raw bytes (key line, value line; values
/// are not escaped, so a value holding `\n` spans lines), `json` is
/// `{"count":N,"kvs":[{"key":..,"value":..}]}` (lossless, see [`Bytes`]), `table` is text.
pub fn kvs(format: Format, bytes: Bytes, pairs: &[KeyValue], keys_only: bool) -> Vec<u8> {
    match format {
        Format::Simple => {
            let mut lines = Vec::new();
            for kv in pairs {
                lines.push(bytes.raw(&kv.key));
                if !keys_only {
                    lines.push(bytes.raw(&kv.value));
                }
            }
            join_lines(lines)
        }
        Format::Json => {
            let items: Vec<Value> = pairs
                .iter()
                .map(|kv| {
                    if keys_only {
                        Value::Object(bytes.json_object(&[("key", &kv.key)]))
                    } else {
                        Value::Object(bytes.json_object(&[("key", &kv.key), ("value", &kv.value)]))
                    }
                })
                .collect();
            json!({ "count": pairs.len(), "kvs": items })
                .to_string()
                .into_bytes()
        }
        Format::Table => {
            let text = if keys_only {
                let rows: Vec<Vec<String>> = pairs.iter().map(|kv| vec![bytes.show(&kv.key)]).collect();
                table(&["KEY"], &rows)
            } else {
                let rows: Vec<Vec<String>> = pairs
                    .iter()
                    .map(|kv| vec![bytes.show(&kv.key), bytes.show(&kv.value)])
                    .collect();
                table(&["KEY", "VALUE"], &rows)
            };
            text.into_bytes()
        }
    }
}

/// The JSON object of one node's status. Field names are a contract that scripts rely on:
/// `id`, `endpoint`, `is_leader`, `leader_id`, `term`, `commit_index`, `applied_index`,
/// `engine` (more fields may be added, none removed).
pub fn status_json(s: &NodeStatus) -> Value {
    json!({
        "id": s.node_id,
        "endpoint": s.endpoint,
        "is_leader": s.is_leader,
        "leader_id": s.leader_id,
        "leader_endpoint": s.leader_endpoint,
        "term": s.term,
        "commit_index": s.commit_index,
        "applied_index": s.applied_index,
        "last_log_index": s.last_log_index,
        "engine": s.engine,
        "role": s.role,
        "data_size_bytes": s.data_size_bytes,
        "client_endpoint": s.client_endpoint,
        "ops_per_entry": s.ops_per_entry,
        "digest": s.digest,
        "version": s.version,
        "cluster_id": format!("{:016x}", s.cluster_id),
    })
}

/// Statuses of several nodes in the chosen format (JSON: one array).
pub fn statuses(format: Format, list: &[NodeStatus]) -> String {
    match format {
        Format::Json => Value::Array(list.iter().map(status_json).collect()).to_string(),
        Format::Simple => list
            .iter()
            .map(|s| {
                format!(
                    "{}, {}, {}, {}, {}, {}, {}, {}, {}, {}",
                    s.endpoint,
                    s.node_id,
                    s.version,
                    s.data_size_bytes,
                    s.is_leader,
                    s.role,
                    s.term,
                    s.commit_index,
                    s.applied_index,
                    s.engine
                )
            })
            .collect::<Vec<_>>()
            .join("\n"),
        Format::Table => {
            let rows: Vec<Vec<String>> = list
                .iter()
                .map(|s| {
                    vec![
                        s.endpoint.clone(),
                        s.node_id.to_string(),
                        s.version.clone(),
                        s.data_size_bytes.to_string(),
                        s.is_leader.to_string(),
                        s.role.clone(),
                        s.term.to_string(),
                        s.commit_index.to_string(),
                        s.applied_index.to_string(),
                        s.engine.clone(),
                    ]
                })
                .collect();
            table(
                &[
                    "ENDPOINT",
                    "ID",
                    "VERSION",
                    "DB SIZE (BYTES)",
                    "IS LEADER",
                    "ROLE",
                    "RAFT TERM",
                    "COMMIT INDEX",
                    "APPLIED INDEX",
                    "ENGINE",
                ],
                &rows,
            )
        }
    }
}

/// The membership in the chosen format.
pub fn membership(format: Format, m: &Membership) -> String {
    let role = |voter: bool| if voter { "voter" } else { "learner" };
    match format {
        Format::Json => {
            let members: Vec<Value> = m
                .members
                .iter()
                .map(|x| {
                    json!({
                        "id": x.id,
                        "client_endpoint": x.client_endpoint,
                        "peer_endpoint": x.peer_endpoint,
                        "is_voter": x.is_voter,
                        "is_leader": x.id == m.leader_id,
                    })
                })
                .collect();
            json!({ "leader_id": m.leader_id, "members": members }).to_string()
        }
        Format::Simple => m
            .members
            .iter()
            .map(|x| {
                format!(
                    "{}, {}, {}, {}, {}",
                    x.id,
                    role(x.is_voter),
                    x.client_endpoint,
                    x.peer_endpoint,
                    if x.id == m.leader_id { "leader" } else { "-" }
                )
            })
            .collect::<Vec<_>>()
            .join("\n"),
        Format::Table => {
            let rows: Vec<Vec<String>> = m
                .members
                .iter()
                .map(|x| {
                    vec![
                        x.id.to_string(),
                        role(x.is_voter).to_string(),
                        x.client_endpoint.clone(),
                        x.peer_endpoint.clone(),
                        (x.id == m.leader_id).to_string(),
                    ]
                })
                .collect();
            table(
                &["ID", "ROLE", "CLIENT ENDPOINT", "PEER ENDPOINT", "IS LEADER"],
                &rows,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_columns() {
        let t = table(&["A", "LONGER"], &[vec!["xyz".into(), "1".into()]]);
        let expected =
            "+-----+--------+\n| A   | LONGER |\n+-----+--------+\n| xyz | 1      |\n+-----+--------+";
        assert_eq!(t, expected);
    }

    #[test]
    fn table_escapes_control_characters() {
        let t = table(&["V"], &[vec!["a\u{3}\nb".into()]]);
        assert!(t.contains("| a\\x03\\x0ab |"), "{t}");
    }

    #[test]
    fn bytes_render_as_text_or_hex() {
        assert_eq!(Bytes { hex: false }.show(b"abc"), "abc");
        assert_eq!(Bytes { hex: true }.show(&[0, 255]), "00ff");
        assert_eq!(Bytes { hex: false }.show(&[0x61, 0xff]), "a\\xff");
        assert_eq!(
            Bytes { hex: false }.raw(&[0x61, 0xff, 0x00]).as_ref(),
            &[0x61, 0xff, 0x00]
        );
        assert_eq!(Bytes { hex: true }.raw(&[0x61, 0xff]).as_ref(), b"61ff");
    }

    #[test]
    fn json_fields_are_lossless() {
        let text = Bytes { hex: false };
        let obj = Value::Object(text.json_object(&[("key", b"k"), ("value", &[0xff, 0xfe, 0x00, 0x61])]));
        assert_eq!(obj["key"], "k");
        assert!(obj.get("key_encoding").is_none(), "{obj}");
        assert_eq!(obj["value"], "fffe0061");
        assert_eq!(obj["value_encoding"], "hex");
        let hex = Value::Object(Bytes { hex: true }.json_object(&[("key", b"k")]));
        assert_eq!(
            (hex["key"].as_str(), hex["key_encoding"].as_str()),
            (Some("6b"), Some("hex"))
        );
    }

    #[test]
    fn status_json_has_the_contract_fields() {
        let s = NodeStatus {
            node_id: 2,
            endpoint: "h:1".into(),
            is_leader: true,
            engine: "sled".into(),
            ..Default::default()
        };
        let v = status_json(&s);
        for field in [
            "id",
            "endpoint",
            "is_leader",
            "leader_id",
            "term",
            "commit_index",
            "applied_index",
            "engine",
        ] {
            assert!(v.get(field).is_some(), "missing {field}");
        }
        assert_eq!(v["id"], 2);
        assert_eq!(v["is_leader"], true);
        let arr: Value = serde_json::from_str(&statuses(Format::Json, &[s])).unwrap();
        assert_eq!(arr.as_array().map(Vec::len), Some(1));
    }

    #[test]
    fn kvs_formats() {
        let pairs = vec![KeyValue {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
        }];
        assert_eq!(kvs(Format::Simple, Bytes { hex: false }, &pairs, false), b"k\nv");
        assert_eq!(kvs(Format::Simple, Bytes { hex: true }, &pairs, true), b"6b");
        let binary = vec![KeyValue {
            key: vec![0xc3, 0x28],
            value: vec![0x00, 0xff, 0x0a],
        }];
        assert_eq!(
            kvs(Format::Simple, Bytes { hex: false }, &binary, false),
            [0xc3, 0x28, 0x0a, 0x00, 0xff, 0x0a]
        );
        let v: Value =
            serde_json::from_slice(&kvs(Format::Json, Bytes { hex: false }, &pairs, false)).unwrap();
        assert_eq!(v["count"], 1);
        assert_eq!(v["kvs"][0]["value"], "v");
    }
}
