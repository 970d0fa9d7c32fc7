/* Attention of a few queries over a prefix's KV, read from its stored blocks in place.
 *
 * Built and loaded by graphflow/models/prefix_kernel.py (see its docstring for why this exists
 * and what it measured). float32, AVX-512, head dimension 16, 32, 64 or 128.
 *
 * q, out: [kv_heads, G, D] (G: the queries of every query head sharing a KV head, folded);
 * lse: [kv_heads, G], the natural log-sum-exp of each query's scaled scores.
 * blocks: n rows of BLOCK_FIELDS int64: the block's address, its tokens, and the element
 * strides of its layer, key/value, KV head and token dimensions (the head dimension is
 * contiguous). Keys of block b, layer l, head h start at address + l*layer + h*head; values
 * kv elements further.
 *
 * Each block's keys are scored 16 at a time against each query (one FMA chain per key, the 16
 * lanes summed by a transpose), softmax runs online (a running max and sum per query), and
 * the values are accumulated with every query's weights in registers. The next block's keys
 * and values are prefetched while one block is read (blocks are small separate allocations;
 * this took a step over 8 prefixes from 29 to 23.5 ms here).
 */
#include <math.h>
#include <stdint.h>

#ifndef __AVX512F__
#error "the prefix kernel needs AVX-512 (this compiler does not target it on this host)"
#endif
#include <immintrin.h>

enum { BLOCK_FIELDS = 6, LANES = 16 };

static inline __m512 exp_nonpositive(__m512 x) {
    /* e^x for x <= 0: 2^n * p(r), r = x - n ln 2 in [-ln2/2, ln2/2] (Cephes' expf polynomial) */
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

/* lane j of the result: the sum of v[j]'s lanes */
static inline __m512 lane_sums(const __m512 *v) {
    __m512 a[8], b[4], c[2];
    for (int i = 0; i < 8; i++)
        a[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++) {
        __m512d x = _mm512_castps_pd(a[2 * i]), y = _mm512_castps_pd(a[2 * i + 1]);
        b[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    for (int i = 0; i < 2; i++)
        c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xDD));
}

static inline void prefetch_block(const int64_t *blk, int64_t layer, int64_t head) {
    const char *k = (const char *)((const float *)(intptr_t)blk[0] + layer * blk[2] + head * blk[4]);
    const int64_t bytes = blk[1] * blk[5] * (int64_t)sizeof(float), kv = blk[3] * (int64_t)sizeof(float);
    for (int64_t o = 0; o < bytes; o += 64) {
        _mm_prefetch(k + o, _MM_HINT_T0);
        _mm_prefetch(k + kv + o, _MM_HINT_T0);
    }
}

/* C: 16-float chunks of the head dimension; MAXG: queries whose sums stay in registers */
#define DEFINE_ATTEND(NAME, C, MAXG)                                                                     \
    static void NAME(const float *q, int64_t heads, int64_t G, float scale, const int64_t *blocks,    \
                     int64_t n, int64_t layer, float *out, float *lse) {                              \
        const int64_t D = 16 * (C);                                                                    \
        for (int64_t h = 0; h < heads; h++) {                                                          \
            for (int64_t g0 = 0; g0 < G; g0 += (MAXG)) {                                               \
                const int ng = (int)(G - g0 < (MAXG) ? G - g0 : (MAXG));                               \
                const float *qh = q + (h * G + g0) * D;                                                \
                float m[MAXG], l[MAXG];                                                                \
                __m512 acc[MAXG][C];                                                                   \
                for (int g = 0; g < ng; g++) {                                                         \
                    m[g] = -INFINITY;                                                                  \
                    l[g] = 0.0f;                                                                       \
                    for (int c = 0; c < (C); c++) acc[g][c] = _mm512_setzero_ps();                    \
                }                                                                                      \
                for (int64_t b = 0; b < n; b++) {                                                      \
                    const int64_t *blk = blocks + b * BLOCK_FIELDS;                                    \
                    if (b + 1 < n) prefetch_block(blk + BLOCK_FIELDS, layer, h);                       \
                    const float *keys = (const float *)(intptr_t)blk[0] + layer * blk[2] + h * blk[4]; \
                    const int64_t kv = blk[3], step = blk[5];                                          \
                    for (int64_t t0 = 0; t0 < blk[1]; t0 += LANES) {                                   \
                        const int T = (int)(blk[1] - t0 < LANES ? blk[1] - t0 : LANES);                \
                        const __mmask16 valid = (__mmask16)((1u << T) - 1u);                           \
                        const float *K = keys + t0 * step, *V = K + kv;                                \
                        float w[MAXG][LANES];                                                          \
                        for (int g = 0; g < ng; g++) {                                                 \
                            const float *qg = qh + g * D;                                              \
                            __m512 part[LANES];                                                        \
                            for (int j = 0; j < LANES; j++) {                                          \
                                const float *kj = K + (j < T ? j : 0) * step;                          \
                                __m512 s = _mm512_mul_ps(_mm512_loadu_ps(qg), _mm512_loadu_ps(kj));     \
                                for (int c = 1; c < (C); c++)                                          \
                                    s = _mm512_fmadd_ps(_mm512_loadu_ps(qg + 16 * c), _mm512_loadu_ps(kj + 16 * c), s); \
                                part[j] = s;                                                           \
                            }                                                                          \
                            __m512 s = _mm512_mul_ps(lane_sums(part), _mm512_set1_ps(scale));          \
                            s = _mm512_mask_blend_ps(valid, _mm512_set1_ps(-INFINITY), s);             \
                            const float top = _mm512_reduce_max_ps(s);                                 \
                            const float mnew = top > m[g] ? top : m[g];                                \
                            const float corr = expf(m[g] - mnew);                                      \
                            const __m512 e = _mm512_maskz_mov_ps(valid, exp_nonpositive(_mm512_sub_ps(s, _mm512_set1_ps(mnew)))); \
                            l[g] = l[g] * corr + _mm512_reduce_add_ps(e);                              \
                            m[g] = mnew;                                                               \
                            for (int c = 0; c < (C); c++) acc[g][c] = _mm512_mul_ps(acc[g][c], _mm512_set1_ps(corr)); \
                            _mm512_storeu_ps(w[g], e);                                                 \
                        }                                                                              \
                        for (int j = 0; j < T; j++) {                                                  \
                            const float *vj = V + j * step;                                            \
                            for (int c = 0; c < (C); c++) {                                            \
                                const __m512 vv = _mm512_loadu_ps(vj + 16 * c);                        \
                                for (int g = 0; g < ng; g++)                                           \
                                    acc[g][c] = _mm512_fmadd_ps(_mm512_set1_ps(w[g][j]), vv, acc[g][c]); \
                            }                                                                          \
                        }                                                                              \
                    }                                                                                  \
                }                                                                                      \
                for (int g = 0; g < ng; g++) {                                                         \
                    const __m512 inv = _mm512_set1_ps(1.0f / l[g]);                                    \
                    float *og = out + (h * G + g0 + g) * D;                                            \
                    for (int c = 0; c < (C); c++) _mm512_storeu_ps(og + 16 * c, _mm512_mul_ps(acc[g][c], inv)); \
                    lse[h * G + g0 + g] = m[g] + logf(l[g]);                                           \
                }                                                                                      \
            }                                                                                          \
        }                                                                                              \
    }

DEFINE_ATTEND(attend_d16, 1, 6)
DEFINE_ATTEND(attend_d32, 2, 6)
DEFINE_ATTEND(attend_d64, 4, 6)
DEFINE_ATTEND(attend_d128, 8, 3)

/* 0 when done; 1 when the head dimension is not one this kernel has */
int prefix_attend(const float *q, int64_t heads, int64_t G, int64_t D, float scale, const int64_t *blocks,
                  int64_t n, int64_t layer, float *out, float *lse) {
    if (D == 16)
        attend_d16(q, heads, G, scale, blocks, n, layer, out, lse);
    else if (D == 32)
        attend_d32(q, heads, G, scale, blocks, n, layer, out, lse);
    else if (D == 64)
        attend_d64(q, heads, G, scale, blocks, n, layer, out, lse);
    else if (D == 128)
        attend_d128(q, heads, G, scale, blocks, n, layer, out, lse);
    else
        return 1;
    return 0;
}
