//! x86-64 SIMD bodies of the aggregation primitive (AVX-512F and AVX2+FMA).
//! Every function here reads its input through unaligned loads from a byte
//! pointer, so payload bytes can be folded in place at any offset of a batch.
//! Callers (`kernels.rs`) check lengths and CPU features before calling.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

/// acc[i] += w · x[i] (fused), AVX-512F; `x` holds 4·acc.len() bytes.
pub(crate) fn axpy_avx512(acc: &mut [f32], x: &[u8], w: f32) {
    debug_assert_eq!(x.len(), acc.len() * 4);
    if x.len() != acc.len() * 4 || !std::arch::is_x86_feature_detected!("avx512f") {
        return;
    }
    // SAFETY: avx512f was detected; lengths were checked equal (in values).
    unsafe { axpy_avx512_inner(acc.as_mut_ptr(), x.as_ptr(), acc.len(), w) }
}

#[target_feature(enable = "avx512f")]
unsafe fn axpy_avx512_inner(acc: *mut f32, x: *const u8, n: usize, w: f32) {
    let x = x.cast::<f32>();
    let wv = _mm512_set1_ps(w);
    let mut i = 0;
    // SAFETY (whole function): every access is at an index < n of two buffers
    // holding n values; loads/stores are unaligned variants.
    unsafe {
        while i + 64 <= n {
            let a0 = _mm512_fmadd_ps(_mm512_loadu_ps(x.add(i)), wv, _mm512_loadu_ps(acc.add(i)));
            let a1 = _mm512_fmadd_ps(_mm512_loadu_ps(x.add(i + 16)), wv, _mm512_loadu_ps(acc.add(i + 16)));
            let a2 = _mm512_fmadd_ps(_mm512_loadu_ps(x.add(i + 32)), wv, _mm512_loadu_ps(acc.add(i + 32)));
            let a3 = _mm512_fmadd_ps(_mm512_loadu_ps(x.add(i + 48)), wv, _mm512_loadu_ps(acc.add(i + 48)));
            _mm512_storeu_ps(acc.add(i), a0);
            _mm512_storeu_ps(acc.add(i + 16), a1);
            _mm512_storeu_ps(acc.add(i + 32), a2);
            _mm512_storeu_ps(acc.add(i + 48), a3);
            i += 64;
        }
        while i < n {
            let left = (n - i).min(16);
            let mask: __mmask16 = if left == 16 { 0xFFFF } else { (1u16 << left) - 1 };
            let a = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, x.add(i)), wv, _mm512_maskz_loadu_ps(mask, acc.add(i)));
            _mm512_mask_storeu_ps(acc.add(i), mask, a);
            i += left;
        }
    }
}

/// acc[i] = w · x[i], AVX-512F.
pub(crate) fn scale_avx512(acc: &mut [f32], x: &[u8], w: f32) {
    if x.len() != acc.len() * 4 || !std::arch::is_x86_feature_detected!("avx512f") {
        return;
    }
    // SAFETY: avx512f was detected; lengths were checked equal (in values).
    unsafe { scale_avx512_inner(acc.as_mut_ptr(), x.as_ptr(), acc.len(), w) }
}

#[target_feature(enable = "avx512f")]
unsafe fn scale_avx512_inner(acc: *mut f32, x: *const u8, n: usize, w: f32) {
    let x = x.cast::<f32>();
    let wv = _mm512_set1_ps(w);
    let mut i = 0;
    // SAFETY: indices < n of two n-value buffers, unaligned accesses.
    unsafe {
        while i + 64 <= n {
            let a0 = _mm512_mul_ps(_mm512_loadu_ps(x.add(i)), wv);
            let a1 = _mm512_mul_ps(_mm512_loadu_ps(x.add(i + 16)), wv);
            let a2 = _mm512_mul_ps(_mm512_loadu_ps(x.add(i + 32)), wv);
            let a3 = _mm512_mul_ps(_mm512_loadu_ps(x.add(i + 48)), wv);
            _mm512_storeu_ps(acc.add(i), a0);
            _mm512_storeu_ps(acc.add(i + 16), a1);
            _mm512_storeu_ps(acc.add(i + 32), a2);
            _mm512_storeu_ps(acc.add(i + 48), a3);
            i += 64;
        }
        while i < n {
            let left = (n - i).min(16);
            let mask: __mmask16 = if left == 16 { 0xFFFF } else { (1u16 << left) - 1 };
            _mm512_mask_storeu_ps(acc.add(i), mask, _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, x.add(i)), wv));
            i += left;
        }
    }
}

/// Whether no 32-bit word of `x` has an all-ones float exponent, AVX-512F.
pub(crate) fn finite_avx512(x: &[u8]) -> Option<bool> {
    if !x.len().is_multiple_of(4) || !std::arch::is_x86_feature_detected!("avx512f") {
        return None;
    }
    // SAFETY: avx512f was detected; x holds x.len()/4 words.
    Some(unsafe { finite_avx512_inner(x.as_ptr(), x.len() / 4) })
}

#[target_feature(enable = "avx512f")]
unsafe fn finite_avx512_inner(x: *const u8, n: usize) -> bool {
    let x = x.cast::<i32>();
    let exp = _mm512_set1_epi32(0x7F80_0000);
    let mut bad: __mmask16 = 0;
    let mut i = 0;
    // SAFETY: indices < n of an n-word buffer, unaligned loads.
    unsafe {
        while i + 64 <= n {
            let v0 = _mm512_and_si512(_mm512_loadu_si512(x.add(i).cast()), exp);
            let v1 = _mm512_and_si512(_mm512_loadu_si512(x.add(i + 16).cast()), exp);
            let v2 = _mm512_and_si512(_mm512_loadu_si512(x.add(i + 32).cast()), exp);
            let v3 = _mm512_and_si512(_mm512_loadu_si512(x.add(i + 48).cast()), exp);
            bad |= _mm512_cmpeq_epi32_mask(v0, exp)
                | _mm512_cmpeq_epi32_mask(v1, exp)
                | _mm512_cmpeq_epi32_mask(v2, exp)
                | _mm512_cmpeq_epi32_mask(v3, exp);
            i += 64;
        }
        while i < n {
            let left = (n - i).min(16);
            let mask: __mmask16 = if left == 16 { 0xFFFF } else { (1u16 << left) - 1 };
            let v = _mm512_and_si512(_mm512_maskz_loadu_epi32(mask, x.add(i)), exp);
            bad |= _mm512_mask_cmpeq_epi32_mask(mask, v, exp);
            i += left;
        }
    }
    bad == 0
}

/// acc[i] = acc[i] + x[i] mod 2^32, AVX-512F.
pub(crate) fn add_u32_avx512(acc: &mut [u32], x: &[u8]) {
    if x.len() != acc.len() * 4 || !std::arch::is_x86_feature_detected!("avx512f") {
        return;
    }
    // SAFETY: avx512f was detected; lengths were checked equal (in values).
    unsafe { add_u32_avx512_inner(acc.as_mut_ptr(), x.as_ptr(), acc.len()) }
}

#[target_feature(enable = "avx512f")]
unsafe fn add_u32_avx512_inner(acc: *mut u32, x: *const u8, n: usize) {
    let x = x.cast::<u32>();
    let mut i = 0;
    // SAFETY: indices < n of two n-word buffers, unaligned accesses.
    unsafe {
        while i + 64 <= n {
            for k in [0, 16, 32, 48] {
                let a = _mm512_add_epi32(_mm512_loadu_si512(x.add(i + k).cast()), _mm512_loadu_si512(acc.add(i + k).cast()));
                _mm512_storeu_si512(acc.add(i + k).cast(), a);
            }
            i += 64;
        }
        while i < n {
            let left = (n - i).min(16);
            let mask: __mmask16 = if left == 16 { 0xFFFF } else { (1u16 << left) - 1 };
            let a = _mm512_add_epi32(_mm512_maskz_loadu_epi32(mask, x.add(i).cast()), _mm512_maskz_loadu_epi32(mask, acc.add(i).cast()));
            _mm512_mask_storeu_epi32(acc.add(i).cast(), mask, a);
            i += left;
        }
    }
}

fn avx2_fma() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

/// acc[i] += w · x[i] (fused), AVX2 + FMA.
pub(crate) fn axpy_avx2(acc: &mut [f32], x: &[u8], w: f32) {
    if x.len() != acc.len() * 4 || !avx2_fma() {
        return;
    }
    // SAFETY: avx2 and fma were detected; lengths were checked equal (in values).
    unsafe { axpy_avx2_inner(acc, x.as_ptr(), w) }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn axpy_avx2_inner(acc: &mut [f32], x: *const u8, w: f32) {
    let n = acc.len();
    let x = x.cast::<f32>();
    let a = acc.as_mut_ptr();
    let wv = _mm256_set1_ps(w);
    let mut i = 0;
    // SAFETY: indices < n of two n-value buffers, unaligned accesses.
    unsafe {
        while i + 32 <= n {
            let a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x.add(i)), wv, _mm256_loadu_ps(a.add(i)));
            let a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x.add(i + 8)), wv, _mm256_loadu_ps(a.add(i + 8)));
            let a2 = _mm256_fmadd_ps(_mm256_loadu_ps(x.add(i + 16)), wv, _mm256_loadu_ps(a.add(i + 16)));
            let a3 = _mm256_fmadd_ps(_mm256_loadu_ps(x.add(i + 24)), wv, _mm256_loadu_ps(a.add(i + 24)));
            _mm256_storeu_ps(a.add(i), a0);
            _mm256_storeu_ps(a.add(i + 8), a1);
            _mm256_storeu_ps(a.add(i + 16), a2);
            _mm256_storeu_ps(a.add(i + 24), a3);
            i += 32;
        }
        while i + 8 <= n {
            _mm256_storeu_ps(a.add(i), _mm256_fmadd_ps(_mm256_loadu_ps(x.add(i)), wv, _mm256_loadu_ps(a.add(i))));
            i += 8;
        }
        while i < n {
            *a.add(i) = x.add(i).read_unaligned().mul_add(w, *a.add(i));
            i += 1;
        }
    }
}

/// acc[i] = w · x[i], AVX2.
pub(crate) fn scale_avx2(acc: &mut [f32], x: &[u8], w: f32) {
    if x.len() != acc.len() * 4 || !avx2_fma() {
        return;
    }
    // SAFETY: avx2 was detected; lengths were checked equal (in values).
    unsafe { scale_avx2_inner(acc, x.as_ptr(), w) }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn scale_avx2_inner(acc: &mut [f32], x: *const u8, w: f32) {
    let n = acc.len();
    let x = x.cast::<f32>();
    let a = acc.as_mut_ptr();
    let wv = _mm256_set1_ps(w);
    let mut i = 0;
    // SAFETY: indices < n of two n-value buffers, unaligned accesses.
    unsafe {
        while i + 32 <= n {
            for k in [0, 8, 16, 24] {
                _mm256_storeu_ps(a.add(i + k), _mm256_mul_ps(_mm256_loadu_ps(x.add(i + k)), wv));
            }
            i += 32;
        }
        while i < n {
            *a.add(i) = x.add(i).read_unaligned() * w;
            i += 1;
        }
    }
}

/// Finite check, AVX2.
pub(crate) fn finite_avx2(x: &[u8]) -> Option<bool> {
    if !x.len().is_multiple_of(4) || !avx2_fma() {
        return None;
    }
    // SAFETY: avx2 was detected; x holds x.len()/4 words.
    Some(unsafe { finite_avx2_inner(x.as_ptr(), x.len() / 4) })
}

#[target_feature(enable = "avx2,fma")]
unsafe fn finite_avx2_inner(x: *const u8, n: usize) -> bool {
    let x = x.cast::<i32>();
    let exp = _mm256_set1_epi32(0x7F80_0000);
    let mut bad = _mm256_setzero_si256();
    let mut i = 0;
    // SAFETY: indices < n of an n-word buffer, unaligned loads.
    unsafe {
        while i + 32 <= n {
            for k in [0, 8, 16, 24] {
                let v = _mm256_and_si256(_mm256_loadu_si256(x.add(i + k).cast()), exp);
                bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(v, exp));
            }
            i += 32;
        }
        let mut ok = _mm256_testz_si256(bad, bad) == 1;
        while i < n {
            ok &= x.add(i).read_unaligned() & 0x7F80_0000 != 0x7F80_0000;
            i += 1;
        }
        ok
    }
}

/// Wrapping u32 add, AVX2.
pub(crate) fn add_u32_avx2(acc: &mut [u32], x: &[u8]) {
    if x.len() != acc.len() * 4 || !avx2_fma() {
        return;
    }
    // SAFETY: avx2 was detected; lengths were checked equal (in values).
    unsafe { add_u32_avx2_inner(acc, x.as_ptr()) }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn add_u32_avx2_inner(acc: &mut [u32], x: *const u8) {
    let n = acc.len();
    let x = x.cast::<u32>();
    let a = acc.as_mut_ptr();
    let mut i = 0;
    // SAFETY: indices < n of two n-word buffers, unaligned accesses.
    unsafe {
        while i + 32 <= n {
            for k in [0, 8, 16, 24] {
                let v = _mm256_add_epi32(_mm256_loadu_si256(x.add(i + k).cast()), _mm256_loadu_si256(a.add(i + k).cast()));
                _mm256_storeu_si256(a.add(i + k).cast(), v);
            }
            i += 32;
        }
        while i < n {
            *a.add(i) = (*a.add(i)).wrapping_add(x.add(i).read_unaligned());
            i += 1;
        }
    }
}
