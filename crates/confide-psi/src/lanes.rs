//! Eight ristretto255 points at a time on AVX-512 IFMA: the PSI hot path.
//!
//! PSI multiplies a million points by one secret scalar. `curve25519-dalek` spends its SIMD
//! units inside one point (four coordinates of one formula side by side); here each of the eight
//! 64-bit lanes of a vector is a different point, so every formula runs once for eight points with
//! no shuffles, and the field products are `vpmadd52luq`/`vpmadd52huq`.
//!
//! * Field elements of GF(2^255 − 19) are five limbs in radix 2^51 (limb i of all eight lanes in
//!   vector i). Every operation returns limbs below 2^52 (IFMA reads 52 bits of each input), so
//!   results chain without checks; products fold the upper five columns back with 2^255 ≡ 19.
//! * Points are extended twisted-Edwards coordinates; doubling and addition are the formulas of
//!   Hisil–Wong–Carter–Dawson (2008) that dalek's serial backend uses, decoding, encoding and the
//!   Elligator map are RFC 9496 §4.3. Outputs are the canonical encodings, byte-equal to dalek's
//!   (the tests compare the two on random and malformed inputs), so parties on machines with and
//!   without IFMA interoperate.
//! * k·P is a signed radix-16 fixed window (63 × (4 doublings + 1 addition)). The scalar is the
//!   same in every lane; table entries are picked by a masked scan of all eight, and nothing
//!   branches on the scalar or on point data.
//!
//! Measured on this machine kind (Xeon with AVX-512 IFMA, one thread, 2026-11-24), per point:
//! k·P from an encoding (decode, multiply, encode) 8.5 µs against 41.0 µs with dalek, k·H(id)
//! (SHA-512, two Elligator maps, multiply, encode) 10.4 µs against 46.6 µs; 1,000,000 ids a side
//! intersect in 21.5 s instead of 63 s (`benchmarks/psi_bench.py`).
#![allow(unsafe_code)]

use std::arch::x86_64::{
    __m512i, __mmask8, _mm512_add_epi64, _mm512_and_si512, _mm512_cmpeq_epi64_mask, _mm512_loadu_si512, _mm512_madd52hi_epu64,
    _mm512_madd52lo_epu64, _mm512_mask_blend_epi64, _mm512_or_si512, _mm512_set1_epi64, _mm512_setzero_si512, _mm512_slli_epi64,
    _mm512_srli_epi64, _mm512_storeu_si512, _mm512_sub_epi64, _mm512_test_epi64_mask,
};
use zeroize::Zeroize;

/// Points per call.
pub(crate) const LANES: usize = 8;
const MASK51: u64 = (1 << 51) - 1;

// Curve constants in radix 2^51 (RFC 9496 §4.1).
const D: [u64; 5] = [0x34dca135978a3, 0x1a8283b156ebd, 0x5e7a26001c029, 0x739c663a03cbb, 0x52036cee2b6ff];
const D2: [u64; 5] = [0x69b9426b2f159, 0x35050762add7a, 0x3cf44c0038052, 0x6738cc7407977, 0x2406d9dc56dff];
const SQRT_M1: [u64; 5] = [0x61b274a0ea0b0, 0xd5a5fc8f189d, 0x7ef5e9cbd0c60, 0x78595a6804c9e, 0x2b8324804fc1d];
const INVSQRT_A_MINUS_D: [u64; 5] = [0xfdaa805d40ea, 0x2eb482e57d339, 0x7610274bc58, 0x6510b613dc8ff, 0x786c8905cfaff];
const SQRT_AD_MINUS_ONE: [u64; 5] = [0x7f6a0497b2e1b, 0x1836f0a97afd2, 0x7d747f6be7638, 0x456079e7e6498, 0x376931bf2b834];
const ONE_MINUS_D_SQ: [u64; 5] = [0x409c1945fc176, 0x719abc6a1fc4f, 0x1c37f90b20684, 0x6bccca55eedf, 0x29072a8b2b3e];
const D_MINUS_ONE_SQ: [u64; 5] = [0x55aaa44ed4d20, 0x59603c3332635, 0x26d3baf4a7928, 0x120a66e6997a9, 0x5968b37af66c2];
/// 2p in radix 2^51: every limb exceeds a reduced limb, so a + 2p − b never underflows.
const TWO_P: [u64; 5] = [0xfffffffffffda, 0xffffffffffffe, 0xffffffffffffe, 0xffffffffffffe, 0xffffffffffffe];

/// Whether this CPU runs the lane engine (and `CONFIDE_DISABLE_IFMA=1` does not turn it off,
/// which the tests use to run the dalek path).
pub(crate) fn available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        std::env::var_os("CONFIDE_DISABLE_IFMA").is_none_or(|v| v == "0")
            && std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512ifma")
    })
}

/// A scalar recoded as 64 signed radix-16 digits in [−8, 8] (least significant first).
/// Zeroized on drop.
pub(crate) struct Digits([i8; 64]);

impl Drop for Digits {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

impl Digits {
    /// Recodes a canonical scalar (below 2^253), without branches on its value.
    pub(crate) fn new(scalar: &[u8; 32]) -> Self {
        let mut d = [0i8; 64];
        for (i, byte) in scalar.iter().enumerate() {
            d[2 * i] = (byte & 15) as i8;
            d[2 * i + 1] = (byte >> 4) as i8;
        }
        for i in 0..63 {
            let carry = (d[i] + 8) >> 4;
            d[i] -= carry << 4;
            d[i + 1] += carry;
        }
        Digits(d)
    }
}

/// One field element per lane.
#[derive(Clone, Copy)]
struct Fe([__m512i; 5]);

#[inline]
#[target_feature(enable = "avx512f")]
fn splat(x: u64) -> __m512i {
    _mm512_set1_epi64(x as i64)
}

#[inline]
#[target_feature(enable = "avx512f")]
fn add64(a: __m512i, b: __m512i) -> __m512i {
    _mm512_add_epi64(a, b)
}

#[inline]
#[target_feature(enable = "avx512f")]
fn times19(x: __m512i) -> __m512i {
    add64(add64(x, _mm512_slli_epi64::<1>(x)), _mm512_slli_epi64::<4>(x))
}

/// Carries limbs below 2^62 down to 51 bits (limb 0 may keep a small excess).
#[inline]
#[target_feature(enable = "avx512f")]
fn carry(mut x: [__m512i; 5]) -> Fe {
    let mask = splat(MASK51);
    for i in 0..4 {
        x[i + 1] = add64(x[i + 1], _mm512_srli_epi64::<51>(x[i]));
        x[i] = _mm512_and_si512(x[i], mask);
    }
    let top = _mm512_srli_epi64::<51>(x[4]);
    x[4] = _mm512_and_si512(x[4], mask);
    x[0] = add64(x[0], times19(top));
    Fe(x)
}

/// Column sums of a product (lo: bits 0..52 of each partial product at its column, hi: bits
/// 52..104) to a reduced element: column k is lo_k + 2·hi_{k−1}, columns 5..9 fold back ×19.
#[inline]
#[target_feature(enable = "avx512f")]
fn reduce(lo: [__m512i; 9], hi: [__m512i; 9]) -> Fe {
    let mut c = [_mm512_setzero_si512(); 10];
    c[0] = lo[0];
    for k in 1..9 {
        c[k] = add64(lo[k], _mm512_slli_epi64::<1>(hi[k - 1]));
    }
    c[9] = _mm512_slli_epi64::<1>(hi[8]);
    // Columns stay below 15·2^52, so the folded ones below 2^62.
    let folded = [
        add64(c[0], times19(c[5])),
        add64(c[1], times19(c[6])),
        add64(c[2], times19(c[7])),
        add64(c[3], times19(c[8])),
        add64(c[4], times19(c[9])),
    ];
    let Fe(mut r) = carry(folded);
    // Limb 0 may hold up to 19·2^11 over 2^51: one more step keeps every limb below 2^52.
    r[1] = add64(r[1], _mm512_srli_epi64::<51>(r[0]));
    r[0] = _mm512_and_si512(r[0], splat(MASK51));
    Fe(r)
}

impl Fe {
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn constant(limbs: [u64; 5]) -> Fe {
        Fe(limbs.map(|l| splat(l)))
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    fn zero() -> Fe {
        Fe([_mm512_setzero_si512(); 5])
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    fn one() -> Fe {
        Fe::constant([1, 0, 0, 0, 0])
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    fn add(self, other: Fe) -> Fe {
        carry(std::array::from_fn(|i| add64(self.0[i], other.0[i])))
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    fn sub(self, other: Fe) -> Fe {
        carry(std::array::from_fn(|i| _mm512_sub_epi64(add64(self.0[i], splat(TWO_P[i])), other.0[i])))
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    fn neg(self) -> Fe {
        Fe::zero().sub(self)
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512ifma")]
    fn mul(self, other: Fe) -> Fe {
        let (a, b) = (self.0, other.0);
        let mut lo = [_mm512_setzero_si512(); 9];
        let mut hi = [_mm512_setzero_si512(); 9];
        for i in 0..5 {
            for j in 0..5 {
                lo[i + j] = _mm512_madd52lo_epu64(lo[i + j], a[i], b[j]);
                hi[i + j] = _mm512_madd52hi_epu64(hi[i + j], a[i], b[j]);
            }
        }
        reduce(lo, hi)
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512ifma")]
    fn square(self) -> Fe {
        let a = self.0;
        let mut lo = [_mm512_setzero_si512(); 9];
        let mut hi = [_mm512_setzero_si512(); 9];
        for i in 0..5 {
            for j in i + 1..5 {
                lo[i + j] = _mm512_madd52lo_epu64(lo[i + j], a[i], a[j]);
                hi[i + j] = _mm512_madd52hi_epu64(hi[i + j], a[i], a[j]);
            }
        }
        for k in 0..9 {
            lo[k] = _mm512_slli_epi64::<1>(lo[k]);
            hi[k] = _mm512_slli_epi64::<1>(hi[k]);
        }
        for i in 0..5 {
            lo[2 * i] = _mm512_madd52lo_epu64(lo[2 * i], a[i], a[i]);
            hi[2 * i] = _mm512_madd52hi_epu64(hi[2 * i], a[i], a[i]);
        }
        reduce(lo, hi)
    }

    /// self^(2^k).
    #[inline]
    #[target_feature(enable = "avx512f,avx512ifma")]
    fn square_times(self, k: u32) -> Fe {
        let mut x = self;
        for _ in 0..k {
            x = x.square();
        }
        x
    }

    /// self^((p − 5)/8) = self^(2^252 − 3), by the usual addition chain.
    #[target_feature(enable = "avx512f,avx512ifma")]
    fn pow_p58(self) -> Fe {
        let t0 = self.square(); // 2
        let t1 = t0.square_times(2).mul(self); // 9
        let t0 = t0.mul(t1); // 11
        let t1 = t0.square().mul(t1); // 31 = 2^5 − 1
        let t2 = t1.square_times(5).mul(t1); // 2^10 − 1
        let t3 = t2.square_times(10).mul(t2); // 2^20 − 1
        let t4 = t3.square_times(20).mul(t3); // 2^40 − 1
        let t5 = t4.square_times(10).mul(t2); // 2^50 − 1
        let t6 = t5.square_times(50).mul(t5); // 2^100 − 1
        let t7 = t6.square_times(100).mul(t6); // 2^200 − 1
        let t8 = t7.square_times(50).mul(t5); // 2^250 − 1
        t8.square_times(2).mul(self) // 2^252 − 3
    }

    /// The canonical representative (limbs below 2^51, value below p).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn freeze(self) -> Fe {
        let Fe(mut x) = carry(self.0);
        // q = 1 exactly when x ≥ p, i.e. when x + 19 carries out of 2^255.
        let mut q = _mm512_srli_epi64::<51>(add64(x[0], splat(19)));
        for limb in &x[1..] {
            q = _mm512_srli_epi64::<51>(add64(*limb, q));
        }
        x[0] = add64(x[0], times19(q));
        let mask = splat(MASK51);
        for i in 0..4 {
            x[i + 1] = add64(x[i + 1], _mm512_srli_epi64::<51>(x[i]));
            x[i] = _mm512_and_si512(x[i], mask);
        }
        x[4] = _mm512_and_si512(x[4], mask);
        Fe(x)
    }

    /// Lanes whose canonical value is odd ("negative" in RFC 9496).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn is_negative(self) -> __mmask8 {
        _mm512_test_epi64_mask(self.freeze().0[0], splat(1))
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    fn is_zero(self) -> __mmask8 {
        let x = self.freeze().0;
        let any = _mm512_or_si512(_mm512_or_si512(_mm512_or_si512(x[0], x[1]), _mm512_or_si512(x[2], x[3])), x[4]);
        _mm512_cmpeq_epi64_mask(any, _mm512_setzero_si512())
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    fn equals(self, other: Fe) -> __mmask8 {
        self.sub(other).is_zero()
    }

    /// `other` in the lanes of `mask`, `self` elsewhere.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn select(self, mask: __mmask8, other: Fe) -> Fe {
        Fe(std::array::from_fn(|i| _mm512_mask_blend_epi64(mask, self.0[i], other.0[i])))
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    fn negate_where(self, mask: __mmask8) -> Fe {
        self.select(mask, self.neg())
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    fn abs(self) -> Fe {
        self.negate_where(self.is_negative())
    }

    /// Lane i from `bytes[i]` (little-endian, bit 255 ignored; values ≥ p are taken mod p).
    #[target_feature(enable = "avx512f")]
    fn load(bytes: &[[u8; 32]; LANES]) -> Fe {
        let mut limbs = [[0u64; LANES]; 5];
        for (lane, b) in bytes.iter().enumerate() {
            let w: [u64; 4] = std::array::from_fn(|i| u64::from_le_bytes(std::array::from_fn(|j| b[8 * i + j])));
            limbs[0][lane] = w[0] & MASK51;
            limbs[1][lane] = ((w[0] >> 51) | (w[1] << 13)) & MASK51;
            limbs[2][lane] = ((w[1] >> 38) | (w[2] << 26)) & MASK51;
            limbs[3][lane] = ((w[2] >> 25) | (w[3] << 39)) & MASK51;
            limbs[4][lane] = (w[3] >> 12) & MASK51;
        }
        // SAFETY: each source is 8 u64 = 64 bytes; unaligned loads are allowed.
        Fe(limbs.map(|l| unsafe { _mm512_loadu_si512(l.as_ptr().cast()) }))
    }

    /// The canonical 32-byte encodings of the eight lanes.
    #[target_feature(enable = "avx512f")]
    fn store(self) -> [[u8; 32]; LANES] {
        let x = self.freeze().0;
        let mut limbs = [[0u64; LANES]; 5];
        for (dst, v) in limbs.iter_mut().zip(x) {
            // SAFETY: each destination is 8 u64 = 64 bytes; unaligned stores are allowed.
            unsafe { _mm512_storeu_si512(dst.as_mut_ptr().cast(), v) };
        }
        std::array::from_fn(|lane| {
            let l: [u64; 5] = std::array::from_fn(|i| limbs[i][lane]);
            let w = [l[0] | (l[1] << 51), (l[1] >> 13) | (l[2] << 38), (l[2] >> 26) | (l[3] << 25), (l[3] >> 39) | (l[4] << 12)];
            let mut out = [0u8; 32];
            for (chunk, word) in out.chunks_exact_mut(8).zip(w) {
                chunk.copy_from_slice(&word.to_le_bytes());
            }
            out
        })
    }
}

/// (u/v is a square, √(u/v)) per lane, RFC 9496 §4.2 SQRT_RATIO_M1 (the root's non-negative
/// representative; i·√(u/v) when u/v is not a square).
#[target_feature(enable = "avx512f,avx512ifma")]
fn sqrt_ratio_m1(u: Fe, v: Fe) -> (__mmask8, Fe) {
    let v3 = v.square().mul(v);
    let v7 = v3.square().mul(v);
    let r = u.mul(v3).mul(u.mul(v7).pow_p58());
    let check = v.mul(r.square());
    let sqrt_m1 = Fe::constant(SQRT_M1);
    let minus_u = u.neg();
    let correct = check.equals(u);
    let flipped = check.equals(minus_u);
    let flipped_i = check.equals(minus_u.mul(sqrt_m1));
    let r = r.select(flipped | flipped_i, r.mul(sqrt_m1)).abs();
    (correct | flipped, r)
}

/// Extended coordinates: x = X/Z, y = Y/Z, x·y = T/Z.
#[derive(Clone, Copy)]
struct Extended {
    x: Fe,
    y: Fe,
    z: Fe,
    t: Fe,
}

/// Projective coordinates (no T), between doublings.
#[derive(Clone, Copy)]
struct Projective {
    x: Fe,
    y: Fe,
    z: Fe,
}

/// ((X:Z), (Y:T)): the output of an addition or doubling before its last products.
#[derive(Clone, Copy)]
struct Completed {
    x: Fe,
    y: Fe,
    z: Fe,
    t: Fe,
}

/// An addend prepared for additions: (Y + X, Y − X, Z, 2d·T).
#[derive(Clone, Copy)]
struct Cached {
    y_plus_x: Fe,
    y_minus_x: Fe,
    z: Fe,
    t2d: Fe,
}

impl Completed {
    #[inline]
    #[target_feature(enable = "avx512f,avx512ifma")]
    fn extended(self) -> Extended {
        Extended { x: self.x.mul(self.t), y: self.y.mul(self.z), z: self.z.mul(self.t), t: self.x.mul(self.y) }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512ifma")]
    fn projective(self) -> Projective {
        Projective { x: self.x.mul(self.t), y: self.y.mul(self.z), z: self.z.mul(self.t) }
    }
}

impl Projective {
    #[inline]
    #[target_feature(enable = "avx512f,avx512ifma")]
    fn double(self) -> Completed {
        let xx = self.x.square();
        let yy = self.y.square();
        let zz = self.z.square();
        let zz2 = zz.add(zz);
        let x_plus_y_sq = self.x.add(self.y).square();
        let yy_plus_xx = yy.add(xx);
        let yy_minus_xx = yy.sub(xx);
        Completed { x: x_plus_y_sq.sub(yy_plus_xx), y: yy_plus_xx, z: yy_minus_xx, t: zz2.sub(yy_minus_xx) }
    }
}

impl Extended {
    #[inline]
    #[target_feature(enable = "avx512f,avx512ifma")]
    fn cached(self) -> Cached {
        Cached { y_plus_x: self.y.add(self.x), y_minus_x: self.y.sub(self.x), z: self.z, t2d: self.t.mul(Fe::constant(D2)) }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512ifma")]
    fn add(self, other: &Cached) -> Completed {
        let pp = self.y.add(self.x).mul(other.y_plus_x);
        let mm = self.y.sub(self.x).mul(other.y_minus_x);
        let tt2d = self.t.mul(other.t2d);
        let zz = self.z.mul(other.z);
        let zz2 = zz.add(zz);
        Completed { x: pp.sub(mm), y: pp.add(mm), z: zz2.add(tt2d), t: zz2.sub(tt2d) }
    }

    /// k·self, k given by its digits; the same work whatever the digits.
    #[target_feature(enable = "avx512f,avx512ifma")]
    fn mul(self, k: &Digits) -> Extended {
        // table[j] = (j + 1)·self.
        let mut table = [self.cached(); 8];
        for j in 1..8 {
            table[j] = self.add(&table[j - 1]).extended().cached();
        }
        let select = |digit: i8| -> Cached {
            let sign = digit >> 7; // 0 or −1
            let magnitude = ((digit ^ sign) - sign) as u64;
            let one = Fe::one();
            let mut pick = Cached { y_plus_x: one, y_minus_x: one, z: one, t2d: Fe::zero() };
            for (j, entry) in table.iter().enumerate() {
                let hit = _mm512_cmpeq_epi64_mask(splat(magnitude), splat(j as u64 + 1));
                pick = Cached {
                    y_plus_x: pick.y_plus_x.select(hit, entry.y_plus_x),
                    y_minus_x: pick.y_minus_x.select(hit, entry.y_minus_x),
                    z: pick.z.select(hit, entry.z),
                    t2d: pick.t2d.select(hit, entry.t2d),
                };
            }
            let negative = _mm512_cmpeq_epi64_mask(splat(sign as u64 & 1), splat(1));
            Cached {
                y_plus_x: pick.y_plus_x.select(negative, pick.y_minus_x),
                y_minus_x: pick.y_minus_x.select(negative, pick.y_plus_x),
                z: pick.z,
                t2d: pick.t2d.negate_where(negative),
            }
        };
        let (zero, one) = (Fe::zero(), Fe::one());
        let identity = Extended { x: zero, y: one, z: one, t: zero };
        let mut sum = identity.add(&select(k.0[63]));
        for i in (0..63).rev() {
            let mut q = sum.projective();
            for _ in 0..3 {
                q = q.double().projective();
            }
            sum = q.double().extended().add(&select(k.0[i]));
        }
        sum.extended()
    }

    /// The canonical encodings (RFC 9496 §4.3.2).
    #[target_feature(enable = "avx512f,avx512ifma")]
    fn encode(self) -> [[u8; 32]; LANES] {
        let Extended { x, y, z, t } = self;
        let u1 = z.add(y).mul(z.sub(y));
        let u2 = x.mul(y);
        let (_, invsqrt) = sqrt_ratio_m1(Fe::one(), u1.mul(u2.square()));
        let den1 = invsqrt.mul(u1);
        let den2 = invsqrt.mul(u2);
        let z_inv = den1.mul(den2).mul(t);
        let sqrt_m1 = Fe::constant(SQRT_M1);
        let rotate = t.mul(z_inv).is_negative();
        let x_out = x.select(rotate, y.mul(sqrt_m1));
        let y_out = y.select(rotate, x.mul(sqrt_m1));
        let den_inv = den2.select(rotate, den1.mul(Fe::constant(INVSQRT_A_MINUS_D)));
        let y_out = y_out.negate_where(x_out.mul(z_inv).is_negative());
        den_inv.mul(z.sub(y_out)).abs().store()
    }
}

/// Decodes eight encodings (RFC 9496 §4.3.1); the mask has a bit set for each lane that is not
/// the canonical encoding of a point other than the identity.
#[target_feature(enable = "avx512f,avx512ifma")]
fn decode(bytes: &[[u8; 32]; LANES]) -> (Extended, __mmask8) {
    let mut refused: __mmask8 = 0;
    for (lane, b) in bytes.iter().enumerate() {
        // Canonical and non-negative: below p, bit 255 clear, even; the all-zero string is the
        // identity, which no honest party sends.
        let at_least_p = b[31] == 0x7f && b[1..31].iter().all(|&x| x == 0xff) && b[0] >= 0xed;
        let bad = b[31] & 0x80 != 0 || at_least_p || b[0] & 1 == 1 || b.iter().all(|&x| x == 0);
        refused |= u8::from(bad) << lane;
    }
    let s = Fe::load(bytes);
    let one = Fe::one();
    let ss = s.square();
    let u1 = one.sub(ss);
    let u2 = one.add(ss);
    let u2_sq = u2.square();
    let v = Fe::constant(D).mul(u1.square()).neg().sub(u2_sq);
    let (was_square, invsqrt) = sqrt_ratio_m1(one, v.mul(u2_sq));
    let den_x = invsqrt.mul(u2);
    let den_y = invsqrt.mul(den_x).mul(v);
    let x = s.add(s).mul(den_x).abs();
    let y = u1.mul(den_y);
    let t = x.mul(y);
    refused |= !was_square | t.is_negative() | y.is_zero();
    (Extended { x, y, z: one, t }, refused)
}

/// The Elligator map of RFC 9496 §4.3.4 on eight field elements.
#[target_feature(enable = "avx512f,avx512ifma")]
fn elligator(r0: Fe) -> Extended {
    let one = Fe::one();
    let d = Fe::constant(D);
    let r = Fe::constant(SQRT_M1).mul(r0.square());
    let ns = r.add(one).mul(Fe::constant(ONE_MINUS_D_SQ));
    let minus_one = one.neg();
    let den = minus_one.sub(d.mul(r)).mul(r.add(d));
    let (is_square, s) = sqrt_ratio_m1(ns, den);
    let s_prime = s.mul(r0);
    let s_prime = s_prime.negate_where(!s_prime.is_negative());
    let s = s.select(!is_square, s_prime);
    let c = minus_one.select(!is_square, r);
    let nt = c.mul(r.sub(one)).mul(Fe::constant(D_MINUS_ONE_SQ)).sub(den);
    let s_sq = s.square();
    Completed { x: s.add(s).mul(den), z: nt.mul(Fe::constant(SQRT_AD_MINUS_ONE)), y: one.sub(s_sq), t: one.add(s_sq) }.extended()
}

#[target_feature(enable = "avx512f,avx512ifma")]
fn hash_and_blind_inner(uniform: &[[u8; 64]; LANES], k: &Digits) -> [[u8; 32]; LANES] {
    let half = |offset: usize| Fe::load(&std::array::from_fn(|lane| std::array::from_fn(|j| uniform[lane][offset + j])));
    let point = elligator(half(0)).add(&elligator(half(32)).cached()).extended();
    point.mul(k).encode()
}

#[target_feature(enable = "avx512f,avx512ifma")]
fn blind_inner(points: &[[u8; 32]; LANES], k: &Digits) -> ([[u8; 32]; LANES], __mmask8) {
    let (point, refused) = decode(points);
    (point.mul(k).encode(), refused)
}

/// k·H for eight 64-byte hash outputs (H = ristretto255's one-way map of them), encoded.
/// Call only when [`available`] is true.
pub(crate) fn hash_and_blind(uniform: &[[u8; 64]; LANES], k: &Digits) -> [[u8; 32]; LANES] {
    assert_available();
    // SAFETY: `assert_available` checked AVX-512F and IFMA on this CPU.
    unsafe { hash_and_blind_inner(uniform, k) }
}

/// k·P for eight encodings; bit i of the mask is set when `points[i]` is not the canonical
/// encoding of a non-identity point (its output is then meaningless). Call only when
/// [`available`] is true.
pub(crate) fn blind(points: &[[u8; 32]; LANES], k: &Digits) -> ([[u8; 32]; LANES], u8) {
    assert_available();
    // SAFETY: `assert_available` checked AVX-512F and IFMA on this CPU.
    unsafe { blind_inner(points, k) }
}

fn assert_available() {
    // The callers pick this engine only after `available()`; a violation is a bug in this crate.
    #[allow(clippy::panic)]
    if !(std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512ifma")) {
        panic!("confide-psi: the IFMA engine was called on a CPU without AVX-512 IFMA");
    }
}
