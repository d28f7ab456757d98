//! Servers under valgrind's memcheck (`make test-valgrind`).
//!
//! With `XCLOAK_VALGRIND=<dir>` set, every server a test starts runs as
//! `valgrind --leak-check=full ... redis-server ...`, writing one log per
//! process (forked children too: the BGSAVE and AOF-rewrite children run the
//! type's `rdb_save` and `aof_rewrite`) to `<dir>/<test binary>-<port>-<pid>.log`.
//! When the server stops (`Server::stop`, or its drop), it is shut down
//! cleanly so that valgrind writes its leak report, and [`verdict`] reads
//! every log of that server: the test fails on any memory error (invalid
//! read or write, invalid free, use of an uninitialised value, a crash) and
//! on any block "definitely lost" whose allocation stack passes through
//! `libxcloak`. Leaks the server makes on its own are printed, not failed:
//! they are not the module's to fix.
//!
//! `--soname-synonyms=somalloc=*jemalloc*` makes valgrind replace the
//! allocator of Debian's redis-server (linked against the system
//! `libjemalloc.so.2`, whose `malloc`/`free` are unprefixed) with its own, so
//! every `RedisModule_Alloc` is tracked. A server whose jemalloc is linked
//! in statically with `je_` names (the PyPI builds of Redis 6.2.5 and 8.2.3)
//! cannot be checked this way: [`verdict`] refuses it.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// The directory for valgrind's logs, when the servers run under valgrind.
pub fn log_dir() -> Option<PathBuf> {
    std::env::var_os("XCLOAK_VALGRIND")
        .filter(|dir| !dir.is_empty())
        .map(PathBuf::from)
}

pub fn enabled() -> bool {
    log_dir().is_some()
}

/// `timeout`, stretched for a server under valgrind (20 to 50 times slower).
pub fn patience(timeout: Duration) -> Duration {
    if enabled() {
        timeout * 15
    } else {
        timeout
    }
}

/// `plain` normally, `under_valgrind` when the servers run under valgrind:
/// the counts of a workload shrink there, never its kinds of calls.
pub fn scaled(plain: usize, under_valgrind: usize) -> usize {
    if enabled() {
        under_valgrind
    } else {
        plain
    }
}

/// The suppressions Redis ships for its own valgrind runs (a copy, origin
/// noted inside).
fn suppressions() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/valgrind/redis.sup")
}

/// The name of the running test binary (`memcheck-1a2b3c...` -> `memcheck`).
fn test_binary() -> String {
    let exe = std::env::current_exe().ok();
    let stem = exe
        .as_ref()
        .and_then(|p| p.file_stem())
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    stem.rsplit_once('-')
        .map_or(stem.clone(), |(name, _hash)| name.to_string())
}

/// The prefix of the logs of the server on `port` (one file per process).
pub fn log_prefix(port: u16) -> String {
    format!("{}-{port}-", test_binary())
}

/// valgrind's command line before the server's own.
pub fn command(dir: &Path, port: u16) -> Vec<String> {
    vec![
        "--tool=memcheck".into(),
        "--leak-check=full".into(),
        "--show-leak-kinds=definite".into(),
        "--errors-for-leak-kinds=definite".into(),
        "--soname-synonyms=somalloc=*jemalloc*".into(),
        format!("--suppressions={}", suppressions().display()),
        "--num-callers=40".into(),
        "--error-limit=no".into(),
        format!("--log-file={}/{}%p.log", dir.display(), log_prefix(port)),
    ]
}

/// What one log says.
#[derive(Debug, Default)]
pub struct Verdict {
    /// Memory errors (each the record's text): always a failure.
    pub errors: Vec<String>,
    /// Definitely lost blocks allocated through libxcloak: a failure.
    pub module_leaks: Vec<String>,
    /// Definitely lost blocks of the server's own: reported only.
    pub server_leaks: Vec<String>,
    /// valgrind wrote its closing ERROR SUMMARY (the process exited through
    /// valgrind, not by SIGKILL).
    pub complete: bool,
    /// The process valgrind started it from (`Parent PID:`).
    pub parent_pid: Option<u32>,
}

impl Verdict {
    /// A fork of the server (BGSAVE, AOF rewrite, diskless sync), not the
    /// server: its parent is not this test process.
    pub fn forked(&self) -> bool {
        self.parent_pid.is_some_and(|pid| pid != std::process::id())
    }

    /// Memory errors fail everywhere. Leaks fail only in the server itself:
    /// a fork child releases the pages of the values it has written
    /// (`dismissObject`, Redis 7.0+: madvise(MADV_DONTNEED), so their
    /// pointers read as zero) and leaves by `_exit`, so what valgrind finds
    /// unreferenced at its exit is not a leak of the program.
    pub fn failed(&self) -> bool {
        !self.errors.is_empty() || !self.module_leaks.is_empty() && !self.forked() || !self.complete
    }
}

/// The first lines of memcheck's error records (valgrind's manual, 4.2).
const ERROR_KINDS: &[&str] = &[
    "Invalid read",
    "Invalid write",
    "Invalid free",
    "Mismatched free",
    "Invalid address",
    "Jump to the invalid address",
    "Conditional jump or move depends on uninitialised value",
    "Use of uninitialised value",
    "Syscall param",
    "Source and destination overlap",
    "Argument 'size' of function",
    "Process terminating with default action",
    "Warning: invalid file descriptor",
];

/// What a stack frame of the module looks like: its object without debug
/// information (the release build), or its code with it (the crate's own
/// functions, the redis-module crate's, the module's entry point).
const MODULE_FRAMES: &[&str] = &["libxcloak", "xcloak::", "redis_module::", "RedisModule_OnLoad"];

/// Reads one valgrind log: groups its lines into records (separated by
/// `==pid== ` lines with nothing after), then sorts the records.
pub fn verdict(text: &str) -> Verdict {
    let mut verdict = Verdict::default();
    let mut records: Vec<Vec<&str>> = vec![Vec::new()];
    for line in text.lines() {
        // "==12345== message" (or "--12345-- " for valgrind's own notes).
        let body = match line.split_once("== ") {
            Some((pid, rest)) if pid.starts_with("==") => rest,
            _ if line.starts_with("==") && line.ends_with("==") => "",
            _ => continue,
        };
        if body.trim().is_empty() {
            records.push(Vec::new());
        } else {
            records.last_mut().unwrap().push(body);
        }
    }
    let mut summary_errors: Option<usize> = None;
    for record in records.iter().filter(|r| !r.is_empty()) {
        let first = record[0];
        let text = record.join("\n");
        if ERROR_KINDS.iter().any(|kind| first.starts_with(kind)) {
            verdict.errors.push(text);
        } else if first.contains("are definitely lost in loss record") {
            if MODULE_FRAMES.iter().any(|frame| text.contains(frame)) {
                verdict.module_leaks.push(text);
            } else {
                verdict.server_leaks.push(text);
            }
        }
        for line in record {
            if let Some(pid) = line.strip_prefix("Parent PID: ") {
                verdict.parent_pid = pid.trim().parse().ok();
            }
            if let Some(rest) = line.strip_prefix("ERROR SUMMARY: ") {
                verdict.complete = true;
                summary_errors = rest
                    .split_whitespace()
                    .next()
                    .and_then(|n| n.replace(',', "").parse().ok());
            }
        }
    }
    // With --errors-for-leak-kinds=definite the summary counts the memory
    // errors and the definite leaks: more than were recognised above means
    // a kind of record this parser does not know, which fails too.
    if let Some(counted) = summary_errors {
        let recognised = verdict.errors.len() + verdict.module_leaks.len() + verdict.server_leaks.len();
        if counted > recognised {
            verdict.errors.push(format!(
                "valgrind counted {counted} errors, this parser recognised {recognised}: read the log"
            ));
        }
    }
    verdict
}

/// Checks the logs in `dir` whose names start with `prefix`, except those
/// in `seen` (which it extends); returns one line per log, and the
/// failures as text.
pub fn check_logs(dir: &Path, prefix: &str, seen: &mut Vec<PathBuf>) -> (Vec<String>, Vec<String>) {
    let mut lines = Vec::new();
    let mut failures = Vec::new();
    let mut logs: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| entries.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    logs.retain(|path| {
        path.file_name()
            .is_some_and(|name| name.to_string_lossy().starts_with(prefix))
            && !seen.contains(path)
    });
    logs.sort();
    for log in logs {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let verdict = verdict(&text);
        let name = log.file_name().unwrap().to_string_lossy().into_owned();
        lines.push(format!(
            "valgrind {name}{}: {} errors, {} module leaks, {} server leaks{}",
            if verdict.forked() { " (a fork child)" } else { "" },
            verdict.errors.len(),
            verdict.module_leaks.len(),
            verdict.server_leaks.len(),
            if verdict.complete { "" } else { ", NO closing summary" }
        ));
        if !verdict.forked() {
            for leak in &verdict.server_leaks {
                lines.push(format!("  the server's own leak (not failed):\n{leak}"));
            }
        } else {
            for leak in &verdict.module_leaks {
                lines.push(format!(
                    "  unreferenced at a fork child's _exit (not failed):\n{}",
                    leak.lines().next().unwrap_or("")
                ));
            }
        }
        if verdict.failed() {
            let mut failure = format!("{}:", log.display());
            let leaks = if verdict.forked() {
                &[][..]
            } else {
                &verdict.module_leaks[..]
            };
            for record in verdict.errors.iter().chain(leaks) {
                failure.push_str("\n\n");
                failure.push_str(record);
            }
            if !verdict.complete {
                failure.push_str(
                    "\n\nvalgrind wrote no ERROR SUMMARY: the process did not exit through valgrind (killed?)",
                );
            }
            failures.push(failure);
        }
        seen.push(log);
    }
    (lines, failures)
}

/// Refuses a server whose allocator valgrind cannot see (see the file docs).
pub fn check_server_binary(binary: &str) {
    let output = std::process::Command::new("nm").arg("-D").arg(binary).output();
    if let Ok(output) = output {
        let symbols = String::from_utf8_lossy(&output.stdout);
        assert!(
            !symbols.lines().any(|l| l.ends_with(" T je_malloc")),
            "{binary} has jemalloc linked in (je_malloc): valgrind cannot track its heap; \
             use Debian's redis-server or a build with malloc=libc"
        );
    }
}

/// The parser on records as valgrind 3.19 writes them.
pub fn self_test() {
    let log = "\
==7== Memcheck, a memory error detector
==7== 
==7== Invalid read of size 8
==7==    at 0x1: f (in /x/libxcloak.so)
==7== 
==7== 16 bytes in 1 blocks are definitely lost in loss record 1 of 2
==7==    at 0x2: malloc (vg_replace_malloc.c:381)
==7==    by 0x3: zmalloc (in /usr/bin/redis-check-rdb)
==7==    by 0x4: g (in /x/libxcloak.so)
==7== 
==7== 8 bytes in 1 blocks are definitely lost in loss record 2 of 2
==7==    at 0x2: malloc (vg_replace_malloc.c:381)
==7==    by 0x5: sdsnew (in /usr/bin/redis-check-rdb)
==7== 
==7== ERROR SUMMARY: 3 errors from 3 contexts (suppressed: 0 from 0)
";
    let v = verdict(log);
    assert_eq!(
        (v.errors.len(), v.module_leaks.len(), v.server_leaks.len(), v.complete),
        (1, 1, 1, true),
        "{v:?}"
    );
    let with_debuginfo = verdict("==6== 8 bytes in 1 blocks are definitely lost in loss record 1 of 1\n==6==    at 0x2: malloc (vg_replace_malloc.c:381)\n==6==    by 0x3: xcloak::metadata::describe (metadata.rs:256)\n==6== \n==6== For lists of detected and suppressed errors, rerun with: -s\n==6== ERROR SUMMARY: 1 errors from 1 contexts (suppressed: 0 from 0)\n");
    assert_eq!(
        (with_debuginfo.module_leaks.len(), with_debuginfo.complete),
        (1, true),
        "{with_debuginfo:?}"
    );
    let child = verdict(&format!("==5== Parent PID: {}\n==5== \n{}", std::process::id() + 1, "==5== 8 bytes in 1 blocks are definitely lost in loss record 1 of 1\n==5==    by 0x3: f (in /x/libxcloak.so)\n==5== \n==5== ERROR SUMMARY: 1 errors from 1 contexts\n"));
    assert!(
        child.forked() && !child.failed(),
        "a fork child's leaks are reported, not failed: {child:?}"
    );
    let clean =
        verdict("==8== HEAP SUMMARY:\n==8== \n==8== ERROR SUMMARY: 0 errors from 0 contexts (suppressed: 0 from 0)\n");
    assert!(!clean.failed(), "{clean:?}");
    let killed = verdict("==9== Memcheck, a memory error detector\n");
    assert!(killed.failed(), "no summary is a failure");
    let unknown =
        verdict("==9== Something new\n==9==    at 0x1: f\n==9== \n==9== ERROR SUMMARY: 1 errors from 1 contexts\n");
    assert!(unknown.failed(), "an error the parser does not know is a failure");
}
