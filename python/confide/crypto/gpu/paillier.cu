/*
 * Multi-precision arithmetic of the GPU Paillier engine (docs/crypto.md, "GPU engine").
 *
 * One source, two builds:
 *   - on the GPU, compiled at run time by NVRTC to PTX (confide.crypto.gpu.compile_ptx);
 *   - on the CPU, compiled by the system C compiler into a shared library that the test suite
 *     checks against GMP bit for bit (tests/unit/crypto/test_gpu_engine.py), so the arithmetic is tested
 *     on machines that have no GPU.
 * CF_LIMBS (32-bit limbs of the modulus M) is fixed at compile time, so the Montgomery
 * accumulator t[] is fully unrolled and lives in registers on the GPU.
 *
 * Layout: every batch array is limb-major ("structure of arrays"): limb k of item i sits at
 * x[k * count + i], so the 32 threads of a warp read one limb of 32 items in one transaction.
 * Each kernel is a grid-stride loop over items; on the CPU the same loop runs with start 0 and
 * stride 1.
 *
 * Montgomery multiplication is CIOS (Koc, Acar, Kaliski 1996) with R = 2^(32 * CF_LIMBS) and a
 * final conditional subtraction, so every result is fully reduced (< M) and canonical: the same
 * inputs give the same bytes as GMP.
 */

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define CF_FN static __device__ __forceinline__
#define CF_HEAVY static __device__ __noinline__
#define CF_KERNEL extern "C" __global__ void
#define CF_START (blockIdx.x * blockDim.x + threadIdx.x)
#define CF_STRIDE (blockDim.x * gridDim.x)
#define CF_UNROLL _Pragma("unroll")
#define CF_NO_UNROLL _Pragma("unroll 1")
#define CF_RESTRICT __restrict__
#else
#define CF_FN static inline
#define CF_HEAVY static
#ifdef __cplusplus
#define CF_KERNEL extern "C" void
#else
#define CF_KERNEL void
#endif
#define CF_START 0u
#define CF_STRIDE 1u
#define CF_UNROLL
#define CF_NO_UNROLL
#define CF_RESTRICT
#endif

#ifndef CF_LIMBS
#error "CF_LIMBS (32-bit limbs of the modulus) must be defined"
#endif
#define NL CF_LIMBS
/* Largest fixed window of cf_pow (2^w - 1 table entries per item). */
#define CF_MAX_POW_WINDOW 6

typedef unsigned int u32;
typedef unsigned long long u64;

/*
 * r = a * b * R^-1 mod m, for a, b < m (m odd, m < R). a, b and r are read/written with
 * strides sa, sb, sr (limb k of a at a[k * sa]). r may alias a or b: it is written only after
 * every limb of both was read. minv = -m^-1 mod 2^32.
 */
CF_HEAVY void cf_montmul(u32 *r, u32 sr, const u32 *a, u32 sa, const u32 *b, u32 sb, const u32 *CF_RESTRICT m,
                      u32 minv) {
    u32 t[NL + 2];
    CF_UNROLL
    for (int k = 0; k < NL + 2; k++) t[k] = 0;
    CF_NO_UNROLL
    for (int i = 0; i < NL; i++) {
        const u32 bi = b[(u64)i * sb];
        u64 c = 0;
        CF_UNROLL
        for (int j = 0; j < NL; j++) {
            c += (u64)a[(u64)j * sa] * bi + t[j];
            t[j] = (u32)c;
            c >>= 32;
        }
        c += t[NL];
        t[NL] = (u32)c;
        t[NL + 1] = (u32)(c >> 32);
        const u32 q = t[0] * minv;
        c = ((u64)q * m[0] + t[0]) >> 32;
        CF_UNROLL
        for (int j = 1; j < NL; j++) {
            c += (u64)q * m[j] + t[j];
            t[j - 1] = (u32)c;
            c >>= 32;
        }
        c += t[NL];
        t[NL - 1] = (u32)c;
        t[NL] = t[NL + 1] + (u32)(c >> 32);
    }
    /* t < 2m: subtract m once when t >= m (t[NL] set, or no borrow). */
    u32 borrow = 0;
    CF_UNROLL
    for (int j = 0; j < NL; j++) {
        const u64 d = (u64)t[j] - m[j] - borrow;
        borrow = (u32)(d >> 63);
    }
    const u32 take = (t[NL] != 0) | (borrow == 0);
    borrow = 0;
    CF_UNROLL
    for (int j = 0; j < NL; j++) {
        const u64 d = (u64)t[j] - m[j] - borrow;
        borrow = (u32)(d >> 63);
        r[(u64)j * sr] = take ? (u32)d : t[j];
    }
}

/* Copies NL limbs between strided arrays. */
CF_FN void cf_copy(u32 *r, u32 sr, const u32 *a, u32 sa) {
    CF_UNROLL
    for (int j = 0; j < NL; j++) r[(u64)j * sr] = a[(u64)j * sa];
}

/* Bits [pos, pos + w) of the little-endian limb array e (stride se); w <= 32. */
CF_FN u32 cf_bits(const u32 *e, u64 se, u32 limbs, u32 pos, u32 w) {
    const u32 k = pos >> 5, s = pos & 31;
    u64 v = k < limbs ? e[k * se] : 0;
    if (k + 1 < limbs) v |= (u64)e[(k + 1) * se] << 32;
    return (u32)(v >> s) & (u32)((1ull << w) - 1);
}

/*
 * In place: x_i = x_i * y mod m for every item, y given as a single (shared) Montgomery factor.
 * With y = R^2 mod m this converts to Montgomery form; with y = 1 it converts back.
 */
CF_KERNEL cf_mul_shared(u32 *x, u32 count, const u32 *CF_RESTRICT y, const u32 *CF_RESTRICT m, u32 minv) {
    for (u32 i = CF_START; i < count; i += CF_STRIDE) cf_montmul(x + i, count, x + i, count, y, 1, m, minv);
}

/*
 * out_i = a_i * b_i mod m (normal form in, normal form out): two Montgomery products, the
 * second by r2 = R^2 mod m. out may alias a or b. The aggregator's ciphertext sum.
 */
CF_KERNEL cf_mulmod(u32 *out, const u32 *a, const u32 *b, u32 count, const u32 *CF_RESTRICT r2,
                    const u32 *CF_RESTRICT m, u32 minv) {
    for (u32 i = CF_START; i < count; i += CF_STRIDE) {
        cf_montmul(out + i, count, a + i, count, b + i, count, m, minv);
        cf_montmul(out + i, count, out + i, count, r2, 1, m, minv);
    }
}

/*
 * acc = the product of T[j][d_j - 1] over the rows j in [first, stop) whose digit d_j of the
 * exponent e (limb k at e[k * se]) is not zero (Montgomery form, acc strided by sacc). Returns
 * whether any row held a digit; acc is left untouched when none did.
 */
CF_FN u32 cf_table_product(u32 *acc, u32 sacc, const u32 *e, u32 se, u32 e_limbs, const u32 *CF_RESTRICT table,
                           u32 first, u32 stop, u32 w, const u32 *CF_RESTRICT m, u32 minv) {
    const u32 per_row = (1u << w) - 1;
    u32 started = 0;
    CF_NO_UNROLL
    for (u32 j = first; j < stop; j++) {
        const u32 d = cf_bits(e, se, e_limbs, j * w, w);
        if (d == 0) continue;
        const u32 *entry = table + ((u64)j * per_row + (d - 1)) * NL;
        if (started)
            cf_montmul(acc, sacc, acc, sacc, entry, 1, m, minv);
        else
            cf_copy(acc, sacc, entry, 1);
        started = 1;
    }
    return started;
}

/*
 * Fixed-base ("stair") exponentiation times a factor, algorithms.md §1.5:
 *   out_i = factor_i * B^(a_i) mod m,  B^a = prod_{j : a_j != 0} T[j][a_j]
 * for the base-2^w digits a_j of a_i (exponent limbs limb-major, e_limbs of them). The table
 * holds T[j][d - 1] = B^(d * 2^(w j)) * R mod m (Montgomery form), d = 1 .. 2^w - 1, row after
 * row, each entry NL contiguous limbs. acc is limb-major scratch of NL * count limbs. factor_i
 * is in normal form, so the last product acc * factor * R^-1 leaves Montgomery form.
 * With w | 32 every digit lies within one limb.
 */
CF_KERNEL cf_fixed_base(u32 *out, u32 *acc, const u32 *factor, const u32 *exps, u32 e_limbs, u32 count,
                        const u32 *CF_RESTRICT table, u32 rows, u32 w, const u32 *CF_RESTRICT one,
                        const u32 *CF_RESTRICT m, u32 minv) {
    for (u32 i = CF_START; i < count; i += CF_STRIDE) {
        if (!cf_table_product(acc + i, count, exps + i, count, e_limbs, table, 0, rows, w, m, minv))
            cf_copy(acc + i, count, one, 1);
        cf_montmul(out + i, count, acc + i, count, factor + i, count, m, minv);
    }
}

/*
 * out_i = 1 + m_i * n (normal form, < n^2 for m_i < n): g^m for g = n + 1 (algorithms.md §1.3).
 * m is limb-major with NL / 2 limbs per item, n has NL / 2 limbs; product scanning, one
 * column at a time, with a 96-bit column accumulator.
 */
CF_KERNEL cf_factor(u32 *out, const u32 *msg, u32 count, const u32 *CF_RESTRICT n) {
    const int h = NL / 2;
    for (u32 i = CF_START; i < count; i += CF_STRIDE) {
        u64 lo = 1; /* the "1 +" enters as the first column's carry */
        u32 hi = 0;
        for (int k = 0; k < NL; k++) {
            const int first = k < h ? 0 : k - h + 1, last = k < h ? k : h - 1;
            for (int j = first; j <= last; j++) {
                const u64 p = (u64)msg[(u64)j * count + i] * n[k - j];
                lo += p;
                hi += lo < p;
            }
            out[(u64)k * count + i] = (u32)lo;
            lo = (lo >> 32) | ((u64)hi << 32);
            hi = 0;
        }
    }
}

/*
 * Windowed exponentiation, left to right with a fixed window w <= CF_MAX_POW_WINDOW:
 *   out_i = base_i^(e_i) mod m
 * Exponent limbs: one shared exponent (e_stride = 0: limb k at exps[k]) or one per item
 * (e_stride = count: limb k of item i at exps[k * count + i]); e_bits bits are used. Bases and
 * out are limb-major in normal form; table is scratch of (2^w - 1) * NL * count limbs (entry d - 1
 * of item i, limb k at table[((d - 1) * NL + k) * count + i]). r2 = R^2 mod m, one = R mod m.
 * out may alias base. Every window multiplies (by one for a zero digit), so the sequence of
 * products does not depend on the exponent, the secret one of a decryption.
 */
CF_KERNEL cf_pow(u32 *out, const u32 *base, u32 count, const u32 *exps, u32 e_stride, u32 e_limbs, u32 e_bits,
                 u32 *table, u32 w, const u32 *CF_RESTRICT r2, const u32 *CF_RESTRICT one,
                 const u32 *CF_RESTRICT m, u32 minv) {
    const u64 entry = (u64)NL * count;
    for (u32 i = CF_START; i < count; i += CF_STRIDE) {
        u32 *t1 = table + i;
        cf_montmul(t1, count, base + i, count, r2, 1, m, minv); /* T[1] = base * R */
        for (u32 d = 2; d < (1u << w); d++)
            cf_montmul(t1 + (d - 1) * entry, count, t1 + (d - 2) * entry, count, t1, count, m, minv);
        const u32 *e = exps + (e_stride ? i : 0);
        const u32 windows = (e_bits + w - 1) / w;
        u32 *acc = out + i;
        cf_copy(acc, count, one, 1);
        CF_NO_UNROLL
        for (u32 k = windows; k-- > 0;) {
            CF_NO_UNROLL
            for (u32 s = 0; s < w; s++) cf_montmul(acc, count, acc, count, acc, count, m, minv);
            const u32 d = cf_bits(e, e_stride ? e_stride : 1, e_limbs, k * w, w);
            if (d)
                cf_montmul(acc, count, acc, count, t1 + (d - 1) * entry, count, m, minv);
            else
                cf_montmul(acc, count, acc, count, one, 1, m, minv);
        }
        /* Leave Montgomery form: acc * 1 * R^-1. */
        u32 unit[NL];
        CF_UNROLL
        for (int k = 0; k < NL; k++) unit[k] = k == 0;
        cf_montmul(acc, count, acc, count, unit, 1, m, minv);
    }
}

/*
 * CRT recombination (Garner) of residues mod p^2 and q^2 into the value mod n^2, on the
 * modulus p^2 (this build's NL limbs):
 *   h_i = (x_p - x_q) * (q^2)^-1 mod p^2,   x = x_q + q^2 * h_i
 * This kernel computes h_i (normal form) from x_p, x_q (both < p^2 and q^2 < R, limb-major) and
 * qinv_m = (q^2)^-1 * R mod p^2; the host (or cf_mul_add) finishes x_q + q^2 * h.
 */
CF_KERNEL cf_garner(u32 *h, const u32 *xp, const u32 *xq, u32 count, const u32 *CF_RESTRICT qinv_m,
                    const u32 *CF_RESTRICT m, u32 minv) {
    for (u32 i = CF_START; i < count; i += CF_STRIDE) {
        /* d = x_p - (x_q mod p^2), x_q < q^2 < 2^(32 NL) may exceed p^2 once or more: reduce by
           Montgomery products, which accept any input below R * m... keep it exact instead:
           compute d = x_p - x_q + k * m with wrap handling over two subtractions. */
        u32 borrow = 0;
        CF_UNROLL
        for (int j = 0; j < NL; j++) {
            const u64 d = (u64)xp[(u64)j * count + i] - xq[(u64)j * count + i] - borrow;
            borrow = (u32)(d >> 63);
            h[(u64)j * count + i] = (u32)d;
        }
        /* While negative (borrow out), add m; x_q < R and m > R / 4 bound this to a few steps. */
        while (borrow) {
            u64 c = 0;
            CF_UNROLL
            for (int j = 0; j < NL; j++) {
                c += (u64)h[(u64)j * count + i] + m[j];
                h[(u64)j * count + i] = (u32)c;
                c >>= 32;
            }
            borrow = c ? 0 : 1;
        }
        /* Now 0 <= d < R; the Montgomery product d * qinv_m * R^-1 = d * (q^2)^-1 mod m, reduced,
           holds for d < R since CIOS needs only a * b < R * m. */
        cf_montmul(h + i, count, h + i, count, qinv_m, 1, m, minv);
    }
}

/*
 * SecureBoost host histograms (docs/crypto.md, "GPU engine"), in three steps. The guest's
 * ciphertexts gh are limb-major in Montgomery form (n_rows items); bins are row-major
 * (bins[r * features + f], one byte each), so the threads of a warp (consecutive features of the
 * same rows) read one ciphertext together. A row r belongs to node slot[r] < slots of this call
 * (0xFFFFFFFF: to none). Keys k = slot * n_bins + bin; groups g = k * features + f.
 *
 * Step 1: thread t = c * features + f multiplies, per key, the ciphertexts of rows
 * [c * rows_per, (c + 1) * rows_per) of feature f into partial (c, g) at index e = c * G + g
 * (G = slots * n_bins * features groups, chunks * G partials, limb-major). flag[e] marks a
 * partial that holds a product; one no row reached stays unmarked and counts as 1.
 */
CF_KERNEL cf_hist_partial(u32 *part, u32 *flag, const u32 *gh, u32 n_rows, const unsigned char *bins,
                          u32 features, const u32 *slot, u32 slots, u32 n_bins, u32 rows_per, u32 chunks,
                          const u32 *CF_RESTRICT m, u32 minv) {
    const u32 groups = slots * n_bins * features;
    const u32 total = (u32)((u64)chunks * groups);
    for (u32 t = CF_START; t < chunks * features; t += CF_STRIDE) {
        const u32 c = t / features, f = t % features;
        const u32 start = c * rows_per;
        const u32 stop = start < n_rows && n_rows - start > rows_per ? start + rows_per : n_rows;
        for (u32 r = start; r < stop; r++) {
            const u32 s = slot[r];
            if (s >= slots) continue;
            const u32 e = c * groups + (s * n_bins + bins[(u64)r * features + f]) * features + f;
            if (flag[e]) {
                cf_montmul(part + e, total, gh + r, n_rows, part + e, total, m, minv);
            } else {
                cf_copy(part + e, total, gh + r, n_rows);
                flag[e] = 1;
            }
        }
    }
}

/*
 * Step 2, repeated until one chunk is left: out (c2, g) = the product of the marked partials
 * (c, g), c in [c2 * per, (c2 + 1) * per), for chunks partials per group; out_flag marks it.
 */
CF_KERNEL cf_hist_reduce(u32 *out, u32 *out_flag, const u32 *part, const u32 *flag, u32 groups, u32 chunks,
                         u32 per, const u32 *CF_RESTRICT m, u32 minv) {
    const u32 out_chunks = (chunks + per - 1) / per;
    const u32 total = chunks * groups, out_total = out_chunks * groups;
    for (u32 t = CF_START; t < out_total; t += CF_STRIDE) {
        const u32 c2 = t / groups, g = t % groups;
        const u32 stop = chunks - c2 * per > per ? (c2 + 1) * per : chunks;
        u32 started = 0;
        for (u32 c = c2 * per; c < stop; c++) {
            const u32 e = c * groups + g;
            if (!flag[e]) continue;
            if (started)
                cf_montmul(out + t, out_total, part + e, total, out + t, out_total, m, minv);
            else
                cf_copy(out + t, out_total, part + e, total);
            started = 1;
        }
        out_flag[t] = started;
    }
}

/*
 * Step 3: the histogram in normal form: a marked group's product times 1 (leaving Montgomery
 * form), an unmarked one the ciphertext 1 (an encryption of 0, as the CPU engine gives).
 */
CF_KERNEL cf_hist_finish(u32 *out, const u32 *part, const u32 *flag, u32 groups, const u32 *CF_RESTRICT m,
                         u32 minv) {
    for (u32 g = CF_START; g < groups; g += CF_STRIDE) {
        if (flag[g]) {
            u32 unit[NL];
            CF_UNROLL
            for (int k = 0; k < NL; k++) unit[k] = k == 0;
            cf_montmul(out + g, groups, part + g, groups, unit, 1, m, minv);
        } else {
            CF_UNROLL
            for (int k = 0; k < NL; k++) out[(u64)k * groups + g] = k == 0;
        }
    }
}

/*
 * Byte order on the device, so the host hands over wire bytes untouched: count big-endian rows of
 * width bytes (row i at in[i * width]) to limb-major little-endian limbs (limbs per item; bytes
 * beyond the row are zero), and back. One thread per output word or byte, so writes coalesce.
 */
CF_KERNEL cf_from_be(u32 *out, const unsigned char *in, u32 count, u32 width, u32 limbs) {
    for (u32 t = CF_START; t < count * limbs; t += CF_STRIDE) {
        const u32 k = t / count, i = t % count;
        u32 v = 0;
        for (u32 b = 0; b < 4; b++) {
            const u32 from_end = 4 * k + b; /* byte index counted from the row's least significant end */
            if (from_end < width) v |= (u32)in[(u64)i * width + (width - 1 - from_end)] << (8 * b);
        }
        out[t] = v;
    }
}

CF_KERNEL cf_to_be(unsigned char *out, const u32 *in, u32 count, u32 width) {
    for (u32 t = CF_START; t < count * width; t += CF_STRIDE) {
        const u32 i = t / width, from_end = width - 1 - t % width;
        out[t] = (unsigned char)(in[(u64)(from_end / 4) * count + i] >> (8 * (from_end % 4)));
    }
}

/*
 * cf_fixed_base cut across threads, for batches too small to fill the device: the rows of the
 * table product are split into parts (rows_per rows each), thread t = c * count + i takes part c
 * of item i into partial (c, i) (Montgomery form; flag[c * count + i] set unless every digit of
 * the part was zero). cf_hist_reduce then multiplies the parts of an item together, and
 * cf_times_factor finishes: out_i = partial_i * factor_i * R^-1 (normal form), or factor_i where
 * no part held a digit (B^0 = 1). The same residues as cf_fixed_base.
 */
CF_KERNEL cf_fixed_base_part(u32 *part, u32 *flag, const u32 *exps, u32 e_limbs, u32 count,
                             const u32 *CF_RESTRICT table, u32 rows, u32 w, u32 rows_per, u32 parts,
                             const u32 *CF_RESTRICT m, u32 minv) {
    const u32 total = parts * count;
    for (u32 t = CF_START; t < total; t += CF_STRIDE) {
        const u32 c = t / count, i = t % count;
        const u32 first = c * rows_per;
        const u32 stop = first < rows && rows - first > rows_per ? first + rows_per : rows;
        flag[t] = cf_table_product(part + t, total, exps + i, count, e_limbs, table, first, stop, w, m, minv);
    }
}

CF_KERNEL cf_times_factor(u32 *out, const u32 *part, const u32 *flag, const u32 *factor, u32 count,
                          const u32 *CF_RESTRICT m, u32 minv) {
    for (u32 i = CF_START; i < count; i += CF_STRIDE) {
        if (flag[i])
            cf_montmul(out + i, count, part + i, count, factor + i, count, m, minv);
        else
            cf_copy(out + i, count, factor + i, count);
    }
}
