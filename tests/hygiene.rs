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

// ---------------------------------------------------------------------------
// `unsafe` lives at one border: `src/ffi.rs` and `src/ffi/`.

/// Whether `path` (relative to the repository) is part of the FFI border.
fn in_border(path: &str) -> bool {
    path == "src/ffi.rs" || path.starts_with("src/ffi/")
}

/// `source` with every comment and the contents of every string and
/// character literal replaced by spaces, line for line (so line numbers hold).
fn code_of(source: &str) -> Vec<String> {
    let chars: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len());
    let mut i = 0;
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
        } else if c == 'r'
            && (next == Some('"') || next == Some('#'))
            && !chars[..i].last().is_some_and(|p| p.is_alphanumeric() || *p == '_')
        {
            // A raw string: r"...", r#"..."#.
            let mut j = i + 1;
            while chars.get(j) == Some(&'#') {
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            let hashes = j - i - 1;
            out.push_str(&" ".repeat(j - i + 1));
            i = j + 1;
            while i < chars.len() {
                if chars[i] == '"' && (0..hashes).all(|k| chars.get(i + 1 + k) == Some(&'#')) {
                    out.push_str(&" ".repeat(hashes + 1));
                    i += hashes + 1;
                    break;
                }
                out.push(blank(chars[i]));
                i += 1;
            }
        } else if c == '"' {
            out.push(' ');
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < chars.len() {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if c == '\'' && (chars.get(i + 2) == Some(&'\'') || next == Some('\\')) {
            // A character literal ('x', '\n', '\u{..}'), not a lifetime.
            out.push(' ');
            i += 1;
            while i < chars.len() && chars[i] != '\'' {
                if chars[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                out.push(' ');
                i += 1;
            }
            out.push(' ');
            i += 1;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out.split('\n').map(str::to_string).collect()
}

/// The columns where the word `unsafe` starts in a line of code.
fn unsafe_words(line: &str) -> Vec<usize> {
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    line.match_indices("unsafe")
        .filter(|&(at, word)| {
            !line[..at].chars().next_back().is_some_and(is_ident)
                && !line[at + word.len()..].chars().next().is_some_and(is_ident)
        })
        .map(|(at, _)| at)
        .collect()
}

/// The comment block nearest above line `at` (0-based), looking past at most
/// three lines of code (an attribute, a `let`, a match arm): its text, or
/// nothing. A comment at the end of line `at` itself counts too.
fn comment_above(source: &[&str], code: &[String], at: usize) -> String {
    if source[at].len() > code[at].trim_end().len() && source[at].contains("//") {
        let own = &source[at][code[at].trim_end().len()..];
        if own.contains("SAFETY:") {
            return own.to_string();
        }
    }
    let mut line = at;
    let mut code_lines = 0;
    while line > 0 {
        line -= 1;
        let text = source[line].trim_start();
        if text.starts_with("//") {
            let mut block = Vec::new();
            while source[line].trim_start().starts_with("//") {
                block.push(source[line].trim_start());
                if line == 0 {
                    break;
                }
                line -= 1;
            }
            return block.join("\n");
        }
        if !text.is_empty() {
            code_lines += 1;
            if code_lines > 3 {
                break;
            }
        }
    }
    String::new()
}

/// Every place a file of `src/` breaks the rule: `unsafe` outside the border
/// (comments and string literals aside), an `#[allow(unsafe_code)]` other
/// than lib.rs's on `mod ffi`, a
/// crate root without `#![deny(unsafe_code)]`, and, in the border, an
/// `unsafe` block or impl without a `// SAFETY:` comment just above it, or
/// an `unsafe fn` / `trait` whose docs have no `# Safety` section.
fn unsafe_problems(files: &[(String, String)]) -> Vec<String> {
    let mut found = Vec::new();
    for (path, source) in files {
        let lines: Vec<&str> = source.split('\n').collect();
        let code = code_of(source);
        for (n, line) in code.iter().enumerate() {
            if line.contains("allow(unsafe_code)") {
                let module = code[n + 1..].iter().find(|l| !l.trim().is_empty()).map(|l| l.trim());
                let border_mod = path == "src/lib.rs" && module == Some("mod ffi;");
                if !border_mod {
                    found.push(format!("{path}:{}: allow(unsafe_code) outside the border", n + 1));
                }
            }
            for column in unsafe_words(line) {
                if !in_border(path) {
                    found.push(format!(
                        "{path}:{}: unsafe outside the border (src/ffi.rs, src/ffi/)",
                        n + 1
                    ));
                    continue;
                }
                let rest: String = std::iter::once(&line[column + "unsafe".len()..])
                    .chain(code[n + 1..].iter().map(String::as_str))
                    .collect::<Vec<_>>()
                    .join(" ");
                let what = rest.split_whitespace().next().unwrap_or("");
                let comment = comment_above(&lines, &code, n);
                if what.starts_with("fn") || what.starts_with("trait") {
                    if !comment.contains("# Safety") {
                        found.push(format!(
                            "{path}:{}: unsafe {what} without a `# Safety` doc section",
                            n + 1
                        ));
                    }
                } else if !comment.contains("SAFETY:") {
                    found.push(format!(
                        "{path}:{}: unsafe without a `// SAFETY:` comment just above",
                        n + 1
                    ));
                }
            }
        }
        if path == "src/lib.rs" && !code.iter().any(|l| l.contains("#![deny(unsafe_code)]")) {
            found.push("src/lib.rs: the crate does not deny unsafe_code".to_string());
        }
    }
    found
}

/// Every `.rs` file under `src/`, as (path from the repository, contents).
fn src_files() -> Vec<(String, String)> {
    let mut files = Vec::new();
    let mut dirs = vec![repo().join("src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let relative = path.strip_prefix(repo()).unwrap().to_string_lossy().replace('\\', "/");
                files.push((relative, std::fs::read_to_string(&path).unwrap()));
            }
        }
    }
    files.sort();
    files
}

#[test]
fn unsafe_lives_only_at_the_ffi_border_with_a_safety_line_each() {
    let files = src_files();
    assert!(files.iter().any(|(p, _)| p == "src/ffi.rs"), "src/ffi.rs is missing");
    let found = unsafe_problems(&files);
    assert!(
        found.is_empty(),
        "unsafe code must live in src/ffi.rs or src/ffi/, each block with a `// SAFETY:` line:\n{}",
        found.join("\n")
    );
}

/// The checker fails on a broken tree, and passes comments, strings and a
/// border block with its SAFETY line.
#[test]
fn the_unsafe_checker_finds_unsafe_outside_the_border_and_blocks_without_safety() {
    let file = |path: &str, source: &str| (path.to_string(), source.to_string());
    let broken = [
        file("src/store/compact.rs", "fn f() {\n    let x = unsafe { g() };\n}\n"),
        file("src/eviction.rs", "#[allow(unsafe_code)]\nfn f() {}\n"),
        file(
            "src/ffi.rs",
            "fn f() {\n    // the server's pointer\n    unsafe { g() };\n}\n",
        ),
        file("src/ffi/datatype.rs", "/// Borrows.\npub unsafe fn lent() {}\n"),
        file(
            "src/ffi/events.rs",
            "// SAFETY: far above\nlet a = 1;\nlet b = 2;\nlet c = 3;\nlet d = 4;\nunsafe { g() };\n",
        ),
        file(
            "src/lib.rs",
            "#![forbid(missing_docs)]\n#[allow(unsafe_code)]\nmod config;\n",
        ),
    ];
    let found = unsafe_problems(&broken);
    for (path, _) in &broken {
        assert!(
            found.iter().any(|p| p.starts_with(&format!("{path}:"))),
            "{path} not reported: {found:?}"
        );
    }
    assert!(
        found
            .iter()
            .any(|p| p == "src/lib.rs: the crate does not deny unsafe_code"),
        "{found:?}"
    );

    let clean = [
        file(
            "src/commands.rs",
            "// unsafe in a comment\n/* and unsafe\n in a block */\nconst A: &str = \"unsafe\";\nconst B: &str = r#\"unsafe\"#;\nfn unsafe_code_free<'a>(x: &'a u8) -> char { 'u' }\n",
        ),
        file(
            "src/ffi.rs",
            "fn f() {\n    // SAFETY: the server's pointer,\n    // live for the call.\n    #[allow(unused_unsafe)]\n    let x = unsafe { g() };\n}\n\
             /// Borrows.\n///\n/// # Safety\n/// `p` is live.\npub unsafe fn lent(p: *mut u8) {}\n\
             // SAFETY: a plain pointer.\nunsafe impl Send for K {}\nfn h() { unsafe { g() } } // SAFETY: as above.\n",
        ),
        file("src/lib.rs", "#![deny(unsafe_code)]\n#[allow(unsafe_code)]\nmod ffi;\nmod commands;\n"),
    ];
    assert_eq!(unsafe_problems(&clean), Vec::<String>::new());
}
