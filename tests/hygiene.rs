//! Repository hygiene: nothing compiled is tracked, no tracked file is over
//! 1 MiB, and every file of `tests/` runs.
//!
//! - A compiled file is known by its content, whatever its name: ELF (Linux
//!   executables, `.o`, `.so`), Mach-O (thin and fat), PE (`MZ` with a `PE`
//!   header), WebAssembly, `ar` archives (`.a`, `.rlib`), Java class files
//!   and zip archives (`.jar`, wheels). A Go test executable of 10.8 MB was
//!   once committed this way (`clients/go/bench/bench.test`).
//! - `EXCEPTIONS` names the committed fixtures exempt from both rules, each
//!   with its reason; each must be tracked, so the list cannot go stale.
//! - The checker is pure (`problems`), and its own test feeds it a broken
//!   tree: a synthetic ELF header, a Mach-O, a jar and a file of 1 MiB + 1.
use std::path::Path;
use std::process::Command;

/// The largest file the repository tracks: 1 MiB.
const MAX_BYTES: u64 = 1 << 20;

/// Committed fixtures exempt from the rules, and why they are committed.
const EXCEPTIONS: &[(&str, &str)] = &[
    (
        "tests/fixtures/0.1.0/dump.rdb",
        "an RDB written by release 0.1.0 (tests/fixtures.rs loads it)",
    ),
    (
        "tests/fixtures/0.1.0/aof-preamble/appendonlydir/appendonly.aof.2.base.rdb",
        "the RDB preamble of an AOF written by release 0.1.0 (tests/fixtures.rs)",
    ),
    (
        "tests/fixtures/0.1.0/aof-plain/appendonlydir/appendonly.aof.2.base.aof",
        "an AOF base written by release 0.1.0 (tests/fixtures.rs)",
    ),
    (
        "docs/performance-memory.png",
        "the chart make bench draws for docs/performance.md",
    ),
];

/// What kind of compiled file `head` (a file's first bytes) starts, if any.
fn compiled_kind(head: &[u8]) -> Option<&'static str> {
    let starts = |magic: &[u8]| head.starts_with(magic);
    if starts(b"\x7fELF") {
        return Some("ELF executable, object or shared library");
    }
    if [
        b"\xfe\xed\xfa\xce",
        b"\xfe\xed\xfa\xcf",
        b"\xce\xfa\xed\xfe",
        b"\xcf\xfa\xed\xfe",
    ]
    .iter()
    .any(|m| starts(*m))
    {
        return Some("Mach-O executable or object");
    }
    if starts(b"\xca\xfe\xba\xbe") {
        return Some("Java class file or Mach-O universal binary");
    }
    if starts(b"\0asm") {
        return Some("WebAssembly module");
    }
    if starts(b"!<arch>\n") {
        return Some("ar archive (.a, .rlib)");
    }
    if starts(b"PK\x03\x04") {
        return Some("zip archive (.jar, .whl, .zip)");
    }
    if starts(b"MZ") && head.len() >= 0x40 {
        let at = u32::from_le_bytes([head[0x3c], head[0x3d], head[0x3e], head[0x3f]]) as usize;
        if head.get(at..at + 4) == Some(b"PE\0\0") {
            return Some("PE executable or DLL");
        }
    }
    None
}

/// A tracked file as the checker sees it: its path, size and first bytes.
struct Tracked {
    path: String,
    size: u64,
    head: Vec<u8>,
}

/// Every rule a tracked file breaks, one line each.
fn problems(files: &[Tracked]) -> Vec<String> {
    let mut found = Vec::new();
    for file in files {
        if EXCEPTIONS.iter().any(|(path, _)| *path == file.path) {
            continue;
        }
        if let Some(kind) = compiled_kind(&file.head) {
            found.push(format!("{}: compiled ({kind})", file.path));
        }
        if file.size > MAX_BYTES {
            found.push(format!("{}: {} bytes, over {MAX_BYTES}", file.path, file.size));
        }
    }
    found
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The files `git ls-files` holds (deleted but still tracked ones are skipped).
fn tracked() -> Vec<Tracked> {
    let output = Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(repo())
        .output()
        .expect("git runs");
    assert!(
        output.status.success(),
        "git ls-files: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut files = Vec::new();
    for path in output.stdout.split(|b| *b == 0).filter(|p| !p.is_empty()) {
        let path = String::from_utf8(path.to_vec()).expect("UTF-8 path");
        let full = repo().join(&path);
        let Ok(meta) = std::fs::symlink_metadata(&full) else {
            continue;
        };
        if !meta.is_file() {
            continue;
        }
        let mut head = vec![0u8; 4096];
        let n = std::io::Read::read(&mut std::fs::File::open(&full).unwrap(), &mut head).unwrap();
        head.truncate(n);
        files.push(Tracked {
            path,
            size: meta.len(),
            head,
        });
    }
    files
}

#[test]
fn no_compiled_file_and_none_over_1_mib_is_tracked() {
    let files = tracked();
    assert!(files.len() > 100, "git ls-files listed {} files", files.len());
    let found = problems(&files);
    assert!(
        found.is_empty(),
        "tracked files that must not be (git rm --cached them, and ignore what a build leaves):\n{}",
        found.join("\n")
    );
}

#[test]
fn every_exception_is_a_tracked_file() {
    let files = tracked();
    for (path, why) in EXCEPTIONS {
        assert!(
            files.iter().any(|f| f.path == *path),
            "{path} ({why}) is listed as an exception but not tracked: remove it from EXCEPTIONS"
        );
    }
}

/// The checker fails on a broken tree: each compiled kind and a file one
/// byte over the bound are reported, a clean text file and an exception are not.
#[test]
fn the_checker_finds_compiled_and_oversized_files() {
    let file = |path: &str, size: u64, head: &[u8]| Tracked {
        path: path.to_string(),
        size,
        head: head.to_vec(),
    };
    let mut pe = vec![0u8; 0x48];
    pe[..2].copy_from_slice(b"MZ");
    pe[0x3c] = 0x40;
    pe[0x40..0x44].copy_from_slice(b"PE\0\0");
    let broken = [
        file("clients/go/bench/bench.test", 10_800_000, b"\x7fELF\x02\x01\x01\0"),
        file("lib.o", 900, b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0\x01\0"),
        file("tool", 4096, b"\xcf\xfa\xed\xfe\x07\0\0\x01"),
        file("Main.class", 300, b"\xca\xfe\xba\xbe\0\0\0\x41"),
        file("app.jar", 2048, b"PK\x03\x04\x14\0\x08\0"),
        file("lib.a", 2048, b"!<arch>\nfoo.o/"),
        file("m.wasm", 100, b"\0asm\x01\0\0\0"),
        file("x.exe", 1024, &pe),
        file("data.bin", MAX_BYTES + 1, b"plain text, but too much of it"),
    ];
    let found = problems(&broken);
    for f in &broken {
        assert!(
            found.iter().any(|p| p.starts_with(&format!("{}:", f.path))),
            "{} not reported: {found:?}",
            f.path
        );
    }
    assert_eq!(
        found.len(),
        broken.len() + 1,
        "bench.test is both compiled and too large: {found:?}"
    );

    let clean = [
        file("README.md", MAX_BYTES, b"# xcloak\n"),
        file("MZ.txt", 10, b"MZ is not enough"),
        file(EXCEPTIONS[0].0, MAX_BYTES + 1, b"\x7fELF"),
    ];
    assert_eq!(problems(&clean), Vec::<String>::new());
}

/// `autotests = false`: a file of `tests/` runs only when tests/main.rs
/// declares it as a module. Fails for a file added without its `mod` line.
#[test]
fn every_test_file_is_a_module_of_the_suite() {
    let main = std::fs::read_to_string(repo().join("tests/main.rs")).unwrap();
    let declared: Vec<&str> = main
        .lines()
        .filter_map(|l| l.strip_prefix("mod ")?.strip_suffix(';'))
        .collect();
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(repo().join("tests")).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        let Some(module) = name.strip_suffix(".rs") else {
            continue;
        };
        if module != "main" && !declared.contains(&module) {
            missing.push(name);
        }
    }
    assert!(
        missing.is_empty(),
        "tests/{missing:?} would never run: add `mod NAME;` to tests/main.rs"
    );
    assert!(declared.contains(&"hygiene") && declared.contains(&"common"));
}

/// `make test-matrix` runs the modules of tests/matrix.list on the other
/// servers: a name that is no module of the suite would silently run nothing.
#[test]
fn the_matrix_list_names_modules_of_the_suite() {
    let main = std::fs::read_to_string(repo().join("tests/main.rs")).unwrap();
    let list = std::fs::read_to_string(repo().join("tests/matrix.list")).unwrap();
    let names: Vec<&str> = list
        .lines()
        .map(|l| l.split('#').next().unwrap().trim())
        .filter(|l| !l.is_empty())
        .collect();
    assert!(names.len() >= 10, "tests/matrix.list names {} modules", names.len());
    for name in names {
        assert!(
            main.lines().any(|l| l == format!("mod {name};")),
            "tests/matrix.list names {name}, which is no module of tests/main.rs"
        );
    }
}
