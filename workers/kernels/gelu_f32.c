/* GELU in place on fp32 for x86 CPUs with AVX2 and FMA: the exact (erf) form and the tanh form.
 *
 * Built and loaded by gelu_f32.py (gcc -mavx2 -mfma, cached). x is n contiguous floats; a call does elements
 * [start, stop), so a caller can split one tensor over threads (start a multiple of 8 but for the last range).
 *
 * Exact: gelu(x) = x/2 * w with w = 1 + erf(z), z = x / sqrt 2, taken as erfc(|z|) for z < 0 and 2 - erfc(|z|)
 * for z >= 0, so w keeps its relative accuracy where it is small (x < 0: no 1 - erf cancellation), and near
 * z = 0, where w is about 1, erf's own cancellation weighs nothing. erfc(a) = 2^S(a), S of degree 10 on
 * [0, 3.92] (a weighted least-squares (Lawson) fit of log2 erfc against mpmath, each coefficient rounded to
 * fp32 in turn and the rest refitted around it; erfc's absolute error 1.4e-7 in fp32, with the exp2's). For
 * |z| >= 3.92: w = 2 for z > 0 (erfc rounds off 2), the result 0 for z < 0. NaN stays NaN (x/2 is NaN), +inf
 * gives +inf and -inf gives 0 (torch's erf GELU gives NaN for both infinities).
 * Tanh: gelu(x) = x/2 * (1 + tanh(u)) = x / (1 + exp(-2u)), u = sqrt(2/pi) * (x + 0.044715 x^3); 0 below
 * u = -40 (where the division would read inf / huge), x itself where exp(-2u) is below fp32's range.
 * The tanh form's exp: 2^n * e^r, n = round(x log2 e), r = x - n ln 2 in two parts, e^r by its Taylor series
 * to r^7 (|r| <= ln2 / 2: truncation 5e-9 relative). Denormal results are flushed for the call (MXCSR restored after).
 */
#include <immintrin.h>
#include <stdint.h>

/* e^x for x in [-87, 88]: the caller clamps */
static inline __m256 exp_ps(__m256 x) {
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);  /* ln 2 in 16 bits, exact */
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.4286068202862268e-06f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* 2^x for x in [-126, 0] (packed_attention_f32.c's): 2^n * p(f), n = round(x), f in [-0.5, 0.5] */
static inline __m256 exp2_ps(__m256 x) {
    const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 f = _mm256_sub_ps(x, n);
    const __m256 f2 = _mm256_mul_ps(f, f);  /* Estrin's scheme, as S's below */
    const __m256 p01 = _mm256_fmadd_ps(_mm256_set1_ps(0.6931471824645996f), f, _mm256_set1_ps(1.0000001192092896f));
    const __m256 p23 = _mm256_fmadd_ps(_mm256_set1_ps(0.05550327152013779f), f, _mm256_set1_ps(0.2402210682630539f));
    const __m256 p45 = _mm256_fmadd_ps(_mm256_set1_ps(0.0013400432653725147f), f, _mm256_set1_ps(0.009676037356257439f));
    const __m256 p = _mm256_fmadd_ps(_mm256_fmadd_ps(p45, f2, p23), f2, p01);
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

static inline __m256 gelu_erf(__m256 x) {
    const __m256 hx = _mm256_mul_ps(x, _mm256_set1_ps(0.5f));
    const __m256 z = _mm256_mul_ps(x, _mm256_set1_ps(0.70710678118654752f));
    /* a = min(|z|, 3.92) (NaN gives 3.92, its result NaN all the same via x/2) */
    const __m256 a = _mm256_min_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), z), _mm256_set1_ps(3.92f));
    /* S(a) by Estrin's scheme: a chain of 4 FMAs deep, not 10, so more vectors are in flight at once */
    const __m256 a2 = _mm256_mul_ps(a, a), a4 = _mm256_mul_ps(a2, a2), a8 = _mm256_mul_ps(a4, a4);
    const __m256 p01 = _mm256_fmadd_ps(_mm256_set1_ps(-1.6279196739196777f), a, _mm256_set1_ps(1.9833538544844487e-07f));
    const __m256 p23 = _mm256_fmadd_ps(_mm256_set1_ps(-0.14881078898906708f), a, _mm256_set1_ps(-0.9183152914047241f));
    const __m256 p45 = _mm256_fmadd_ps(_mm256_set1_ps(-0.0009869412751868367f), a, _mm256_set1_ps(0.02871023491024971f));
    const __m256 p67 = _mm256_fmadd_ps(_mm256_set1_ps(0.0006214035674929619f), a, _mm256_set1_ps(-0.0016081173671409488f));
    const __m256 p89 = _mm256_fmadd_ps(_mm256_set1_ps(1.2387079550535418e-05f), a, _mm256_set1_ps(-0.00011940341937588528f));
    const __m256 q0 = _mm256_fmadd_ps(p23, a2, p01), q1 = _mm256_fmadd_ps(p67, a2, p45);
    const __m256 q2 = _mm256_fmadd_ps(_mm256_set1_ps(-5.509020866156789e-07f), a2, p89);
    const __m256 s = _mm256_fmadd_ps(q2, a8, _mm256_fmadd_ps(q1, a4, q0));
    const __m256 erfc = exp2_ps(s);
    /* w = 1 + erf(z): erfc(|z|) where z's sign bit is set, 2 - erfc(|z|) elsewhere */
    const __m256 w = _mm256_blendv_ps(_mm256_sub_ps(_mm256_set1_ps(2.0f), erfc), erfc, z);
    /* z <= -3.92: 0 (also for -inf, where x/2 * w would be NaN) */
    return _mm256_andnot_ps(_mm256_cmp_ps(z, _mm256_set1_ps(-3.92f), _CMP_LE_OQ), _mm256_mul_ps(hx, w));
}

static inline __m256 gelu_tanh(__m256 x) {
    const __m256 x2 = _mm256_mul_ps(x, x);
    const __m256 u = _mm256_mul_ps(_mm256_mul_ps(x, _mm256_set1_ps(0.79788456080286536f)),
                                   _mm256_fmadd_ps(x2, _mm256_set1_ps(0.044715f), _mm256_set1_ps(1.0f)));
    const __m256 m2u = _mm256_mul_ps(u, _mm256_set1_ps(-2.0f));  /* NaN: clamped to -87, the result NaN */
    const __m256 e = exp_ps(_mm256_min_ps(_mm256_max_ps(m2u, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(80.0f)));
    const __m256 y = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
    return _mm256_andnot_ps(_mm256_cmp_ps(m2u, _mm256_set1_ps(80.0f), _CMP_GT_OQ), y);
}

static inline __m256i tail_mask(int64_t left) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int32_t)left), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

int poolgate_gelu_f32(float* x, int tanh_form, int64_t start, int64_t stop) {
    const unsigned int csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8000);  /* flush denormal results to zero */
    int64_t i = start;
    if (tanh_form) {
        for (; i + 8 <= stop; i += 8) _mm256_storeu_ps(x + i, gelu_tanh(_mm256_loadu_ps(x + i)));
        for (; i < stop; i += 8) {
            const __m256i m = tail_mask(stop - i);
            _mm256_maskstore_ps(x + i, m, gelu_tanh(_mm256_maskload_ps(x + i, m)));
        }
    } else {
        for (; i + 8 <= stop; i += 8) _mm256_storeu_ps(x + i, gelu_erf(_mm256_loadu_ps(x + i)));
        for (; i < stop; i += 8) {
            const __m256i m = tail_mask(stop - i);
            _mm256_maskstore_ps(x + i, m, gelu_erf(_mm256_maskload_ps(x + i, m)));
        }
    }
    _mm_setcsr(csr);
    return 0;
}
