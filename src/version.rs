//! The module's version, from Cargo.toml, as text (`INFO xcloak`, the load
//! log line) and encoded the way `MODULE LIST` reports module versions:
//! major * 10000 + minor * 100 + patch (0.1.0 is 100, 1.2.3 is 10203).

use std::ffi::CStr;

/// `CARGO_PKG_VERSION`, e.g. `0.1.0`.
pub const TEXT: &str = env!("CARGO_PKG_VERSION");

/// [`TEXT`] NUL-terminated, for the C API.
pub const C_TEXT: &CStr = match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
    Ok(text) => text,
    Err(_) => panic!("a version holds no NUL"),
};

/// [`TEXT`] encoded for `MODULE LIST`; computed at compile time, so a
/// version the encoding cannot hold fails the build, not the load.
pub const ENCODED: i32 = encode(TEXT);

/// `major.minor.patch`, with an optional `-pre` or `+build` suffix (ignored),
/// to major * 10000 + minor * 100 + patch. Panics (a compile error in a
/// const) unless minor and patch are below 100 and the result fits an i32.
pub const fn encode(version: &str) -> i32 {
    let bytes = version.as_bytes();
    let mut parts = [0i64; 3];
    let mut part = 0;
    let mut digits = 0;
    let mut i = 0;
    while i < bytes.len() {
        let byte = bytes[i];
        if byte == b'-' || byte == b'+' {
            break;
        }
        if byte == b'.' {
            assert!(digits > 0 && part < 2, "version must be major.minor.patch");
            part += 1;
            digits = 0;
        } else {
            assert!(byte.is_ascii_digit(), "version must be major.minor.patch");
            parts[part] = parts[part] * 10 + (byte - b'0') as i64;
            digits += 1;
            assert!(digits <= 6, "version part too long");
        }
        i += 1;
    }
    assert!(part == 2 && digits > 0, "version must be major.minor.patch");
    assert!(
        parts[1] < 100 && parts[2] < 100,
        "minor and patch must be below 100 to encode"
    );
    let encoded = parts[0] * 10000 + parts[1] * 100 + parts[2];
    assert!(encoded <= i32::MAX as i64, "major too large to encode");
    encoded as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_major_minor_patch() {
        assert_eq!(encode("0.1.0"), 100);
        assert_eq!(encode("1.2.3"), 10203);
        assert_eq!(encode("12.34.56"), 123456);
        assert_eq!(encode("0.0.1"), 1);
        assert_eq!(encode("2.0.0-rc.1"), 20000);
        assert_eq!(encode("2.0.1+build.7"), 20001);
    }

    #[test]
    fn cargo_version_is_encoded() {
        let parts: Vec<i32> = TEXT
            .split(['-', '+'])
            .next()
            .unwrap()
            .split('.')
            .map(|p| p.parse().unwrap())
            .collect();
        assert_eq!(ENCODED, parts[0] * 10000 + parts[1] * 100 + parts[2]);
    }

    #[test]
    fn refuses_what_it_cannot_encode() {
        for bad in [
            "1.2",
            "1.2.3.4",
            "1..3",
            "1.100.0",
            "1.2.100",
            "a.b.c",
            "",
            "1.2.",
            "214749.0.0",
        ] {
            assert!(std::panic::catch_unwind(|| encode(bad)).is_err(), "{bad}");
        }
    }
}
