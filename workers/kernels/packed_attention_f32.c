/* Packed attention in fp32 for x86 CPUs with AVX2 and FMA: one call over a whole padding-free batch.
 *
 * Built and loaded by cpu_attention_f32.py (gcc -mavx2 -mfma, one shared object per head dimension HD,
 * cached); the contract is kernels/attention.py's, less the relative bias, the soft cap and masked keys,
 * and the same call shape as packed_attention.c (its bf16 sibling).
 *
 * q is (n_tokens, heads, HD) fp32 and k, v are (n_tokens, kv_heads, HD) fp32, each with its own token
 * stride (the three slices of one fused QKV projection are fine); out is (n_tokens, heads, HD) fp32.
 * cu holds the sequence boundaries (nseq + 1 int32). A work item is one (sequence, head); a call does
 * items [item0, item1), so a caller can split one batch over threads. Sequences longer than max_len are
 * left to the caller (their rows unwritten).
 *
 * Per item the keys are transposed once (Kt[d][j], keys padded with zeros to a multiple of 16), so the
 * scores of QR queries against 16 keys are QR x 2 vectors of 8, each a chain of HD FMAs with the query's
 * element broadcast. The softmax is exact and in fp32: per row the maximum over its own keys, then
 * exp2((s - max) * scale * log2 e) (a degree-5 polynomial, relative error 1.5e-7) and the sum; the output
 * rows are the weights times the values (read where they lie, no copy), scaled by 1 / sum. Denormals are
 * flushed for the call (MXCSR restored after): terms that small weigh nothing and cost microcode assists.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef HD
#error "compile with -DHD=<head dim>, a multiple of 8"
#endif
#if HD % 8 != 0 || HD > 256
#error "HD must be a multiple of 8, at most 256"
#endif

#define NV (HD / 8)  /* fp32 vectors over the head dim */
#define QR 6         /* queries a block: QR x 2 score accumulators */
#define KB 16        /* keys a step of the scores (two vectors) */

/* 2^x for x <= 0 (below -127: 0): 2^n * p(f), n = round(x), f in [-0.5, 0.5] */
static inline __m256 exp2_ps(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-127.0f));
    const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 f = _mm256_sub_ps(x, n);
    __m256 p = _mm256_set1_ps(0.0013400432653725147f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.009676037356257439f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.05550327152013779f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.2402210682630539f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.6931471824645996f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0000001192092896f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));  /* n = -127: exponent bits 0, the product 0 */
}

/* lanes j0 .. j0+7 that lie in [lo, hi), as an all-ones / zero mask */
static inline __m256 range_mask(int64_t j0, int64_t lo, int64_t hi) {
    const __m256i j = _mm256_add_epi32(_mm256_set1_epi32((int32_t)j0), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256i ge = _mm256_cmpgt_epi32(j, _mm256_set1_epi32((int32_t)lo - 1));
    const __m256i lt = _mm256_cmpgt_epi32(_mm256_set1_epi32((int32_t)hi), j);
    return _mm256_castsi256_ps(_mm256_and_si256(ge, lt));
}

static inline float hmax(__m256 m) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_shuffle_ps(x, x, 1));
    return _mm_cvtss_f32(x);
}

static inline float hsum(__m256 m) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
    return _mm_cvtss_f32(x);
}

/* Kt[d][j] = k_j[d] for the item's keys (HD rows of Lp), zero past L: 8 x 8 blocks transposed in registers. */
static void transpose_keys(const float* k, int64_t sk, int64_t L, int64_t Lp, float* Kt) {
    for (int64_t jb = 0; jb < Lp; jb += 8) {
        for (int d0 = 0; d0 < HD; d0 += 8) {
            __m256 r[8];
            for (int j = 0; j < 8; j++)
                r[j] = jb + j < L ? _mm256_loadu_ps(k + (jb + j) * sk + d0) : _mm256_setzero_ps();
            const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
            const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
            const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
            const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
            const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
            const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
            const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
            const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
            float* dst = Kt + d0 * Lp + jb;
            _mm256_storeu_ps(dst + 0 * Lp, _mm256_permute2f128_ps(u0, u4, 0x20));
            _mm256_storeu_ps(dst + 1 * Lp, _mm256_permute2f128_ps(u1, u5, 0x20));
            _mm256_storeu_ps(dst + 2 * Lp, _mm256_permute2f128_ps(u2, u6, 0x20));
            _mm256_storeu_ps(dst + 3 * Lp, _mm256_permute2f128_ps(u3, u7, 0x20));
            _mm256_storeu_ps(dst + 4 * Lp, _mm256_permute2f128_ps(u0, u4, 0x31));
            _mm256_storeu_ps(dst + 5 * Lp, _mm256_permute2f128_ps(u1, u5, 0x31));
            _mm256_storeu_ps(dst + 6 * Lp, _mm256_permute2f128_ps(u2, u6, 0x31));
            _mm256_storeu_ps(dst + 7 * Lp, _mm256_permute2f128_ps(u3, u7, 0x31));
        }
    }
}

/* Vc[j] = v_j for the item's values (L rows of HD, contiguous): the PV product then walks a dense block, not rows
 * a token stride apart (measured: 1.3x faster at 512 tokens, where the strided rows spanned more pages than the TLB). */
static void copy_values(const float* v, int64_t sv, int64_t L, float* Vc) {
    for (int64_t j = 0; j < L; j++) memcpy(Vc + j * HD, v + j * sv, sizeof(float) * HD);
}

/* The keys query i of a sequence of L may attend: [*lo, *hi). */
static inline void key_range(int64_t i, int64_t L, int causal, int64_t left, int64_t right, int64_t* lo, int64_t* hi) {
    *lo = left >= 0 && i - left > 0 ? i - left : 0;
    *hi = L;
    if (causal && i + 1 < *hi) *hi = i + 1;
    if (right >= 0 && i + right + 1 < *hi) *hi = i + right + 1;
}

/* S[qi][blo .. bhi) = q_qi . k_j for the block's QR query rows (rows past nq repeat the last one). */
static inline void scores(const float* qrow[QR], const float* Kt, int64_t Lp, int64_t blo, int64_t bhi, float* S) {
    for (int64_t jb = blo; jb < bhi; jb += KB) {
        __m256 acc[QR][2];
        for (int qi = 0; qi < QR; qi++) acc[qi][0] = acc[qi][1] = _mm256_setzero_ps();
        const float* kt = Kt + jb;
        for (int d = 0; d < HD; d++) {
            const __m256 k0 = _mm256_loadu_ps(kt + d * Lp), k1 = _mm256_loadu_ps(kt + d * Lp + 8);
            for (int qi = 0; qi < QR; qi++) {
                const __m256 b = _mm256_broadcast_ss(qrow[qi] + d);
                acc[qi][0] = _mm256_fmadd_ps(b, k0, acc[qi][0]);
                acc[qi][1] = _mm256_fmadd_ps(b, k1, acc[qi][1]);
            }
        }
        for (int qi = 0; qi < QR; qi++) {
            _mm256_storeu_ps(S + qi * Lp + jb, acc[qi][0]);
            _mm256_storeu_ps(S + qi * Lp + jb + 8, acc[qi][1]);
        }
    }
}

/* Row s's scores over [blo, bhi) become exp2((s - max) * scale2) within [a, b) and 0 elsewhere; returns 1 / sum. */
static inline float softmax_row(float* s, int64_t a, int64_t b, int64_t blo, int64_t bhi, float scale2) {
    __m256 m = _mm256_set1_ps(-INFINITY);
    for (int64_t jb = blo; jb < bhi; jb += 8) {
        const __m256 x = _mm256_loadu_ps(s + jb);
        if (jb >= a && jb + 8 <= b) m = _mm256_max_ps(m, x);
        else if (jb < b && jb + 8 > a) m = _mm256_max_ps(m, _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), x, range_mask(jb, a, b)));
    }
    const __m256 sc = _mm256_set1_ps(scale2), sh = _mm256_set1_ps(hmax(m) * scale2);
    __m256 sum = _mm256_setzero_ps();
    for (int64_t jb = blo; jb < bhi; jb += 8) {
        __m256 e;
        if (jb >= a && jb + 8 <= b) e = exp2_ps(_mm256_fmsub_ps(_mm256_loadu_ps(s + jb), sc, sh));
        else if (jb < b && jb + 8 > a)
            e = _mm256_and_ps(range_mask(jb, a, b), exp2_ps(_mm256_fmsub_ps(_mm256_loadu_ps(s + jb), sc, sh)));
        else e = _mm256_setzero_ps();
        _mm256_storeu_ps(s + jb, e);
        sum = _mm256_add_ps(sum, e);
    }
    return 1.0f / hsum(sum);
}

/* Output rows o[r] = (P rows p[r] over keys [blo, bhi)) x V times inv[r], for PR rows at once (o[r] NULL: a row past
 * the block's, computed but not written); V is the item's contiguous copy (rows of HD). */
#define PR 3
static inline void weigh_values(const float* const p[PR], const float* V, int64_t blo, int64_t bhi, float* const o[PR],
                                const float inv[PR]) {
    for (int c0 = 0; c0 < NV; c0 += 4) {
        const int nc = NV - c0 < 4 ? NV - c0 : 4;
        __m256 acc[PR][4];
        for (int r = 0; r < PR; r++)
            for (int c = 0; c < 4; c++) acc[r][c] = _mm256_setzero_ps();
        for (int64_t j = blo; j < bhi; j++) {
            const float* vj = V + j * HD + c0 * 8;
            __m256 w[PR];
            for (int r = 0; r < PR; r++) w[r] = _mm256_broadcast_ss(p[r] + j);
            for (int c = 0; c < nc; c++) {
                const __m256 x = _mm256_loadu_ps(vj + c * 8);
                for (int r = 0; r < PR; r++) acc[r][c] = _mm256_fmadd_ps(w[r], x, acc[r][c]);
            }
        }
        for (int r = 0; r < PR; r++)
            if (o[r])
                for (int c = 0; c < nc; c++) _mm256_storeu_ps(o[r] + (c0 + c) * 8, _mm256_mul_ps(acc[r][c], _mm256_set1_ps(inv[r])));
    }
}

static void attend_one(const float* q, const float* k, const float* v, int64_t sq, int64_t sk, int64_t sv, float* out,
                       int64_t so, int64_t L, int64_t Lp, float scale2, int causal, int64_t left, int64_t right,
                       float* Kt, float* Vc, float* S) {
    transpose_keys(k, sk, L, Lp, Kt);
    copy_values(v, sv, L, Vc);
    for (int64_t i0 = 0; i0 < L; i0 += QR) {
        const int nq = L - i0 < QR ? (int)(L - i0) : QR;
        int64_t lo[QR], hi[QR], blo = L, bhi = 0;
        const float* qrow[QR];
        for (int qi = 0; qi < QR; qi++) {
            const int64_t i = i0 + (qi < nq ? qi : nq - 1);
            qrow[qi] = q + i * sq;
            key_range(i, L, causal, left, right, lo + qi, hi + qi);
            if (lo[qi] < blo) blo = lo[qi];
            if (hi[qi] > bhi) bhi = hi[qi];
        }
        blo &= ~(int64_t)(KB - 1);
        bhi = (bhi + KB - 1) & ~(int64_t)(KB - 1);
        scores(qrow, Kt, Lp, blo, bhi, S);
        float inv[QR];
        for (int qi = 0; qi < nq; qi++) inv[qi] = softmax_row(S + qi * Lp, lo[qi], hi[qi], blo, bhi, scale2);
        /* keys past L in [blo, bhi) have weight 0; V is read only to L */
        const int64_t vhi = bhi < L ? bhi : L;
        for (int q0 = 0; q0 < nq; q0 += PR) {
            const float* p[PR];
            float* o[PR];
            float w[PR];
            for (int r = 0; r < PR; r++) {
                const int qi = q0 + r < nq ? q0 + r : q0;
                p[r] = S + qi * Lp;
                o[r] = q0 + r < nq ? out + (i0 + qi) * so : NULL;
                w[r] = inv[qi];
            }
            weigh_values(p, Vc, blo, vhi, o, w);
        }
    }
}

int poolgate_attend_f32(const float* q, const float* k, const float* v, int64_t sq, int64_t sk, int64_t sv,
                        float* out, int64_t so, const int32_t* cu, int64_t nseq, int64_t heads, int64_t kv_heads,
                        float scale, int causal, int64_t left, int64_t right, int64_t max_len,
                        int64_t item0, int64_t item1) {
    int64_t lmax = 0;
    for (int64_t s = item0 / heads; s < nseq && s * heads < item1; s++)
        if (cu[s + 1] - cu[s] > lmax && cu[s + 1] - cu[s] <= max_len) lmax = cu[s + 1] - cu[s];
    const int64_t Lmax = (lmax + KB - 1) & ~(int64_t)(KB - 1);
    void *Kt = NULL, *Vc = NULL, *S = NULL;
    if (posix_memalign(&Kt, 64, (size_t)(HD * Lmax + 8) * 4) || posix_memalign(&Vc, 64, (size_t)(HD * Lmax + 8) * 4)
        || posix_memalign(&S, 64, (size_t)(QR * Lmax + 8) * 4)) {
        free(Kt); free(Vc); free(S);
        return -1;
    }
    const unsigned int csr = _mm_getcsr();  /* flush tiny terms to zero: denormals cost a microcode assist each */
    _mm_setcsr(csr | 0x8040);
    const float scale2 = scale * 1.4426950408889634f;
    const int64_t group = heads / kv_heads;
    for (int64_t item = item0; item < item1; item++) {
        const int64_t s = item / heads, h = item % heads, kvh = h / group;
        const int64_t t0 = cu[s], L = cu[s + 1] - cu[s];
        if (L <= 0 || L > max_len) continue;
        const int64_t Lp = (L + KB - 1) & ~(int64_t)(KB - 1);
        attend_one(q + t0 * sq + h * HD, k + t0 * sk + kvh * HD, v + t0 * sv + kvh * HD, sq, sk, sv,
                   out + t0 * so + h * HD, so, L, Lp, scale2, causal, left, right, (float*)Kt, (float*)Vc, (float*)S);
    }
    _mm_setcsr(csr);
    free(Kt); free(Vc); free(S);
    return 0;
}
