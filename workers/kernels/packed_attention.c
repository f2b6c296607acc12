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
 * Per item the keys are laid out as bf16 pairs across keys (Kp[r][j] = k_j[2r], k_j[2r+1], a 32-bit
 * transpose in registers) and the values as pairs across keys (Vp[jp][c] = v_2jp[c], v_2jp+1[c]): the two
 * layouts VDPBF16PS multiplies in, 32 multiply-adds an instruction. Scores are fp32 (scaled by
 * scale * log2 e, so softmax is exp2). The softmax is exact: each row is shifted by a score of its own
 * (its first; the exact maximum where that would overflow, see softmax_rows), the probabilities are
 * rounded to bf16 for the PV product, as the CPU flash kernels do, and the fp32 output is divided by the
 * sum of those bf16 values, so it is a true convex combination of the values. Rows that attend every key
 * (no causal mask, no window) take softmax_full: no masks but the tail's. Denormals are flushed for the
 * call (MXCSR restored after): terms that small weigh nothing, and each costs a microcode assist (peaked
 * attention ran 8x slower with them). The next sequence's rows are prefetched while one computes.
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

/* 2^f for f = x - floor(x) in [0, 1) (one VREDUCEPS): a degree-3 minimax fit (relative error 7.5e-5, against the
 * 3.9e-3 of the bf16 the probabilities are rounded to for the PV product). */
static inline __m512 exp2_frac(__m512 x) {
    const __m512 f = _mm512_reduce_ps(x, 0x09);  /* round down, no precision exception */
    __m512 p = _mm512_set1_ps(0.07803683027f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.226049824f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.6958393846f));
    return _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.9999249526f));
}

/* 2^x = 2^floor(x) * 2^f: VSCALEFPS multiplies by 2^floor(x) itself, down to 0. */
static inline __m512 exp2_ps(__m512 x) { return _mm512_scalef_ps(exp2_frac(x), x); }

/* exp2_ps with the lanes outside k zero (the mask folded into the last instruction). */
static inline __m512 exp2_ps_mz(__mmask16 k, __m512 x) { return _mm512_maskz_scalef_ps(k, exp2_frac(x), x); }

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

/* r[i][j] -> r[j][i] for a 16 x 16 block of 32-bit elements (64 shuffles). */
static inline void transpose16(__m512i r[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int g = 0; g < 4; g++) {  /* u[4g + c], 128-bit lane l: column 4l + c of rows 4g .. 4g + 3 */
        u[4 * g] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
        u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
    }
    for (int c = 0; c < 4; c++) {
        const __m512i v0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44), v1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xEE);
        const __m512i w0 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44), w1 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xEE);
        r[c] = _mm512_shuffle_i32x4(v0, w0, 0x88);
        r[4 + c] = _mm512_shuffle_i32x4(v0, w0, 0xDD);
        r[8 + c] = _mm512_shuffle_i32x4(v1, w1, 0x88);
        r[12 + c] = _mm512_shuffle_i32x4(v1, w1, 0xDD);
    }
}

/* Lays out one (sequence, head)'s keys and values for the products: Kp[r][j] = k_j[2r], k_j[2r+1] (NP rows
 * of Lp keys) and Vp[jp][c] = v_2jp[c], v_2jp+1[c] (Lp / 2 rows of HD); keys past L are zero. */
static void layout_kv(const bf16_t* k, const bf16_t* v, int64_t sk, int64_t sv, int64_t t0, int64_t L, int64_t Lp,
                      int64_t kvh, uint32_t* Kp, uint32_t* Vp) {
    for (int64_t jb = 0; jb < Lp; jb += 16) {  /* 16 keys x 16 pairs a step, transposed in registers */
        const int nk = L - jb >= 16 ? 16 : (L - jb > 0 ? (int)(L - jb) : 0);
        for (int rb = 0; rb < NP; rb += 16) {
            const int np = NP - rb >= 16 ? 16 : NP - rb;
            const __mmask16 cols = (__mmask16)((1u << np) - 1);
            __m512i r[16];
            for (int j = 0; j < 16; j++)
                r[j] = j < nk ? _mm512_maskz_loadu_epi32(cols, (const int32_t*)(k + (t0 + jb + j) * sk + kvh * HD) + rb)
                              : _mm512_setzero_si512();
            transpose16(r);
            for (int p = 0; p < np; p++) _mm512_storeu_si512(Kp + (rb + p) * Lp + jb, r[p]);
        }
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

/* The largest of S[blo .. bhi) within [a, b). */
static inline float row_max(const float* s, int64_t a, int64_t b, int64_t blo, int64_t bhi) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    for (int64_t jb = blo; jb < bhi; jb += 16) {
        if (jb >= a && jb + 16 <= b) m = _mm512_max_ps(m, _mm512_loadu_ps(s + jb));
        else if (jb < b && jb + 16 > a) m = _mm512_mask_max_ps(m, range_mask(jb, a, b), m, _mm512_loadu_ps(s + jb));
    }
    return _mm512_reduce_max_ps(m);
}

/* exp2(S * scale2 - shift) over the row's [a, b) as a vector (zero outside it), for keys jb .. jb + 15. */
static inline __m512 exp_vec(const float* s, int64_t jb, int64_t a, int64_t b, __m512 sc, __m512 sh) {
    if (jb >= a && jb + 16 <= b) return exp2_ps(_mm512_fmsub_ps(_mm512_loadu_ps(s + jb), sc, sh));
    if (jb < b && jb + 16 > a)
        return _mm512_maskz_mov_ps(range_mask(jb, a, b), exp2_ps(_mm512_fmsub_ps(_mm512_loadu_ps(s + jb), sc, sh)));
    return _mm512_setzero_ps();
}

/* Keys jb .. jb + 31's weights (e0: the first 16, e1: the next) rounded to bf16 into p + jb, in order; returns sum
 * plus the weights as stored (VDPBF16PS against ones, fp32), so the output is their exact convex combination.
 * (Truncating instead, with an fp32 sum, measured no faster in the model and 1e-5 lower in worst cosine.) */
static inline __m512 store_weights(bf16_t* p, int64_t jb, __m512 e0, __m512 e1, __m512 sum) {
    const __m512bh pp = _mm512_cvtne2ps_pbh(e1, e0);
    _mm512_storeu_si512(p + jb, (__m512i)pp);
    return _mm512_dpbf16_ps(sum, pp, (__m512bh)_mm512_set1_epi16(0x3F80));
}

/* exp2(S * scale2 - shift) over the row's [a, b) into bf16 p (zero elsewhere in [blo, bhi)); returns the sum of
 * the bf16 values as stored (fp32), the very weights the PV product multiplies (store_weights). */
static inline __m512 exp_row(const float* s, bf16_t* p, int64_t a, int64_t b, int64_t blo, int64_t bhi, __m512 sc,
                             float shift) {
    const __m512 sh = _mm512_set1_ps(shift);
    const __m512bh ones = (__m512bh)_mm512_set1_epi16(0x3F80);
    __m512 sum = _mm512_setzero_ps();
    int64_t jb = blo;
    for (; jb + 32 <= bhi; jb += 32) {
        if (jb >= a && jb + 32 <= b)  /* wholly inside the row's keys: no masks */
            sum = store_weights(p, jb, exp2_ps(_mm512_fmsub_ps(_mm512_loadu_ps(s + jb), sc, sh)),
                                exp2_ps(_mm512_fmsub_ps(_mm512_loadu_ps(s + jb + 16), sc, sh)), sum);
        else
            sum = store_weights(p, jb, exp_vec(s, jb, a, b, sc, sh), exp_vec(s, jb + 16, a, b, sc, sh), sum);
    }
    if (jb < bhi) {  /* an odd 16 keys (the AVX-512 build's 16-key padding) */
        const __m256bh half = _mm512_cvtneps_pbh(exp_vec(s, jb, a, b, sc, sh));
        _mm256_storeu_si256((__m256i*)(p + jb), (__m256i)half);
        sum = _mm512_dpbf16_ps(sum, (__m512bh)_mm512_zextsi256_si512((__m256i)half), ones);
    }
    return sum;
}

/* Lane i of the result = the sum of x[i]'s 16 lanes, for 16 vectors at once (45 instructions, not 16 chains). */
static inline __m512 sum16(const __m512 x[16]) {
    __m512 t[8], u[4], w[2];
    for (int i = 0; i < 8; i++)  /* a 128-bit lane of t[i]: x[2i] at 0, 2 and x[2i+1] at 1, 3 */
        t[i] = _mm512_add_ps(_mm512_unpacklo_ps(x[2 * i], x[2 * i + 1]), _mm512_unpackhi_ps(x[2 * i], x[2 * i + 1]));
    for (int i = 0; i < 4; i++)  /* a 128-bit lane of u[i]: rows 4i .. 4i + 3, one each */
        u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[2 * i]), _mm512_castps_pd(t[2 * i + 1]))),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[2 * i]), _mm512_castps_pd(t[2 * i + 1]))));
    for (int i = 0; i < 2; i++)  /* w[i]: rows 8i .. 8i + 3 in lanes 0, 1 and 8i + 4 .. 8i + 7 in lanes 2, 3 */
        w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0x44), _mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], 0x88), _mm512_shuffle_f32x4(w[0], w[1], 0xDD));
}

/* Softmax of the rows' raw scores S[qi][blo .. bhi) (stride Lp) into bf16 P, zero outside each row's [lo, hi);
 * inv[qi] = 1 / the sum of the row's bf16 weights (fp32). The shift is the row's first score, not its maximum (a pass fewer): the
 * largest term is then >= 1, so nothing that counts underflows; a row whose sum passes SHIFT_LIMIT (a score
 * far above the first) is done again with its exact maximum, so no term or product overflows either. */
#define SHIFT_LIMIT 1.8446744e19f /* 2^64 */

/* inv[qi] = 1 / row qi's sum (lane sums in sums[qi]); a row past SHIFT_LIMIT is done again, shifted by its maximum.
 * Row qi's keys are [lo[qi], hi[qi]), or [0, L) for every row where lo is NULL. */
static inline void normalize(const __m512 sums[16], const float* S, bf16_t* P, int64_t Lp, int rows, const int64_t* lo,
                             const int64_t* hi, int64_t L, int64_t blo, int64_t bhi, float scale2, float* inv) {
    float total[16];
    _mm512_storeu_ps(total, sum16(sums));
    for (int qi = 0; qi < rows; qi++)
        if (!(total[qi] <= SHIFT_LIMIT)) {
            const float* s = S + qi * Lp;
            const int64_t a = lo ? lo[qi] : 0, b = hi ? hi[qi] : L;
            const __m512 sc = _mm512_set1_ps(scale2);
            total[qi] = _mm512_reduce_add_ps(exp_row(s, P + qi * Lp, a, b, blo, bhi, sc, row_max(s, a, b, blo, bhi) * scale2));
        }
    _mm512_storeu_ps(total, _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_loadu_ps(total)));
    for (int qi = 0; qi < rows; qi++) inv[qi] = total[qi];
}

static inline void softmax_rows(const float* S, bf16_t* P, int64_t Lp, int rows, const int64_t* lo, const int64_t* hi,
                                int64_t blo, int64_t bhi, float scale2, float* inv) {
    const __m512 sc = _mm512_set1_ps(scale2);
    __m512 sums[16];  /* rows <= 16 */
    for (int qi = 0; qi < 16; qi++)
        sums[qi] = qi < rows ? exp_row(S + qi * Lp, P + qi * Lp, lo[qi], hi[qi], blo, bhi, sc, S[qi * Lp + lo[qi]] * scale2)
                             : _mm512_set1_ps(1.0f);
    normalize(sums, S, P, Lp, rows, lo, hi, 0, blo, bhi, scale2, inv);
}

/* softmax_rows for rows that all attend every key [0, L) (no causal mask, no window), their scores over [0, Lp):
 * whole pairs of key vectors with no mask at all, the tail's mask the same for every row and folded into the
 * exponential's last instruction. The same weights, sums and fallback as softmax_rows. */
static inline void softmax_full(const float* S, bf16_t* P, int64_t Lp, int rows, int64_t L, float scale2, float* inv) {
    const __m512 sc = _mm512_set1_ps(scale2);
    const __m512bh ones = (__m512bh)_mm512_set1_epi16(0x3F80);
    const int64_t jfull = L & ~(int64_t)31;  /* keys [0, jfull): whole pairs of vectors */
    const __mmask16 t0 = range_mask(jfull, 0, L), t1 = range_mask(jfull + 16, 0, L);
    const int tail2 = jfull + 32 <= Lp, tail1 = !tail2 && jfull + 16 <= Lp;
    __m512 sums[16];
    for (int qi = 0; qi < 16; qi++) {
        if (qi >= rows) { sums[qi] = _mm512_set1_ps(1.0f); continue; }
        const float* s = S + qi * Lp;
        bf16_t* p = P + qi * Lp;
        const __m512 sh = _mm512_set1_ps(s[0] * scale2);
        __m512 sum = _mm512_setzero_ps();
        for (int64_t jb = 0; jb < jfull; jb += 32)
            sum = store_weights(p, jb, exp2_ps(_mm512_fmsub_ps(_mm512_loadu_ps(s + jb), sc, sh)),
                                exp2_ps(_mm512_fmsub_ps(_mm512_loadu_ps(s + jb + 16), sc, sh)), sum);
        if (tail2)
            sum = store_weights(p, jfull, exp2_ps_mz(t0, _mm512_fmsub_ps(_mm512_loadu_ps(s + jfull), sc, sh)),
                                exp2_ps_mz(t1, _mm512_fmsub_ps(_mm512_loadu_ps(s + jfull + 16), sc, sh)), sum);
        else if (tail1) {
            const __m256bh half = _mm512_cvtneps_pbh(exp2_ps_mz(t0, _mm512_fmsub_ps(_mm512_loadu_ps(s + jfull), sc, sh)));
            _mm256_storeu_si256((__m256i*)(p + jfull), (__m256i)half);
            sum = _mm512_dpbf16_ps(sum, (__m512bh)_mm512_zextsi256_si512((__m256i)half), ones);
        }
        sums[qi] = sum;
    }
    normalize(sums, S, P, Lp, rows, NULL, NULL, L, 0, Lp, scale2, inv);
}

/* Rows [next, end) of q and the output (wq elements from q and o) and of k and v (wkv elements), fetched a slice
 * at a time while an item computes: the next sequence's whole rows, or the next head's slice of them (see
 * poolgate_attend). A burst of them at once would stall on the fill buffers. */
typedef struct { const bf16_t *q, *k, *v, *o; int64_t sq, sk, sv, so, next, end, wq, wkv; } ahead_t;

/* The next slice: an equal share of the rows still to fetch over the ``blocks`` (>= 1) this item has left. */
static inline void fetch_ahead(ahead_t* a, int64_t blocks) {
    const int64_t stop = a->next + (a->end - a->next + blocks - 1) / blocks;
    for (int64_t t = a->next; t < stop; t++) {
        for (int64_t c = 0; c < a->wq; c += 32) {  /* each 64-byte line */
            _mm_prefetch((const char*)(a->q + t * a->sq + c), _MM_HINT_T0);
            _mm_prefetch((const char*)(a->o + t * a->so + c), _MM_HINT_T0);
        }
        for (int64_t c = 0; c < a->wkv; c += 32) {
            _mm_prefetch((const char*)(a->k + t * a->sk + c), _MM_HINT_T0);
            _mm_prefetch((const char*)(a->v + t * a->sv + c), _MM_HINT_T0);
        }
    }
    a->next = stop;
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

/* A block's output rows from the fp32 sums in O, each scaled by its row's 1 / sum. Called after the next
 * block's score tiles are issued, not before them: AVX-512 stores just ahead of tile loads cost the tile
 * unit a wait (measured: the kernel 2-5% faster this way, the same output to the bit). */
static inline void write_rows(bf16_t* dst, int64_t so, const float* O, const float* inv, int rows) {
    for (int qi = 0; qi < rows; qi++) {
        const __m512 f = _mm512_set1_ps(inv[qi]);
        for (int cv = 0; cv < NV; cv++) store_bf16(dst + qi * so + cv * 16, _mm512_mul_ps(_mm512_loadu_ps(O + qi * HD + cv * 16), f));
    }
}

static void attend_one(const bf16_t* q, const bf16_t* k, const bf16_t* v, int64_t sq, int64_t sk, int64_t sv,
                       bf16_t* out, int64_t so, int64_t t0, int64_t L, int64_t h, int64_t kvh, float scale2,
                       int causal, int64_t left, int64_t right,
                       uint32_t* Kp, uint32_t* Vp, float* S, bf16_t* P, bf16_t* Qb, float* O, ahead_t* ahead) {
    const int64_t Lp = (L + KB - 1) & ~(int64_t)(KB - 1);
    layout_kv(k, v, sk, sv, t0, L, Lp, kvh, Kp, Vp);
    int last_rows = 0;  /* the block before: its output is in O, written once the next block's scores are issued */
    int64_t last_i0 = 0;
    float inv[QROWS];  /* that block's rows' 1 / sum until then, this block's from its softmax on */
    const int full = !causal && left < 0 && right < 0;  /* every row attends every key */
    for (int64_t i0 = 0; i0 < L; i0 += QROWS) {
        const int nq = L - i0 < QROWS ? (int)(L - i0) : QROWS;
        int64_t lo[QROWS], hi[QROWS], blo = L, bhi = 0;
        fetch_ahead(ahead, (L - i0 + QROWS - 1) / QROWS);
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
        if (HD == 32) _tile_loadd(4, qa, qs * 2);  /* one step of the head dim: the queries' tile serves every key tile */
        for (int64_t jb = blo; jb < bhi; jb += 16) {  /* scores: 16 queries x 16 keys a tile */
            _tile_zero(6);
            for (int ks = 0; ks < HD / 32; ks++) {
                if (HD != 32) _tile_loadd(4, qa + ks * 32, qs * 2);
                _tile_loadd(5, Kp + (ks * 16) * Lp + jb, Lp * 4);
                _tile_dpbf16ps(6, 4, 5);
            }
            _tile_stored(6, S + jb, Lp * 4);
        }
        write_rows(out + (t0 + last_i0) * so + h * HD, so, O, inv, last_rows);
        if (full) softmax_full(S, P, Lp, nq, L, scale2, inv);
        else softmax_rows(S, P, Lp, nq, lo, hi, blo, bhi, scale2, inv);  /* rows past nq: stale, finite, unused */
        for (int cb = 0; cb < NV; cb += 4) {  /* out: 16 queries x 4 blocks of 16 dims, 32 keys a step */
            _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
            for (int64_t kb = blo; kb < bhi; kb += 32) {
                _tile_loadd(4, P + kb, Lp * 2);
                PV_TILE(0) PV_TILE(1) PV_TILE(2) PV_TILE(3)
            }
            PV_STORE(0) PV_STORE(1) PV_STORE(2) PV_STORE(3)
        }
        last_rows = nq;
        last_i0 = i0;
    }
    write_rows(out + (t0 + last_i0) * so + h * HD, so, O, inv, last_rows);
}
#else
#define QROWS QB

/* The block's QB queries against nt (1, 2 or 4, a constant where it is inlined) tiles of 16 keys from jb, into
 * S: QB x nt independent VDPBF16PS chains, more than its latency needs (on this project's Xeon one issues
 * every 0.64 ns with 16 chains, 0.68 with 4, 2.5 ns apart on one). Measured on the runner's first batch
 * (bf16, 12 heads): heads of 32 24.7 -> 23.7 ms, of 64 22.1 -> 21.1, of 128 (two queries a block, so two
 * chains before) 118 -> 93. */
static inline __attribute__((always_inline)) void score_tiles(const uint32_t* Kp, int64_t Lp, int64_t jb,
                                                              const uint32_t* const* qr, float* S, const int nt) {
    __m512 acc[QB][4];
    for (int qi = 0; qi < QB; qi++)
        for (int t = 0; t < nt; t++) acc[qi][t] = _mm512_setzero_ps();
    for (int r = 0; r < NP; r++) {
        __m512bh kv[4];
        for (int t = 0; t < nt; t++) kv[t] = (__m512bh)_mm512_loadu_si512(Kp + r * Lp + jb + 16 * t);
        for (int qi = 0; qi < QB; qi++) {
            const __m512bh qq = (__m512bh)_mm512_set1_epi32((int32_t)qr[qi][r]);
            for (int t = 0; t < nt; t++) acc[qi][t] = _mm512_dpbf16_ps(acc[qi][t], qq, kv[t]);
        }
    }
    for (int qi = 0; qi < QB; qi++)
        for (int t = 0; t < nt; t++) _mm512_storeu_ps(S + qi * Lp + jb + 16 * t, acc[qi][t]);
}

/* Accumulator sets of the PV product: two (even and odd key pairs, summed at the end) where one set would be
 * fewer chains than hide VDPBF16PS's latency (a head of 32: 4 queries x 2 vectors). */
#define PV_SETS (QB * NV < 12 ? 2 : 1)

/* o += P[., 2jp .. 2jp + 1] V[2jp .. 2jp + 1] for the block's QB rows. */
static inline __attribute__((always_inline)) void pv_pair(const uint32_t* Vp, const bf16_t* P, int64_t Lp, int64_t jp,
                                                          __m512 o[QB][NV]) {
    __m512bh vv[NV];
    for (int cv = 0; cv < NV; cv++) vv[cv] = (__m512bh)_mm512_loadu_si512(Vp + jp * HD + cv * 16);
    for (int qi = 0; qi < QB; qi++) {
        const __m512bh pp = (__m512bh)_mm512_set1_epi32((int32_t)((const uint32_t*)(P + qi * Lp))[jp]);
        for (int cv = 0; cv < NV; cv++) o[qi][cv] = _mm512_dpbf16_ps(o[qi][cv], pp, vv[cv]);
    }
}

/* One (sequence, head) on AVX512-BF16: QB queries a block, scores and output in registers. */
static void attend_one(const bf16_t* q, const bf16_t* k, const bf16_t* v, int64_t sq, int64_t sk, int64_t sv,
                       bf16_t* out, int64_t so, int64_t t0, int64_t L, int64_t h, int64_t kvh, float scale2,
                       int causal, int64_t left, int64_t right,
                       uint32_t* Kp, uint32_t* Vp, float* S, bf16_t* P, bf16_t* Qb, float* O, ahead_t* ahead) {
    (void)Qb; (void)O;
    const int64_t Lp = (L + KB - 1) & ~(int64_t)(KB - 1), Lh = (L + 1) / 2;
    layout_kv(k, v, sk, sv, t0, L, Lp, kvh, Kp, Vp);
    for (int64_t i0 = 0; i0 < L; i0 += QB) {
        const int nq = L - i0 < QB ? (int)(L - i0) : QB;
        fetch_ahead(ahead, (L - i0 + QB - 1) / QB);
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
        int64_t jb = blo;  /* scores: QB queries x 64 keys a step, then 32, then 16 */
        for (; jb + 64 <= bhi; jb += 64) score_tiles(Kp, Lp, jb, qr, S, 4);
        for (; jb + 32 <= bhi; jb += 32) score_tiles(Kp, Lp, jb, qr, S, 2);
        for (; jb < bhi; jb += 16) score_tiles(Kp, Lp, jb, qr, S, 1);
        float inv[QB];
        if (!causal && left < 0 && right < 0) softmax_full(S, P, Lp, QB, L, scale2, inv);
        else softmax_rows(S, P, Lp, QB, lo, hi, blo, bhi, scale2, inv);
        __m512 o[PV_SETS][QB][NV];
        for (int st = 0; st < PV_SETS; st++)
            for (int qi = 0; qi < QB; qi++)
                for (int cv = 0; cv < NV; cv++) o[st][qi][cv] = _mm512_setzero_ps();
        const int64_t pend = bhi / 2 < Lh ? bhi / 2 : Lh;
        int64_t jp = blo / 2;
        for (; jp + PV_SETS <= pend; jp += PV_SETS)  /* out += P V over pairs of keys */
            for (int st = 0; st < PV_SETS; st++) pv_pair(Vp, P, Lp, jp + st, o[st]);
        if (jp < pend) pv_pair(Vp, P, Lp, jp, o[0]);
        for (int qi = 0; qi < nq; qi++) {
            bf16_t* dst = out + (t0 + i0 + qi) * so + h * HD;
            for (int cv = 0; cv < NV; cv++) {
                __m512 sum = o[0][qi][cv];
                for (int st = 1; st < PV_SETS; st++) sum = _mm512_add_ps(sum, o[st][qi][cv]);
                store_bf16(dst + cv * 16, _mm512_mul_ps(sum, _mm512_set1_ps(inv[qi])));
            }
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
    const unsigned int csr = _mm_getcsr();  /* flush tiny terms to zero: denormals cost a microcode assist each */
    _mm_setcsr(csr | 0x8040);
#ifdef POOLGATE_AMX
    configure_tiles();
#endif
    const float scale2 = scale * 1.4426950408889634f;
    const int64_t group = heads / kv_heads;
    for (int64_t item = item0; item < item1; item++) {
        const int64_t s = item / heads, h = item % heads;
        const int64_t L = cu[s + 1] - cu[s];
        ahead_t ahead = {0};
        if ((s + 1) * heads < item1) {
            /* the next sequence's rows whole, a heads-th of them during each of this sequence's items: each row
             * is read in one pass, not a head's 64 bytes at a time 2,304 bytes apart, and the next sequence's
             * items find all their heads in cache (measured in the model: 5-6% faster a layer, 7.6-7.9 -> 7.2-7.4 ms) */
            const int64_t a0 = cu[s + 1], n = cu[s + 2] - cu[s + 1];
            ahead = (ahead_t){q, k, v, out, sq, sk, sv, so, a0 + h * n / heads, a0 + (h + 1) * n / heads,
                              heads * HD, kv_heads * HD};
            if (n > max_len) ahead.end = ahead.next;
        } else if (item + 1 < item1) {  /* the range's last sequence: the next head's slice of its rows */
            const int64_t h2 = h + 1, kh2 = h2 / group;
            ahead = (ahead_t){q + h2 * HD, k + kh2 * HD, v + kh2 * HD, out + h2 * HD, sq, sk, sv, so, cu[s], cu[s + 1],
                              HD, HD};
            if (L > max_len) ahead.end = ahead.next;
        }
        if (L > 0 && L <= max_len)
            attend_one(q, k, v, sq, sk, sv, out, so, cu[s], L, h, h / group, scale2, causal, left, right,
                       (uint32_t*)Kp, (uint32_t*)Vp, (float*)S, (bf16_t*)P, (bf16_t*)Qb, (float*)O, &ahead);
        else
            fetch_ahead(&ahead, 1);  /* an item left to the caller: its share of the rows ahead at once */
    }
#ifdef POOLGATE_AMX
    _tile_release();
#endif
    _mm_setcsr(csr);
    free(Kp); free(Vp); free(S); free(P); free(Qb); free(O);
    return 0;
}
