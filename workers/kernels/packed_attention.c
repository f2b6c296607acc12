/* Packed attention for x86 CPUs with AVX512-BF16: one call over a whole padding-free batch, no padding.
 *
 * Built and loaded by cpu_attention.py (gcc, one shared object per head dimension HD, cached); the
 * contract is kernels/attention.py's, less the relative bias, the soft cap and masked keys.
 *
 * q is (n_tokens, heads, HD) bf16 and k, v are (n_tokens, kv_heads, HD) bf16, each with its own token
 * stride (the three slices of one fused QKV projection are fine); out is (n_tokens, heads, HD) bf16.
 * cu holds the sequence boundaries (nseq + 1 int32). A work item is one (sequence, head); a call does
 * items [item0, item1), so a caller can split one batch over threads.
 *
 * Per item the keys are laid out as bf16 pairs across keys (Kp[r][j] = k_j[2r], k_j[2r+1]) and the
 * values as pairs across keys (Vp[jp][c] = v_2jp[c], v_2jp+1[c]): the two layouts VDPBF16PS multiplies
 * in, 32 multiply-adds an instruction. Scores are fp32 (scaled by scale * log2 e, so softmax is exp2);
 * the softmax is exact (row max subtracted, fp32 sum); probabilities are rounded to bf16 for the PV
 * product, as the CPU flash kernels do, and the fp32 output is divided by the row sum at the end.
 *
 * Built with -DPOOLGATE_AMX (CPUs with AMX-BF16, HD a multiple of 32), the two products run on AMX
 * tiles instead: 16 queries x 16 keys of scores, and 16 queries x 16 dims of output over 32 keys, an
 * instruction each, from the same Kp / Vp layouts (they are AMX's VNNI layout for B). The softmax
 * stays on AVX-512. poolgate_amx_init asks the kernel for the tile state once per process.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef POOLGATE_AMX
#include <sys/syscall.h>
#include <unistd.h>
#endif

#ifndef HD
#error "compile with -DHD=<head dim>, a multiple of 16"
#endif
#if HD % 16 != 0 || HD > 256
#error "HD must be a multiple of 16, at most 256"
#endif

#define NV (HD / 16)             /* fp32 vectors over the head dim */
#define NP (HD / 2)              /* bf16 pairs in a head row */
#define QB (HD <= 64 ? 4 : 2)    /* queries a block: QB * NV accumulators stay in registers */
#if defined(POOLGATE_AMX) && HD % 32 != 0
#error "the AMX build needs HD a multiple of 32"
#endif
#ifdef POOLGATE_AMX
#define KB 32                    /* keys are padded to whole AMX K steps of the PV product */
#else
#define KB 16
#endif

typedef uint16_t bf16_t;

static inline __m512 exp2_ps(__m512 x) {
    /* 2^x = 2^n * 2^f for finite x <= 0, n = round(x), f in [-0.5, 0.5]: a degree-3 minimax fit of 2^f
     * (relative error 7.5e-5, against the 3.9e-3 of the bf16 the probabilities are rounded to for the PV
     * product); scalef takes n down to 0 */
    __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(0.05517132207751274f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.24261054396629333f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.6932609677314758f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.9999281167984009f));
    return _mm512_scalef_ps(p, n);
}

static inline __mmask16 range_mask(int64_t j0, int64_t lo, int64_t hi) {
    /* lanes j0 .. j0+15 that lie in [lo, hi) */
    __m512i j = _mm512_add_epi32(_mm512_set1_epi32((int32_t)j0),
                                 _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    return _mm512_cmpge_epi32_mask(j, _mm512_set1_epi32((int32_t)lo))
         & _mm512_cmplt_epi32_mask(j, _mm512_set1_epi32((int32_t)hi));
}

static inline void store_bf16(bf16_t* dst, __m512 x) {
    _mm256_storeu_si256((__m256i*)dst, (__m256i)_mm512_cvtneps_pbh(x));
}

/* Lays out one (sequence, head)'s keys and values for the products: Kp[r][j] = k_j[2r], k_j[2r+1] (NP rows
 * of Lp keys) and Vp[jp][c] = v_2jp[c], v_2jp+1[c] (Lp / 2 rows of HD); keys past L are zero. */
static void layout_kv(const bf16_t* k, const bf16_t* v, int64_t sk, int64_t sv, int64_t t0, int64_t L, int64_t Lp,
                      int64_t kvh, uint32_t* Kp, uint32_t* Vp) {
    const __m512i rows = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32((int32_t)(sk / 2)));  /* a key's offset in pairs */
    for (int64_t jb = 0; jb < Lp; jb += 16) {  /* 16 keys a step: pair r of each, gathered */
        const __mmask16 real = range_mask(jb, 0, L);
        const int32_t* base = (const int32_t*)(k + (t0 + jb) * sk + kvh * HD);
        for (int r = 0; r < NP; r++)
            _mm512_storeu_si512(Kp + r * Lp + jb, _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), real, rows, base + r, 4));
    }
    for (int64_t jp = 0; jp < Lp / 2; jp++) {
        const int64_t ja = 2 * jp, jb = 2 * jp + 1;
        for (int cv = 0; cv < NV; cv++) {
            __m512i lo = ja < L ? _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(v + (t0 + ja) * sv + kvh * HD + cv * 16)))
                                : _mm512_setzero_si512();
            __m512i hi = jb < L ? _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(v + (t0 + jb) * sv + kvh * HD + cv * 16)))
                                : _mm512_setzero_si512();
            _mm512_storeu_si512(Vp + jp * HD + cv * 16, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
        }
    }
}

/* The keys query i of a sequence of L may attend: [*lo, *hi). */
static inline void key_range(int64_t i, int64_t L, int causal, int64_t left, int64_t right, int64_t* lo, int64_t* hi) {
    *lo = left >= 0 && i - left > 0 ? i - left : 0;
    *hi = L;
    if (causal && i + 1 < *hi) *hi = i + 1;
    if (right >= 0 && i + right + 1 < *hi) *hi = i + right + 1;
}

/* Softmax of the rows' raw scores S[qi][blo .. bhi) (stride Lp) into bf16 P, zero outside each row's [lo, hi);
 * inv[qi] = 1 / the row's fp32 sum. Vectors wholly inside a row's range take no mask, wholly outside no work. */
static inline void softmax_rows(const float* S, bf16_t* P, int64_t Lp, int rows, const int64_t* lo, const int64_t* hi,
                                int64_t blo, int64_t bhi, float scale2, float* inv) {
    float mx[16];  /* rows <= 16: the row maxima first, every row's chain independent of the next */
    for (int qi = 0; qi < rows; qi++) {
        const float* s = S + qi * Lp;
        const int64_t a = lo[qi], b = hi[qi];
        __m512 m = _mm512_set1_ps(-INFINITY);
        for (int64_t jb = blo; jb < bhi; jb += 16) {
            if (jb >= a && jb + 16 <= b) m = _mm512_max_ps(m, _mm512_loadu_ps(s + jb));
            else if (jb < b && jb + 16 > a) m = _mm512_mask_max_ps(m, range_mask(jb, a, b), m, _mm512_loadu_ps(s + jb));
        }
        mx[qi] = _mm512_reduce_max_ps(m) * scale2;
    }
    const __m512 sc = _mm512_set1_ps(scale2);
    for (int qi = 0; qi < rows; qi++) {
        const float* s = S + qi * Lp;
        bf16_t* p = P + qi * Lp;
        const int64_t a = lo[qi], b = hi[qi];
        const __m512 shift = _mm512_set1_ps(mx[qi]);
        __m512 sum = _mm512_setzero_ps();
        for (int64_t jb = blo; jb < bhi; jb += 16) {
            __m512 e;
            if (jb >= a && jb + 16 <= b) e = exp2_ps(_mm512_fmsub_ps(_mm512_loadu_ps(s + jb), sc, shift));
            else if (jb < b && jb + 16 > a)
                e = _mm512_maskz_mov_ps(range_mask(jb, a, b), exp2_ps(_mm512_fmsub_ps(_mm512_loadu_ps(s + jb), sc, shift)));
            else e = _mm512_setzero_ps();
            sum = _mm512_add_ps(sum, e);
            store_bf16(p + jb, e);
        }
        inv[qi] = _mm512_reduce_add_ps(sum);
    }
    for (int qi = 0; qi < rows; qi++) inv[qi] = 1.0f / inv[qi];
}

#ifdef POOLGATE_AMX
#define QROWS 16
typedef struct { uint8_t palette, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; } tilecfg_t;

/* tmm0-3: output accumulators (4 blocks of 16 dims), tmm4: A (queries, or probabilities), tmm5: B (Kp or Vp),
 * tmm6: scores; every tile 16 rows of 64 bytes. */
static void configure_tiles(void) {
    tilecfg_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) { cfg.colsb[t] = 64; cfg.rows[t] = 16; }
    _tile_loadconfig(&cfg);
}

int poolgate_amx_init(void) {
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0 ? 0 : -1;
}

#define PV_TILE(t)                                                                              \
    if (cb + t < NV) {                                                                          \
        _tile_loadd(5, Vp + (kb / 2) * HD + (cb + t) * 16, HD * 4);                             \
        _tile_dpbf16ps(t, 4, 5);                                                                \
    }
#define PV_STORE(t) if (cb + t < NV) _tile_stored(t, O + (cb + t) * 16, HD * 4);

static void attend_one(const bf16_t* q, const bf16_t* k, const bf16_t* v, int64_t sq, int64_t sk, int64_t sv,
                       bf16_t* out, int64_t so, int64_t t0, int64_t L, int64_t h, int64_t kvh, float scale2,
                       int causal, int64_t left, int64_t right,
                       uint32_t* Kp, uint32_t* Vp, float* S, bf16_t* P, bf16_t* Qb, float* O) {
    const int64_t Lp = (L + KB - 1) & ~(int64_t)(KB - 1);
    layout_kv(k, v, sk, sv, t0, L, Lp, kvh, Kp, Vp);
    for (int64_t i0 = 0; i0 < L; i0 += QROWS) {
        const int nq = L - i0 < QROWS ? (int)(L - i0) : QROWS;
        int64_t lo[QROWS], hi[QROWS], blo = L, bhi = 0;
        for (int qi = 0; qi < QROWS; qi++) {
            key_range(i0 + (qi < nq ? qi : 0), L, causal, left, right, lo + qi, hi + qi);
            if (lo[qi] < blo) blo = lo[qi];
            if (hi[qi] > bhi) bhi = hi[qi];
        }
        blo &= ~(int64_t)(KB - 1);
        bhi = (bhi + KB - 1) & ~(int64_t)(KB - 1);
        const bf16_t* qa = q + (t0 + i0) * sq + h * HD;
        int64_t qs = sq;
        if (nq < QROWS) {  /* a last, short block: its rows copied, the rest zero (no read past the sequence) */
            memset(Qb, 0, sizeof(bf16_t) * QROWS * HD);
            for (int qi = 0; qi < nq; qi++) memcpy(Qb + qi * HD, qa + qi * sq, sizeof(bf16_t) * HD);
            qa = Qb;
            qs = HD;
        }
        for (int64_t jb = blo; jb < bhi; jb += 16) {  /* scores: 16 queries x 16 keys a tile */
            _tile_zero(6);
            for (int ks = 0; ks < HD / 32; ks++) {
                _tile_loadd(4, qa + ks * 32, qs * 2);
                _tile_loadd(5, Kp + (ks * 16) * Lp + jb, Lp * 4);
                _tile_dpbf16ps(6, 4, 5);
            }
            _tile_stored(6, S + jb, Lp * 4);
        }
        float inv[QROWS];
        softmax_rows(S, P, Lp, nq, lo, hi, blo, bhi, scale2, inv);  /* rows past nq: stale, finite, unused */
        for (int cb = 0; cb < NV; cb += 4) {  /* out: 16 queries x 4 blocks of 16 dims, 32 keys a step */
            _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
            for (int64_t kb = blo; kb < bhi; kb += 32) {
                _tile_loadd(4, P + kb, Lp * 2);
                PV_TILE(0) PV_TILE(1) PV_TILE(2) PV_TILE(3)
            }
            PV_STORE(0) PV_STORE(1) PV_STORE(2) PV_STORE(3)
        }
        for (int qi = 0; qi < nq; qi++) {
            bf16_t* dst = out + (t0 + i0 + qi) * so + h * HD;
            const __m512 f = _mm512_set1_ps(inv[qi]);
            for (int cv = 0; cv < NV; cv++) store_bf16(dst + cv * 16, _mm512_mul_ps(_mm512_loadu_ps(O + qi * HD + cv * 16), f));
        }
    }
}
#else
#define QROWS QB

/* One (sequence, head) on AVX512-BF16: QB queries a block, scores and output in registers. */
static void attend_one(const bf16_t* q, const bf16_t* k, const bf16_t* v, int64_t sq, int64_t sk, int64_t sv,
                       bf16_t* out, int64_t so, int64_t t0, int64_t L, int64_t h, int64_t kvh, float scale2,
                       int causal, int64_t left, int64_t right,
                       uint32_t* Kp, uint32_t* Vp, float* S, bf16_t* P, bf16_t* Qb, float* O) {
    (void)Qb; (void)O;
    const int64_t Lp = (L + KB - 1) & ~(int64_t)(KB - 1), Lh = (L + 1) / 2;
    layout_kv(k, v, sk, sv, t0, L, Lp, kvh, Kp, Vp);
    for (int64_t i0 = 0; i0 < L; i0 += QB) {
        const int nq = L - i0 < QB ? (int)(L - i0) : QB;
        int64_t lo[QB], hi[QB], blo = L, bhi = 0;
        const uint32_t* qr[QB];
        for (int qi = 0; qi < QB; qi++) {
            const int64_t i = i0 + (qi < nq ? qi : 0);  /* a block's spare rows repeat its first query */
            key_range(i, L, causal, left, right, lo + qi, hi + qi);
            if (lo[qi] < blo) blo = lo[qi];
            if (hi[qi] > bhi) bhi = hi[qi];
            qr[qi] = (const uint32_t*)(q + (t0 + i) * sq + h * HD);
        }
        blo &= ~(int64_t)15;
        bhi = (bhi + 15) & ~(int64_t)15;
        for (int64_t jb = blo; jb < bhi; jb += 16) {  /* scores: QB queries x 16 keys a step */
            __m512 acc[QB];
            for (int qi = 0; qi < QB; qi++) acc[qi] = _mm512_setzero_ps();
            for (int r = 0; r < NP; r++) {
                __m512bh kv = (__m512bh)_mm512_loadu_si512(Kp + r * Lp + jb);
                for (int qi = 0; qi < QB; qi++)
                    acc[qi] = _mm512_dpbf16_ps(acc[qi], (__m512bh)_mm512_set1_epi32((int32_t)qr[qi][r]), kv);
            }
            for (int qi = 0; qi < QB; qi++) _mm512_storeu_ps(S + qi * Lp + jb, acc[qi]);
        }
        float inv[QB];
        softmax_rows(S, P, Lp, QB, lo, hi, blo, bhi, scale2, inv);
        __m512 o[QB][NV];
        for (int qi = 0; qi < QB; qi++)
            for (int cv = 0; cv < NV; cv++) o[qi][cv] = _mm512_setzero_ps();
        const int64_t pend = bhi / 2 < Lh ? bhi / 2 : Lh;
        for (int64_t jp = blo / 2; jp < pend; jp++) {  /* out += P V over pairs of keys */
            __m512bh vv[NV];
            for (int cv = 0; cv < NV; cv++) vv[cv] = (__m512bh)_mm512_loadu_si512(Vp + jp * HD + cv * 16);
            for (int qi = 0; qi < QB; qi++) {
                __m512bh pp = (__m512bh)_mm512_set1_epi32((int32_t)((const uint32_t*)(P + qi * Lp))[jp]);
                for (int cv = 0; cv < NV; cv++) o[qi][cv] = _mm512_dpbf16_ps(o[qi][cv], pp, vv[cv]);
            }
        }
        for (int qi = 0; qi < nq; qi++) {
            bf16_t* dst = out + (t0 + i0 + qi) * so + h * HD;
            for (int cv = 0; cv < NV; cv++) store_bf16(dst + cv * 16, _mm512_mul_ps(o[qi][cv], _mm512_set1_ps(inv[qi])));
        }
    }
}
#endif

/* Items [item0, item1) of nseq * heads (sequence-major). left/right < 0: no window on that side. Sequences
 * longer than max_len are skipped (left to the caller). Returns 0, or -1 when scratch memory cannot be had
 * (nothing written then). */
int poolgate_attend(const bf16_t* q, const bf16_t* k, const bf16_t* v, int64_t sq, int64_t sk, int64_t sv,
                    bf16_t* out, int64_t so, const int32_t* cu, int64_t nseq, int64_t heads, int64_t kv_heads,
                    float scale, int causal, int64_t left, int64_t right, int64_t max_len,
                    int64_t item0, int64_t item1) {
    int64_t lmax = 0;
    for (int64_t s = item0 / heads; s < nseq && s * heads < item1; s++)
        if (cu[s + 1] - cu[s] > lmax && cu[s + 1] - cu[s] <= max_len) lmax = cu[s + 1] - cu[s];
    const int64_t Lp = (lmax + KB - 1) & ~(int64_t)(KB - 1);
    void *Kp = NULL, *Vp = NULL, *S = NULL, *P = NULL, *Qb = NULL, *O = NULL;
    if (posix_memalign(&Kp, 64, (size_t)(NP * Lp + 16) * 4) || posix_memalign(&Vp, 64, (size_t)((Lp / 2 + 1) * HD + 16) * 4)
        || posix_memalign(&S, 64, (size_t)(QROWS * Lp + 16) * 4) || posix_memalign(&P, 64, (size_t)(QROWS * Lp + 32) * 2)
        || posix_memalign(&Qb, 64, (size_t)QROWS * HD * 2) || posix_memalign(&O, 64, (size_t)QROWS * HD * 4)) {
        free(Kp); free(Vp); free(S); free(P); free(Qb); free(O);
        return -1;
    }
    memset(P, 0, (size_t)(QROWS * Lp + 32) * 2);  /* every P row finite from the start (AMX reads whole tiles) */
#ifdef POOLGATE_AMX
    configure_tiles();
#endif
    const float scale2 = scale * 1.4426950408889634f;
    const int64_t group = heads / kv_heads;
    for (int64_t item = item0; item < item1; item++) {
        const int64_t s = item / heads, h = item % heads;
        const int64_t L = cu[s + 1] - cu[s];
        if (L > 0 && L <= max_len)
            attend_one(q, k, v, sq, sk, sv, out, so, cu[s], L, h, h / group, scale2, causal, left, right,
                       (uint32_t*)Kp, (uint32_t*)Vp, (float*)S, (bf16_t*)P, (bf16_t*)Qb, (float*)O);
    }
#ifdef POOLGATE_AMX
    _tile_release();
#endif
    free(Kp); free(Vp); free(S); free(P); free(Qb); free(O);
    return 0;
}
