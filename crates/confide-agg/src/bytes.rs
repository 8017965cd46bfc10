//! Byte views of numeric slices (the one place outside `simd.rs` that needs unsafe).
#![allow(unsafe_code)]

/// A view of f32 values as their in-memory (little-endian on x86-64) bytes.
pub(crate) fn f32_bytes(x: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding and no invalid bit patterns as bytes; u8 has
    // alignment 1; the length in bytes is exactly 4 × len and stays in the allocation.
    unsafe { std::slice::from_raw_parts(x.as_ptr().cast::<u8>(), std::mem::size_of_val(x)) }
}

/// A view of u32 values as their in-memory bytes.
pub(crate) fn u32_bytes(x: &[u32]) -> &[u8] {
    // SAFETY: as `f32_bytes`.
    unsafe { std::slice::from_raw_parts(x.as_ptr().cast::<u8>(), std::mem::size_of_val(x)) }
}
