//! The aggregation primitive (Jupiter §3.5, algorithms.md §6.1): fold an
//! arriving slice into the tracker's slice in place, `acc += w·x`, with explicit
//! SIMD. AVX-512F (4 × 16 lanes per iteration), AVX2 + FMA (4 × 8 lanes) or a
//! scalar fallback, chosen once at run time. `CONFIDE_AGG_SIMD=scalar|avx2|avx512`
//! lowers the level (never raises it above what the CPU has). Every level uses a
//! fused multiply-add, so all levels give bit-identical results.
//!
//! Inputs may be `&[f32]` or raw little-endian payload bytes at any alignment
//! (`*_bytes` functions): slices are folded straight out of the received batch.

use crate::bytes::{f32_bytes, u32_bytes};
use crate::error::{invalid, Result};
use std::sync::OnceLock;
use std::time::Instant;

/// A SIMD level of the primitive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// Portable scalar code.
    Scalar,
    /// AVX2 + FMA, 256-bit.
    Avx2,
    /// AVX-512F, 512-bit.
    Avx512,
}

impl Level {
    /// Name as reported by [`simd_level`].
    pub fn name(self) -> &'static str {
        match self {
            Level::Scalar => "scalar",
            Level::Avx2 => "avx2",
            Level::Avx512 => "avx512",
        }
    }
}

/// The best level the CPU supports (ignores `CONFIDE_AGG_SIMD`).
pub fn cpu_level() -> Level {
    static CPU: OnceLock<Level> = OnceLock::new();
    *CPU.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return Level::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                return Level::Avx2;
            }
        }
        Level::Scalar
    })
}

/// The level in use: the CPU's best, lowered by `CONFIDE_AGG_SIMD` if set.
pub fn level() -> Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        let forced = match std::env::var("CONFIDE_AGG_SIMD").ok().as_deref() {
            Some("scalar") => Level::Scalar,
            Some("avx2") => Level::Avx2,
            _ => Level::Avx512,
        };
        forced.min(cpu_level())
    })
}

/// Name of the level in use: "avx512", "avx2" or "scalar".
pub fn simd_level() -> &'static str {
    level().name()
}

/// Every level this CPU can run (for tests comparing them).
pub fn available_levels() -> Vec<Level> {
    [Level::Scalar, Level::Avx2, Level::Avx512].into_iter().filter(|&l| l <= cpu_level()).collect()
}

fn check_level(level: Level) -> Result<()> {
    if level > cpu_level() {
        return Err(invalid("level", format!("{} is not supported by this CPU (best: {})", level.name(), cpu_level().name())));
    }
    Ok(())
}

fn check_len(acc: usize, x_bytes: usize) -> Result<()> {
    if x_bytes != acc * 4 {
        return Err(invalid("x", format!("holds {x_bytes} bytes; {acc} values need {} bytes", acc * 4)));
    }
    Ok(())
}

fn axpy_at(level: Level, acc: &mut [f32], x: &[u8], w: f32) {
    match level {
        #[cfg(target_arch = "x86_64")]
        Level::Avx512 => crate::simd::axpy_avx512(acc, x, w),
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 => crate::simd::axpy_avx2(acc, x, w),
        _ => {
            for (a, c) in acc.iter_mut().zip(x.chunks_exact(4)) {
                *a = f32::from_le_bytes([c[0], c[1], c[2], c[3]]).mul_add(w, *a);
            }
        }
    }
}

fn scale_at(level: Level, acc: &mut [f32], x: &[u8], w: f32) {
    match level {
        #[cfg(target_arch = "x86_64")]
        Level::Avx512 => crate::simd::scale_avx512(acc, x, w),
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 => crate::simd::scale_avx2(acc, x, w),
        _ => {
            for (a, c) in acc.iter_mut().zip(x.chunks_exact(4)) {
                *a = f32::from_le_bytes([c[0], c[1], c[2], c[3]]) * w;
            }
        }
    }
}

fn finite_at(level: Level, x: &[u8]) -> bool {
    let simd = match level {
        #[cfg(target_arch = "x86_64")]
        Level::Avx512 => crate::simd::finite_avx512(x),
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 => crate::simd::finite_avx2(x),
        _ => None,
    };
    simd.unwrap_or_else(|| {
        x.len().is_multiple_of(4) && x.chunks_exact(4).all(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) & 0x7F80_0000 != 0x7F80_0000)
    })
}

fn add_u32_at(level: Level, acc: &mut [u32], x: &[u8]) {
    match level {
        #[cfg(target_arch = "x86_64")]
        Level::Avx512 => crate::simd::add_u32_avx512(acc, x),
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 => crate::simd::add_u32_avx2(acc, x),
        _ => {
            for (a, c) in acc.iter_mut().zip(x.chunks_exact(4)) {
                *a = a.wrapping_add(u32::from_le_bytes([c[0], c[1], c[2], c[3]]));
            }
        }
    }
}

/// acc[i] += w · x[i] (fused multiply-add) at the current level.
///
/// # Errors
/// `InvalidParameter` if the lengths differ.
pub fn accumulate_f32(acc: &mut [f32], x: &[f32], w: f32) -> Result<()> {
    accumulate_f32_at(level(), acc, x, w)
}

/// [`accumulate_f32`] at a chosen level (tests compare levels).
///
/// # Errors
/// `InvalidParameter` if the lengths differ or the CPU lacks the level.
pub fn accumulate_f32_at(level: Level, acc: &mut [f32], x: &[f32], w: f32) -> Result<()> {
    accumulate_f32_bytes_at(level, acc, f32_bytes(x), w)
}

/// acc[i] += w · x[i] with x given as little-endian f32 bytes (any alignment).
///
/// # Errors
/// `InvalidParameter` if `x` does not hold exactly `acc.len()` values.
pub fn accumulate_f32_bytes(acc: &mut [f32], x: &[u8], w: f32) -> Result<()> {
    accumulate_f32_bytes_at(level(), acc, x, w)
}

/// [`accumulate_f32_bytes`] at a chosen level.
///
/// # Errors
/// As [`accumulate_f32_at`].
pub fn accumulate_f32_bytes_at(level: Level, acc: &mut [f32], x: &[u8], w: f32) -> Result<()> {
    check_level(level)?;
    check_len(acc.len(), x.len())?;
    axpy_at(level, acc, x, w);
    Ok(())
}

/// acc[i] = w · x[i] (first arrival of a slice).
///
/// # Errors
/// `InvalidParameter` if the lengths differ.
pub fn scale_into_f32(acc: &mut [f32], x: &[f32], w: f32) -> Result<()> {
    scale_into_f32_bytes_at(level(), acc, f32_bytes(x), w)
}

/// [`scale_into_f32`] from little-endian bytes at a chosen level.
///
/// # Errors
/// As [`accumulate_f32_at`].
pub fn scale_into_f32_bytes_at(level: Level, acc: &mut [f32], x: &[u8], w: f32) -> Result<()> {
    check_level(level)?;
    check_len(acc.len(), x.len())?;
    scale_at(level, acc, x, w);
    Ok(())
}

/// Whether every value is finite (no float exponent of all ones: no NaN, no ±inf).
pub fn all_finite_f32(x: &[f32]) -> bool {
    finite_at(level(), f32_bytes(x))
}

/// [`all_finite_f32`] on little-endian bytes at a chosen level (false if the
/// length is not a multiple of 4 or the level is not supported).
pub fn all_finite_f32_bytes_at(level: Level, x: &[u8]) -> bool {
    check_level(level).is_ok() && finite_at(level, x)
}

/// acc[i] = acc[i] + x[i] mod 2^32.
///
/// # Errors
/// `InvalidParameter` if the lengths differ.
pub fn accumulate_u32(acc: &mut [u32], x: &[u32]) -> Result<()> {
    accumulate_u32_bytes_at(level(), acc, u32_bytes(x))
}

/// [`accumulate_u32`] from little-endian bytes at a chosen level.
///
/// # Errors
/// As [`accumulate_f32_at`].
pub fn accumulate_u32_bytes_at(level: Level, acc: &mut [u32], x: &[u8]) -> Result<()> {
    check_level(level)?;
    check_len(acc.len(), x.len())?;
    add_u32_at(level, acc, x);
    Ok(())
}

/// Times `iterations` folds `acc += w_k · slice_k` into one `slice_len` buffer,
/// cycling over the k = slices.len() / slice_len slices. Returns seconds.
///
/// # Errors
/// `InvalidParameter` if `slice_len` is 0, `slices` is not a multiple of it, or
/// `weights` does not hold one weight per slice.
pub fn bench_primitive(slices: &[f32], slice_len: usize, weights: &[f32], iterations: usize) -> Result<f64> {
    if slice_len == 0 || slices.is_empty() || !slices.len().is_multiple_of(slice_len) {
        return Err(invalid("slices", format!("length {} must be a positive multiple of slice_len = {slice_len}", slices.len())));
    }
    let count = slices.len() / slice_len;
    if weights.len() != count {
        return Err(invalid("weights", format!("holds {} weights; {count} slices need {count}", weights.len())));
    }
    let level = level();
    let mut acc = vec![0f32; slice_len];
    let start = Instant::now();
    for (i, (slice, &w)) in slices.chunks_exact(slice_len).zip(weights).cycle().take(iterations).enumerate() {
        if i == 0 {
            scale_at(level, &mut acc, f32_bytes(slice), w);
        } else {
            axpy_at(level, &mut acc, f32_bytes(slice), w);
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    std::hint::black_box(&acc);
    Ok(seconds)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, seed: u32) -> Vec<f32> {
        (0..n).map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 20011) as f32 / 977.0 - 10.0).collect()
    }

    #[test]
    fn levels_agree_with_scalar() -> Result<()> {
        for n in [0, 1, 7, 8, 15, 16, 17, 31, 63, 64, 65, 100, 1000, 16384, 16385] {
            let x = data(n, 1);
            let base = data(n, 2);
            let mut want = base.clone();
            accumulate_f32_at(Level::Scalar, &mut want, &x, 0.37)?;
            let mut want_scale = vec![0f32; n];
            scale_into_f32_bytes_at(Level::Scalar, &mut want_scale, f32_bytes(&x), 1.7)?;
            let xu: Vec<u32> = x.iter().map(|v| v.to_bits()).collect();
            let mut want_u: Vec<u32> = base.iter().map(|v| v.to_bits()).collect();
            accumulate_u32_bytes_at(Level::Scalar, &mut want_u, u32_bytes(&xu))?;
            for level in available_levels() {
                let mut got = base.clone();
                accumulate_f32_at(level, &mut got, &x, 0.37)?;
                assert_eq!(got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
                let mut got_scale = vec![0f32; n];
                scale_into_f32_bytes_at(level, &mut got_scale, f32_bytes(&x), 1.7)?;
                assert_eq!(got_scale, want_scale);
                let mut got_u: Vec<u32> = base.iter().map(|v| v.to_bits()).collect();
                accumulate_u32_bytes_at(level, &mut got_u, u32_bytes(&xu))?;
                assert_eq!(got_u, want_u);
                assert!(all_finite_f32_bytes_at(level, f32_bytes(&x)));
                for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                    for pos in [0, n / 2, n.saturating_sub(1)] {
                        if n == 0 {
                            continue;
                        }
                        let mut y = x.clone();
                        y[pos] = bad;
                        assert!(!all_finite_f32_bytes_at(level, f32_bytes(&y)), "{level:?} n={n} pos={pos}");
                    }
                }
            }
        }
        Ok(())
    }

    #[test]
    fn unaligned_bytes() -> Result<()> {
        let x = data(1000, 3);
        let mut bytes = vec![0u8; 1];
        bytes.extend_from_slice(f32_bytes(&x));
        let mut want = vec![1f32; 1000];
        accumulate_f32_at(Level::Scalar, &mut want, &x, 2.5)?;
        for level in available_levels() {
            let mut got = vec![1f32; 1000];
            accumulate_f32_bytes_at(level, &mut got, &bytes[1..], 2.5)?;
            assert_eq!(got, want);
        }
        Ok(())
    }

    #[test]
    fn length_mismatch_is_an_error() {
        let mut acc = vec![0f32; 4];
        assert!(accumulate_f32(&mut acc, &[1.0; 3], 1.0).is_err());
        assert!(accumulate_u32(&mut [0u32; 2], &[1u32; 3]).is_err());
        assert!(bench_primitive(&[0.0; 10], 3, &[1.0; 3], 1).is_err());
    }
}
