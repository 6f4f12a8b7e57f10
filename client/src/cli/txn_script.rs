//! The `ftkvctl txn` script: compares, a blank line, success ops, a blank line, failure ops.
//!
//! Modelled on etcdctl's interactive `txn` (compares such as `value("k") = "v"`, then the
//! success and failure requests, each section ended by an empty line). Example:
//!
//! ```text
//! # compares: all must hold (none = always true)
//! value("user/1") = "alice"
//! exists("lock")
//!
//! put user/1 bob
//! add visits 1
//! get user/1
//!
//! get user/1
//! ```
//!
//! Compare lines: `value(K) OP V` with OP one of `=`, `==`, `!=`, `>`, `<` (byte-wise),
//! `exists(K)`, `!exists(K)` or `absent(K)`.
//! Op lines: `put K V`, `del K` (or `delete`), `get K`, `add K N` (i64 counter),
//! `append K V`, `set-if-absent K V`, `max K V`, `del-range START END` (`""` = unbounded).
//! Keys and values are bare words or double-quoted strings with escapes `\"`, `\\`, `\n`, `\t`,
//! `\xHH`. Lines starting with `#` are comments (not section breaks). With `--hex` every key
//! and value is read as hex. The first blank line ends the compares, the second the success
//! ops; a script may stop after any section.

use crate::{Compare, CompareResult, CompareTarget, Txn, TxnOp, UpsertOp};

/// A malformed script: the 1-based line and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("txn script line {line}: {message}")]
pub struct ScriptError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

/// Parses a txn script (see the module docs). `hex` reads keys and values as hex.
pub fn parse(script: &str, hex: bool) -> Result<Txn, ScriptError> {
    let mut txn = Txn::default();
    let mut section = 0usize; // 0 compares, 1 success, 2 failure, 3 past the end
    let mut saw_content = false;
    for (index, raw) in script.lines().enumerate() {
        let line_no = index + 1;
        let line = raw.trim();
        if line.starts_with('#') {
            continue;
        }
        if line.is_empty() {
            section += 1;
            continue;
        }
        saw_content = true;
        let err = |message: String| ScriptError {
            line: line_no,
            message,
        };
        match section {
            0 => txn.compares.push(parse_compare(line, hex).map_err(err)?),
            1 => txn.success.push(parse_op(line, hex).map_err(err)?),
            2 => txn.failure.push(parse_op(line, hex).map_err(err)?),
            _ => {
                return Err(err(
                    "unexpected line after the failure ops (a script has three sections: compares, success \
                     ops, failure ops, separated by one blank line each)"
                        .to_string(),
                ))
            }
        }
    }
    if !saw_content {
        return Err(ScriptError {
            line: 1,
            message: "empty txn script".to_string(),
        });
    }
    Ok(txn)
}

/// A token of a compare line.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    /// A bare word, or the bytes of a quoted string (quoted = true).
    Text {
        bytes: Vec<u8>,
        quoted: bool,
    },
    LParen,
    RParen,
    Bang,
    /// `=`, `==`, `!=`, `>`, `<`.
    Cmp(CompareResult),
}

/// Reads a double-quoted string starting after the opening quote, as bytes: typed characters
/// in UTF-8, `\xHH` escapes as single raw bytes.
fn read_quoted(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut utf8 = [0u8; 4];
    loop {
        match chars.next() {
            None => return Err("unterminated string (missing closing \")".to_string()),
            Some('"') => return Ok(out),
            Some('\\') => match chars.next() {
                Some('"') => out.push(b'"'),
                Some('\\') => out.push(b'\\'),
                Some('n') => out.push(b'\n'),
                Some('t') => out.push(b'\t'),
                Some('x') => {
                    let hi = chars.next().and_then(|c| c.to_digit(16));
                    let lo = chars.next().and_then(|c| c.to_digit(16));
                    match (hi, lo) {
                        // Two hex digits: a value below 256, so the narrowing is exact.
                        (Some(h), Some(l)) => out.push((h * 16 + l) as u8),
                        _ => return Err("\\x must be followed by two hex digits".to_string()),
                    }
                }
                Some(c) => return Err(format!("unknown escape \\{c}")),
                None => return Err("unterminated string (ends in \\)".to_string()),
            },
            Some(c) => out.extend_from_slice(c.encode_utf8(&mut utf8).as_bytes()),
        }
    }
}

fn lex_compare(line: &str) -> Result<Vec<Token>, String> {
    let mut tokens = Vec::new();
    let mut chars = line.chars().peekable();
    while let Some(&c) = chars.peek() {
        match c {
            c if c.is_whitespace() => {
                chars.next();
            }
            '(' => {
                chars.next();
                tokens.push(Token::LParen);
            }
            ')' => {
                chars.next();
                tokens.push(Token::RParen);
            }
            '"' => {
                chars.next();
                tokens.push(Token::Text {
                    bytes: read_quoted(&mut chars)?,
                    quoted: true,
                });
            }
            '=' => {
                chars.next();
                if chars.peek() == Some(&'=') {
                    chars.next();
                }
                tokens.push(Token::Cmp(CompareResult::Equal));
            }
            '!' => {
                chars.next();
                if chars.peek() == Some(&'=') {
                    chars.next();
                    tokens.push(Token::Cmp(CompareResult::NotEqual));
                } else {
                    tokens.push(Token::Bang);
                }
            }
            '>' => {
                chars.next();
                tokens.push(Token::Cmp(CompareResult::Greater));
            }
            '<' => {
                chars.next();
                tokens.push(Token::Cmp(CompareResult::Less));
            }
            _ => {
                let mut word = String::new();
                while let Some(&c) = chars.peek() {
                    if c.is_whitespace() || "()\"=!<>".contains(c) {
                        break;
                    }
                    word.push(c);
                    chars.next();
                }
                tokens.push(Token::Text {
                    bytes: word.into_bytes(),
                    quoted: false,
                });
            }
        }
    }
    Ok(tokens)
}

/// Splits an op line into words: bare words or double-quoted strings.
fn lex_words(line: &str) -> Result<Vec<Vec<u8>>, String> {
    let mut words = Vec::new();
    let mut chars = line.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
        } else if c == '"' {
            chars.next();
            words.push(read_quoted(&mut chars)?);
            if chars.peek().is_some_and(|c| !c.is_whitespace()) {
                return Err("a quoted string must be followed by a space or the end of the line".to_string());
            }
        } else {
            let mut word = String::new();
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                if c == '"' {
                    return Err(format!("unexpected quote inside the word {word:?}"));
                }
                word.push(c);
                chars.next();
            }
            words.push(word.into_bytes());
        }
    }
    Ok(words)
}

/// The bytes of a key or value: hex-decoded with `--hex`, else as written.
fn to_bytes(word: &[u8], hex: bool) -> Result<Vec<u8>, String> {
    if hex {
        let text = std::str::from_utf8(word).map_err(|_| "hex text must be ASCII".to_string())?;
        return super::hex::decode(text).map_err(|e| e.to_string());
    }
    Ok(word.to_vec())
}

fn parse_compare(line: &str, hex: bool) -> Result<Compare, String> {
    let tokens = lex_compare(line)?;
    let usage = "expected a compare: value(\"k\") = \"v\" (or ==, !=, >, <), exists(\"k\"), !exists(\"k\") \
                 or absent(\"k\")";
    let (negated, rest) = match tokens.split_first() {
        Some((Token::Bang, rest)) => (true, rest),
        _ => (false, tokens.as_slice()),
    };
    let [Token::Text {
        bytes: func,
        quoted: false,
    }, Token::LParen, Token::Text { bytes: key, .. }, Token::RParen, tail @ ..] = rest
    else {
        return Err(usage.to_string());
    };
    let func = String::from_utf8_lossy(func);
    let key = to_bytes(key, hex)?;
    if key.is_empty() {
        return Err("empty key in compare".to_string());
    }
    match (func.as_ref(), negated, tail) {
        ("exists", neg, []) => Ok(Compare {
            key,
            target: CompareTarget::Exists,
            result: if neg {
                CompareResult::NotEqual
            } else {
                CompareResult::Equal
            },
            value: Vec::new(),
        }),
        ("absent", false, []) => Ok(Compare {
            key,
            target: CompareTarget::Exists,
            result: CompareResult::NotEqual,
            value: Vec::new(),
        }),
        ("value", false, [Token::Cmp(result), Token::Text { bytes, .. }]) => Ok(Compare {
            key,
            target: CompareTarget::Value,
            result: *result,
            value: to_bytes(bytes, hex)?,
        }),
        ("value", false, [Token::Cmp(_)]) => Err("missing operand after the comparison operator".to_string()),
        ("value", false, []) => {
            Err("value(...) needs an operator and an operand, e.g. value(\"k\") = \"v\"".into())
        }
        ("value" | "exists" | "absent", _, _) => Err(format!("unexpected tokens after {func}(...); {usage}")),
        (other, _, _) => Err(format!("unknown compare target {other:?}; {usage}")),
    }
}

fn parse_op(line: &str, hex: bool) -> Result<TxnOp, String> {
    let words = lex_words(line)?;
    let Some((verb, args)) = words.split_first() else {
        return Err("empty op".to_string());
    };
    let verb = String::from_utf8_lossy(verb);
    let bytes = |word: &Vec<u8>| to_bytes(word, hex);
    let want = |n: usize, form: &str| -> Result<(), String> {
        if args.len() == n {
            Ok(())
        } else {
            Err(format!(
                "{verb} takes {n} argument(s): {form}; got {}",
                args.len()
            ))
        }
    };
    let key = |word: &Vec<u8>| -> Result<Vec<u8>, String> {
        let k = bytes(word)?;
        if k.is_empty() {
            Err("empty key".to_string())
        } else {
            Ok(k)
        }
    };
    match verb.as_ref() {
        "put" => {
            want(2, "put KEY VALUE")?;
            Ok(TxnOp::Put {
                key: key(&args[0])?,
                value: bytes(&args[1])?,
            })
        }
        "del" | "delete" => {
            want(1, "del KEY")?;
            Ok(TxnOp::Delete { key: key(&args[0])? })
        }
        "get" => {
            want(1, "get KEY")?;
            Ok(TxnOp::Get { key: key(&args[0])? })
        }
        "add" => {
            want(2, "add KEY N")?;
            let text = String::from_utf8_lossy(&args[1]);
            let n: i64 = text
                .parse()
                .map_err(|_| format!("add needs an integer, got {text:?}"))?;
            Ok(TxnOp::Upsert {
                key: key(&args[0])?,
                op: UpsertOp::Add(n),
            })
        }
        "append" => {
            want(2, "append KEY VALUE")?;
            Ok(TxnOp::Upsert {
                key: key(&args[0])?,
                op: UpsertOp::Append(bytes(&args[1])?),
            })
        }
        "set-if-absent" => {
            want(2, "set-if-absent KEY VALUE")?;
            Ok(TxnOp::Upsert {
                key: key(&args[0])?,
                op: UpsertOp::SetIfAbsent(bytes(&args[1])?),
            })
        }
        "max" => {
            want(2, "max KEY VALUE")?;
            Ok(TxnOp::Upsert {
                key: key(&args[0])?,
                op: UpsertOp::Max(bytes(&args[1])?),
            })
        }
        "del-range" => {
            want(2, "del-range START END")?;
            Ok(TxnOp::DeleteRange {
                start: bytes(&args[0])?,
                end: bytes(&args[1])?,
            })
        }
        other => Err(format!(
            "unknown op {other:?}; expected put, del, get, add, append, set-if-absent, max or del-range"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_script() {
        let script =
            "# guard\nvalue(\"user/1\") = \"alice\"\nexists(lock)\n!exists(\"gone\")\nvalue(n) > 5\n\n\
                      put user/1 bob\nadd visits -3\nget \"user/1\"\n\nget user/1\ndel-range a \"\"\n";
        let t = parse(script, false).unwrap();
        assert_eq!(
            t.compares,
            vec![
                Compare::value("user/1", CompareResult::Equal, "alice"),
                Compare::exists("lock"),
                Compare::absent("gone"),
                Compare::value("n", CompareResult::Greater, "5"),
            ]
        );
        assert_eq!(
            t.success,
            vec![
                TxnOp::Put {
                    key: b"user/1".to_vec(),
                    value: b"bob".to_vec()
                },
                TxnOp::Upsert {
                    key: b"visits".to_vec(),
                    op: UpsertOp::Add(-3)
                },
                TxnOp::Get {
                    key: b"user/1".to_vec()
                },
            ]
        );
        assert_eq!(
            t.failure,
            vec![
                TxnOp::Get {
                    key: b"user/1".to_vec()
                },
                TxnOp::DeleteRange {
                    start: b"a".to_vec(),
                    end: vec![]
                }
            ]
        );
    }

    #[test]
    fn operators_and_no_compares() {
        let t = parse("value(k) != v\nvalue(k) == v\nvalue(k)<v\nabsent(k)\n", false).unwrap();
        let results: Vec<_> = t.compares.iter().map(|c| c.result).collect();
        assert_eq!(
            results,
            vec![
                CompareResult::NotEqual,
                CompareResult::Equal,
                CompareResult::Less,
                CompareResult::NotEqual
            ]
        );
        assert!(t.success.is_empty() && t.failure.is_empty());
        // Leading blank line: no compares, straight to success ops.
        let t = parse(
            "\nput a 1\nappend a \"x y\"\nset-if-absent b 2\nmax c zz\ndel a\n",
            false,
        )
        .unwrap();
        assert!(t.compares.is_empty());
        assert_eq!(t.success.len(), 5);
        assert_eq!(
            t.success[1],
            TxnOp::Upsert {
                key: b"a".to_vec(),
                op: UpsertOp::Append(b"x y".to_vec())
            }
        );
    }

    #[test]
    fn escapes_and_hex() {
        let t = parse("\nput \"a\\\"b\" \"\\x00\\xff\"\n", false).unwrap();
        assert_eq!(
            t.success[0],
            TxnOp::Put {
                key: b"a\"b".to_vec(),
                value: vec![0x00, 0xff]
            }
        );
        let t = parse("value(\"6b\") = 0x76\n\nput 6b 00ff\n", true).unwrap();
        assert_eq!(t.compares[0], Compare::value("k", CompareResult::Equal, "v"));
        assert_eq!(
            t.success[0],
            TxnOp::Put {
                key: b"k".to_vec(),
                value: vec![0x00, 0xff]
            }
        );
        // Non-ASCII text stays UTF-8, also when every char is below U+0100.
        let t = parse("\nput k \"héllo\"\n", false).unwrap();
        assert_eq!(
            t.success[0],
            TxnOp::Put {
                key: b"k".to_vec(),
                value: "héllo".as_bytes().to_vec()
            }
        );
        let t = parse("\nput k \"é\\xe9\"\n", false).unwrap();
        assert_eq!(
            t.success[0],
            TxnOp::Put {
                key: b"k".to_vec(),
                value: vec![0xc3, 0xa9, 0xe9]
            }
        );
        let t = parse("\nput k \"héllo €\"\n", false).unwrap();
        assert_eq!(
            t.success[0],
            TxnOp::Put {
                key: b"k".to_vec(),
                value: "héllo €".as_bytes().to_vec()
            }
        );
    }

    #[test]
    fn trailing_blank_lines_are_fine() {
        let t = parse("exists(a)\n\nput a 1\n\ndel a\n\n\n", false).unwrap();
        assert_eq!(t.failure, vec![TxnOp::Delete { key: b"a".to_vec() }]);
    }

    fn err_line(script: &str) -> (usize, String) {
        let e = parse(script, false).unwrap_err();
        assert!(
            e.to_string().starts_with(&format!("txn script line {}:", e.line)),
            "{e}"
        );
        (e.line, e.message)
    }

    #[test]
    fn malformed_scripts_name_the_line() {
        let (l, m) = err_line("value(\"k\") = \"v\"\nvalu(k) = v\n");
        assert_eq!(l, 2);
        assert!(m.contains("unknown compare target"), "{m}");
        let (l, m) = err_line("value(\"k\" = v\n");
        assert_eq!(l, 1);
        assert!(m.contains("expected a compare"), "{m}");
        let (l, m) = err_line("value(k) =\n");
        assert_eq!(l, 1);
        assert!(m.contains("missing operand"), "{m}");
        let (l, m) = err_line("exists(k)\n\nput k\n");
        assert_eq!(l, 3);
        assert!(m.contains("put takes 2"), "{m}");
        let (l, m) = err_line("\n\nfrob k\n");
        assert_eq!(l, 3);
        assert!(m.contains("unknown op"), "{m}");
        let (l, m) = err_line("\nput k \"unterminated\n");
        assert_eq!(l, 2);
        assert!(m.contains("unterminated"), "{m}");
        let (l, m) = err_line("\nadd k five\n");
        assert_eq!(l, 2);
        assert!(m.contains("integer"), "{m}");
        let (l, m) = err_line("a(k)\n\nput a 1\n\ndel a\n\nput b 2\n");
        assert_eq!(l, 1, "{m}");
        let (l, m) = err_line("exists(a)\n\nput a 1\n\ndel a\n\nput b 2\n");
        assert_eq!(l, 7);
        assert!(m.contains("three sections"), "{m}");
        let (l, m) = err_line("\nput \"\" v\n");
        assert_eq!(l, 2);
        assert!(m.contains("empty key"), "{m}");
        let (_, m) = err_line("\n# only a comment\n\n");
        assert!(m.contains("empty"), "{m}");
        let (l, m) = err_line("\nput k \"a\"b\n");
        assert_eq!(l, 2, "{m}");
        let (l, m) = err_line("\nput \"\\q\" v\n");
        assert_eq!(l, 2);
        assert!(m.contains("unknown escape"), "{m}");
    }

    #[test]
    fn malformed_hex_names_the_line() {
        let e = parse("\nput 6b zz\n", true).unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.message.contains("non-hex"), "{}", e.message);
    }
}
