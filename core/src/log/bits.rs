//! Little-endian bit strings: bit i of a string is bit i % 8 of byte i / 8.

use super::BLOCK_BYTES;

// Bits: little-endian bit strings (bit i of the string is bit i % 8 of byte i / 8).

/// The 8-byte window of `data` that holds bit `pos` and the `width` bits
/// after it: starting at the byte of `pos`, or at the last 8 bytes of `data`
/// near its end. Returns the window's first byte and the field's shift in it.
/// `data` holds at least 8 bytes (a block's header does) and the field.
#[inline(always)]
pub(crate) fn window_of(data: &[u8], pos: usize) -> (usize, usize) {
    let byte = pos / 8;
    if byte + 8 <= data.len() {
        (byte, pos % 8)
    } else {
        let start = data.len() - 8;
        (start, pos - start * 8)
    }
}

/// The `width` (<= 57) bits at bit `pos` of `data` (see `window_of`).
#[inline(always)]
pub(crate) fn get_bits(data: &[u8], pos: usize, width: u32) -> u64 {
    if width == 0 {
        return 0;
    }
    assert!(data.len() >= 8);
    let (start, shift) = window_of(data, pos);
    // SAFETY: `window_of` keeps `start + 8 <= data.len()`.
    let word = u64::from_le(unsafe { std::ptr::read_unaligned(data.as_ptr().add(start) as *const u64) });
    (word >> shift) & mask(width)
}

/// Writes `value` (< 2^width, width <= 57) at bit `pos`, keeping every other bit.
#[inline(always)]
pub(crate) fn set_bits(data: &mut [u8], pos: usize, width: u32, value: u64) {
    if width == 0 {
        return;
    }
    debug_assert!(value <= mask(width));
    assert!(data.len() >= 8);
    let (start, shift) = window_of(data, pos);
    let field = mask(width) << shift;
    // SAFETY: `window_of` keeps `start + 8 <= data.len()`.
    unsafe {
        let at = data.as_mut_ptr().add(start) as *mut u64;
        let word = u64::from_le(std::ptr::read_unaligned(at));
        std::ptr::write_unaligned(at, ((word & !field) | (value << shift)).to_le());
    }
}

#[inline(always)]
pub(crate) fn mask(width: u32) -> u64 {
    if width >= 64 {
        u64::MAX
    } else {
        (1u64 << (width & 63)) - 1
    }
}

/// Bits needed for `value` (0 for 0).
#[inline(always)]
pub(crate) fn width_of(value: u64) -> u32 {
    64 - value.leading_zeros()
}

/// Moves the bits `[from, end)` down to start at `to` (< from); the bits
/// after the moved ones are left as they were.
pub(crate) fn shift_bits_down(data: &mut [u8], from: usize, to: usize, end: usize) {
    debug_assert!(to <= from && from <= end);
    if to == from {
        return;
    }
    let mut out = to;
    let mut at = from;
    // Up to the next byte boundary of the destination, a few bits at a time.
    while !out.is_multiple_of(8) && at < end {
        let width = ((8 - out % 8).min(end - at)) as u32;
        let value = get_bits(data, at, width);
        set_bits(data, out, width, value);
        out += width as usize;
        at += width as usize;
    }
    if at >= end {
        return;
    }
    let (dst, bits) = (out / 8, end - at);
    let shift = (at % 8) as u32;
    let src = at / 8;
    let bytes = bits.div_ceil(8);
    if shift == 0 {
        data.copy_within(src..src + bytes, dst);
        return;
    }
    // Whole bytes of the destination from two bytes of the source each, eight
    // at a time where the source has a ninth byte to read.
    let mut i = 0;
    while i + 8 <= bytes && src + i + 9 <= data.len() {
        let low = u64::from_le_bytes(data[src + i..src + i + 8].try_into().unwrap());
        let high = u64::from(data[src + i + 8]);
        let word = (low >> shift) | (high << (64 - shift));
        data[dst + i..dst + i + 8].copy_from_slice(&word.to_le_bytes());
        i += 8;
    }
    while i < bytes {
        let low = u16::from(data[src + i]);
        let high = u16::from(data.get(src + i + 1).copied().unwrap_or(0));
        data[dst + i] = ((low | high << 8) >> shift) as u8;
        i += 1;
    }
}

/// Fields appended to a bit string of up to a block's data, a word at a time
/// (`Block::widen`).
pub(crate) struct BitWriter {
    words: [u64; BLOCK_BYTES / 8 + 1],
    len: usize,
    acc: u64,
    bits: u32,
}

impl Default for BitWriter {
    fn default() -> BitWriter {
        BitWriter {
            words: [0; BLOCK_BYTES / 8 + 1],
            len: 0,
            acc: 0,
            bits: 0,
        }
    }
}

impl BitWriter {
    /// Appends `value` (< 2^width, width <= 57).
    #[inline(always)]
    pub(crate) fn push(&mut self, value: u64, width: u32) {
        if width == 0 {
            return;
        }
        self.acc |= value << self.bits;
        self.bits += width;
        if self.bits >= 64 {
            self.words[self.len] = self.acc;
            self.len += 1;
            self.bits -= 64;
            self.acc = if self.bits > 0 { value >> (width - self.bits) } else { 0 };
        }
    }

    /// The bytes written (the last one zero-padded).
    pub(crate) fn finish(&mut self) -> &[u8] {
        let bytes = self.len * 8 + (self.bits as usize).div_ceil(8);
        if self.bits > 0 {
            self.words[self.len] = self.acc;
        }
        for word in &mut self.words[..self.len + 1] {
            *word = word.to_le();
        }
        // SAFETY: the words are plain bytes, `bytes` of them within the array.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr() as *const u8, bytes) }
    }
}
