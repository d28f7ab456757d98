//! Minimal LEB128 varints, and the runs of version 1 made of them.

use super::DecodeError;

// Version 1's varints.

pub(crate) fn put_run(out: &mut Vec<u8>, delta: u64, count: u64) {
    put_varint(out, delta << 1 | u64::from(count > 1));
    if count > 1 {
        put_varint(out, count);
    }
}

pub(crate) fn read_run(bytes: &[u8], pos: &mut usize) -> Result<(u64, u64), DecodeError> {
    let head = read_varint(bytes, pos)?;
    let count = if head & 1 == 1 {
        let count = read_varint(bytes, pos)?;
        if count < 2 {
            return Err(DecodeError::BadCount);
        }
        count
    } else {
        1
    };
    Ok((head >> 1, count))
}

pub(crate) fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// A minimal LEB128 varint of at most 64 bits.
pub(crate) fn read_varint(bytes: &[u8], pos: &mut usize) -> Result<u64, DecodeError> {
    let mut value = 0u64;
    let mut shift = 0;
    loop {
        let byte = *bytes.get(*pos).ok_or(DecodeError::Truncated)?;
        *pos += 1;
        if shift == 63 && byte > 1 {
            return Err(DecodeError::BadVarint);
        }
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            if byte == 0 && shift > 0 {
                return Err(DecodeError::BadVarint);
            }
            return Ok(value);
        }
        shift += 7;
        if shift > 63 {
            return Err(DecodeError::BadVarint);
        }
    }
}
