//! Snapshots of server replies, committed as text under `tests/fixtures/`.
//!
//! A reply is rendered one value a line, indented by depth, so that a change
//! shows as a legible line diff: a map's entry as `name: value`, an array's
//! item as `- value`, a set's as `+ value`, a string in Rust's debug quoting,
//! an integer bare, an error as `(error) text`, an empty container as `[]` or
//! `{}`. A container opens on its own line (`name:` or `-`) and its items
//! follow, two spaces deeper.
//!
//! [`check`] compares a rendering with its fixture. With
//! `XCLOAK_UPDATE_SNAPSHOTS=1` it writes the fixture instead (then review the
//! diff with `git diff tests/fixtures/`). On a mismatch it writes the live
//! rendering beside the build (`target/snapshots/NAME`) and fails with the
//! first differing lines and the `diff` command that shows them all.

use std::fmt::Write;
use std::path::{Path, PathBuf};

use redis::Value;

/// Renders `value` at `depth` (two spaces a level), each line ending in `\n`.
pub fn render(value: &Value, depth: usize, out: &mut String) {
    let pad = "  ".repeat(depth);
    if let Some(text) = scalar(value) {
        writeln!(out, "{pad}{text}").unwrap();
        return;
    }
    match value {
        Value::Map(entries) => {
            for (name, item) in entries {
                let name = match name {
                    Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                    Value::SimpleString(text) => text.clone(),
                    other => scalar(other).unwrap_or_else(|| format!("{other:?}")),
                };
                match scalar(item) {
                    Some(text) => writeln!(out, "{pad}{name}: {text}").unwrap(),
                    None => {
                        writeln!(out, "{pad}{name}:").unwrap();
                        render(item, depth + 1, out);
                    }
                }
            }
        }
        Value::Array(items) | Value::Set(items) => {
            let bullet = if matches!(value, Value::Set(_)) { '+' } else { '-' };
            for item in items {
                match scalar(item) {
                    Some(text) => writeln!(out, "{pad}{bullet} {text}").unwrap(),
                    None => {
                        writeln!(out, "{pad}{bullet}").unwrap();
                        render(item, depth + 1, out);
                    }
                }
            }
        }
        other => writeln!(out, "{pad}{other:?}").unwrap(),
    }
}

/// One line for a value that is not a container.
fn scalar(value: &Value) -> Option<String> {
    Some(match value {
        Value::Nil => "(nil)".to_string(),
        Value::Int(n) => n.to_string(),
        Value::BulkString(bytes) => format!("{:?}", String::from_utf8_lossy(bytes)),
        Value::SimpleString(text) => format!("{text:?}"),
        Value::VerbatimString { text, .. } => format!("{text:?}"),
        Value::Okay => "OK".to_string(),
        Value::Boolean(b) => b.to_string(),
        Value::Double(d) => d.to_string(),
        Value::ServerError(error) => format!("(error) {error:?}"),
        Value::Array(items) | Value::Set(items) if items.is_empty() => "[]".to_string(),
        Value::Map(entries) if entries.is_empty() => "{}".to_string(),
        _ => return None,
    })
}

fn fixture_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

/// Compares `live` with the committed `tests/fixtures/NAME` (its lines that
/// start with `#` are comments, not compared), or rewrites it under
/// `XCLOAK_UPDATE_SNAPSHOTS=1`, keeping its leading comment.
pub fn check(name: &str, live: &str) {
    let path = fixture_path(name);
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    let header: String = committed
        .lines()
        .take_while(|l| l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect();
    if std::env::var_os("XCLOAK_UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(&path, format!("{header}{live}")).unwrap();
        eprintln!("wrote {}", path.display());
        return;
    }
    assert!(
        !committed.is_empty(),
        "no snapshot at {} (write it with XCLOAK_UPDATE_SNAPSHOTS=1)",
        path.display()
    );
    let expected: Vec<&str> = committed.lines().filter(|l| !l.starts_with('#')).collect();
    let got: Vec<&str> = live.lines().collect();
    if expected == got {
        return;
    }
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/snapshots");
    std::fs::create_dir_all(&out).unwrap();
    let written = out.join(name);
    std::fs::write(&written, format!("{header}{live}")).unwrap();
    let first = expected.iter().zip(&got).take_while(|(a, b)| a == b).count();
    let context = |lines: &[&str]| -> String {
        lines[first.saturating_sub(3)..(first + 4).min(lines.len())]
            .iter()
            .map(|l| format!("    {l}\n"))
            .collect()
    };
    panic!(
        "{name}: the live replies differ from the snapshot at line {} (of {} committed, {} live):\n\
         committed:\n{}live:\n{}\
         all of it: diff {} {}\n\
         (if the change is intended, rewrite it with XCLOAK_UPDATE_SNAPSHOTS=1 and say why in the commit)",
        first + 1,
        expected.len(),
        got.len(),
        context(&expected),
        context(&got),
        path.display(),
        written.display()
    );
}
