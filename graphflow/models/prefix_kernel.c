/* Attention of a few queries over a prefix's KV, read from its stored blocks in place.
 *
 * Built and loaded by graphflow/models/prefix_kernel.py (see its docstring for why this exists
 * and what it measured). float32 or bfloat16 KV (read as float32), float32 queries, head
 * dimension 16, 32, 64 or 128. Two builds of one source:
 * AVX-512 where the compiler targets it, else portable 8-float vectors (GCC / Clang vector
 * extensions: AVX2 on x86-64, NEON on Arm, whatever the target has); prefix_kernel_isa() says
 * which was built.
 *
 * q, out: [kv_heads, G, D] (G: the queries of every query head sharing a KV head, folded);
 * lse: [kv_heads, G], the natural log-sum-exp of each query's scaled scores.
 * blocks: n rows of BLOCK_FIELDS int64: the block's address, its tokens, the element strides
 * of its layer, key/value, KV head and token dimensions (the head dimension is contiguous), and
 * its element's bytes (4: float32, 2: bfloat16; the first block's is every block's). Keys of
 * block b, layer l, head h start at address + l*layer + h*head elements; values kv elements
 * further.
 *
 * Each block's keys are scored a vector's width at a time against each query, softmax runs
 * online (a running max and sum per query), and the values are accumulated with every query's
 * weights in registers. The next block's keys and values are prefetched while one block is
 * read (blocks are small separate allocations; this took a step over 8 prefixes from 29 to
 * 23.5 ms here with AVX-512).
 */
#include <math.h>
#include <stdint.h>

enum { BLOCK_FIELDS = 7 };

static inline void prefetch_block(const int64_t *blk, int64_t layer, int64_t head) {
    const int64_t size = blk[6];
    const char *k = (const char *)(intptr_t)blk[0] + (layer * blk[2] + head * blk[4]) * size;
    const int64_t bytes = blk[1] * blk[5] * size, kv = blk[3] * size;
    for (int64_t o = 0; o < bytes; o += 64) {
        __builtin_prefetch(k + o, 0, 3);
        __builtin_prefetch(k + kv + o, 0, 3);
    }
}

#if defined(__AVX512F__)
#include <immintrin.h>

enum { LANES = 16 };
typedef __m512 vec;

const char *prefix_kernel_isa(void) { return "avx512"; }

/* queries whose sums stay in registers, by head dimension */
#define GROUPS(D) ((D) == 128 ? 3 : 6)
#define VZERO() _mm512_setzero_ps()
#define VSPLAT(x) _mm512_set1_ps(x)
#define VSTORE(p, v) _mm512_storeu_ps(p, v)

static inline vec load_f32(const float *p) { return _mm512_loadu_ps(p); }

/* 16 bfloat16s as float32: each one's bits are a float32's upper half */
static inline vec load_bf16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
#define VMUL(a, b) _mm512_mul_ps(a, b)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)

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

/* lane j: scale * q . k_j for the block's keys j < T (16 at a time, summed by a transpose), -inf past T;
 * top: the largest */
#define DEFINE_SCORES(NAME, ELEM, LOAD)                                                                   \
    static inline vec NAME(const float *qg, const ELEM *K, int64_t step, int T, int C, float scale, float *top) { \
        __m512 part[LANES];                                                                            \
        for (int j = 0; j < LANES; j++) {                                                              \
            const ELEM *kj = K + (j < T ? j : 0) * step;                                               \
            __m512 s = _mm512_mul_ps(_mm512_loadu_ps(qg), LOAD(kj));                                   \
            for (int c = 1; c < C; c++) s = _mm512_fmadd_ps(_mm512_loadu_ps(qg + 16 * c), LOAD(kj + 16 * c), s); \
            part[j] = s;                                                                               \
        }                                                                                              \
        __m512 s = _mm512_mul_ps(lane_sums(part), _mm512_set1_ps(scale));                              \
        s = _mm512_mask_blend_ps((__mmask16)((1u << T) - 1u), _mm512_set1_ps(-INFINITY), s);           \
        *top = _mm512_reduce_max_ps(s);                                                                \
        return s;                                                                                      \
    }

static inline float vsum(vec v) { return _mm512_reduce_add_ps(v); }

/* e^(s - top) for lanes j < T, 0 past T */
static inline vec weights(vec s, float top, int T) {
    return _mm512_maskz_mov_ps((__mmask16)((1u << T) - 1u), exp_nonpositive(_mm512_sub_ps(s, _mm512_set1_ps(top))));
}

#else /* portable 8-float vectors */

enum { LANES = 8 };
typedef float v8 __attribute__((vector_size(32)));
typedef v8 vec;
typedef int32_t v8i __attribute__((vector_size(32)));

static inline v8 load8(const float *p) {
    v8 v;
    __builtin_memcpy(&v, p, sizeof v);
    return v;
}

static inline void store8(float *p, v8 v) { __builtin_memcpy(p, &v, sizeof v); }

typedef uint16_t v8h __attribute__((vector_size(16)));
typedef uint32_t v8u __attribute__((vector_size(32)));

static inline vec load_f32(const float *p) { return load8(p); }

/* 8 bfloat16s as float32: each one's bits are a float32's upper half */
static inline vec load_bf16(const uint16_t *p) {
    v8h h;
    __builtin_memcpy(&h, p, sizeof h);
    const v8u bits = __builtin_convertvector(h, v8u) << 16;
    v8 v;
    __builtin_memcpy(&v, &bits, sizeof v);
    return v;
}

static inline v8 splat8(float x) { return (v8){x, x, x, x, x, x, x, x}; }

static inline float sum8(v8 v) { return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7])); }

static inline v8 exp8_nonpositive(v8 x) {
    /* the AVX-512 build's e^x, lane by lane: 2^n * p(r), n rounded to nearest by adding and
     * taking away 1.5 * 2^23, 2^n made from its exponent bits (n >= -126 once x >= -87) */
    for (int i = 0; i < LANES; i++) x[i] = x[i] < -87.0f ? -87.0f : x[i];
    const v8 n = (x * splat8(1.44269504088896341f) + splat8(12582912.0f)) - splat8(12582912.0f);
    v8 r = x - n * splat8(0.693359375f);
    r = r - n * splat8(-2.12194440e-4f);
    v8 p = splat8(1.9875691500e-4f);
    p = p * r + splat8(1.3981999507e-3f);
    p = p * r + splat8(8.3334519073e-3f);
    p = p * r + splat8(4.1665795894e-2f);
    p = p * r + splat8(1.6666665459e-1f);
    p = p * r + splat8(5.0000001201e-1f);
    p = p * (r * r) + (r + splat8(1.0f));
    const v8i bits = (__builtin_convertvector(n, v8i) + 127) << 23;
    v8 scale;
    __builtin_memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

const char *prefix_kernel_isa(void) { return "portable 8-float vectors"; }

/* timed on AVX2's 16 registers: at head dimension 64, 2 took 41 ms where 6 took 48; 1 at 128 */
#define GROUPS(D) ((D) == 16 ? 6 : (D) == 32 ? 4 : (D) == 64 ? 2 : 1)
#define VZERO() splat8(0.0f)
#define VSPLAT(x) splat8(x)
#define VSTORE(p, v) store8(p, v)
#define VMUL(a, b) ((a) * (b))
#define VFMA(a, b, c) ((a) * (b) + (c))

/* lane j: scale * q . k_j for the block's keys j < T, each summed across its lanes (a transpose
 * by shuffles, as the AVX-512 build sums them, took 53 against 48 ms on AVX2), -inf past T; top: the largest */
#define DEFINE_SCORES(NAME, ELEM, LOAD)                                                                   \
    static inline vec NAME(const float *qg, const ELEM *K, int64_t step, int T, int C, float scale, float *top) { \
        float s[LANES];                                                                                \
        *top = -INFINITY;                                                                              \
        for (int j = 0; j < LANES; j++) {                                                              \
            if (j >= T) {                                                                              \
                s[j] = -INFINITY;                                                                      \
                continue;                                                                              \
            }                                                                                          \
            const ELEM *kj = K + j * step;                                                             \
            v8 a = load8(qg) * LOAD(kj);                                                               \
            for (int c = 1; c < C; c++) a += load8(qg + 8 * c) * LOAD(kj + 8 * c);                    \
            s[j] = sum8(a) * scale;                                                                    \
            *top = s[j] > *top ? s[j] : *top;                                                          \
        }                                                                                              \
        return load8(s);                                                                               \
    }

static inline float vsum(vec v) { return sum8(v); }

/* e^(s - top) for lanes j < T, 0 past T */
static inline vec weights(vec s, float top, int T) {
    v8 e = exp8_nonpositive(s - splat8(top));
    for (int j = T; j < LANES; j++) e[j] = 0.0f;
    return e;
}

#endif

DEFINE_SCORES(scores_f32, float, load_f32)
DEFINE_SCORES(scores_bf16, uint16_t, load_bf16)

/* One head dimension D over KV of ELEM (read by LOAD, scored by SCORES); C: its vector chunks */
#define DEFINE_ATTEND(NAME, D, ELEM, LOAD, SCORES)                                                       \
    static void NAME(const float *q, int64_t heads, int64_t G, float scale, const int64_t *blocks,    \
                     int64_t n, int64_t layer, float *out, float *lse) {                              \
        enum { C = (D) / LANES, MAXG = GROUPS(D) };                                                    \
        for (int64_t h = 0; h < heads; h++) {                                                          \
            for (int64_t g0 = 0; g0 < G; g0 += MAXG) {                                                 \
                const int ng = (int)(G - g0 < MAXG ? G - g0 : MAXG);                                   \
                const float *qh = q + (h * G + g0) * (D);                                              \
                float m[MAXG], l[MAXG];                                                                \
                vec acc[MAXG][C];                                                                      \
                for (int g = 0; g < ng; g++) {                                                         \
                    m[g] = -INFINITY;                                                                  \
                    l[g] = 0.0f;                                                                       \
                    for (int c = 0; c < C; c++) acc[g][c] = VZERO();                                   \
                }                                                                                      \
                for (int64_t b = 0; b < n; b++) {                                                      \
                    const int64_t *blk = blocks + b * BLOCK_FIELDS;                                    \
                    if (b + 1 < n) prefetch_block(blk + BLOCK_FIELDS, layer, h);                       \
                    const ELEM *keys = (const ELEM *)(intptr_t)blk[0] + layer * blk[2] + h * blk[4];   \
                    const int64_t kv = blk[3], step = blk[5];                                          \
                    for (int64_t t0 = 0; t0 < blk[1]; t0 += LANES) {                                   \
                        const int T = (int)(blk[1] - t0 < LANES ? blk[1] - t0 : LANES);                \
                        const ELEM *K = keys + t0 * step, *V = K + kv;                                 \
                        float w[MAXG][LANES];                                                          \
                        for (int g = 0; g < ng; g++) {                                                 \
                            float top;                                                                 \
                            const vec s = SCORES(qh + g * (D), K, step, T, C, scale, &top);            \
                            const float mnew = top > m[g] ? top : m[g];                                \
                            const float corr = expf(m[g] - mnew);                                      \
                            const vec e = weights(s, mnew, T);                                         \
                            l[g] = l[g] * corr + vsum(e);                                              \
                            m[g] = mnew;                                                               \
                            for (int c = 0; c < C; c++) acc[g][c] = VMUL(acc[g][c], VSPLAT(corr));     \
                            VSTORE(w[g], e);                                                           \
                        }                                                                              \
                        for (int j = 0; j < T; j++) {                                                  \
                            const ELEM *vj = V + j * step;                                             \
                            for (int c = 0; c < C; c++) {                                              \
                                const vec vv = LOAD(vj + LANES * c);                                   \
                                for (int g = 0; g < ng; g++) acc[g][c] = VFMA(VSPLAT(w[g][j]), vv, acc[g][c]); \
                            }                                                                          \
                        }                                                                              \
                    }                                                                                  \
                }                                                                                      \
                for (int g = 0; g < ng; g++) {                                                         \
                    const vec inv = VSPLAT(1.0f / l[g]);                                               \
                    float *og = out + (h * G + g0 + g) * (D);                                          \
                    for (int c = 0; c < C; c++) VSTORE(og + LANES * c, VMUL(acc[g][c], inv));          \
                    lse[h * G + g0 + g] = m[g] + logf(l[g]);                                           \
                }                                                                                      \
            }                                                                                          \
        }                                                                                              \
    }

#define DEFINE_ATTENDS(E, ELEM)                                                                          \
    DEFINE_ATTEND(attend_##E##_d16, 16, ELEM, load_##E, scores_##E)                                     \
    DEFINE_ATTEND(attend_##E##_d32, 32, ELEM, load_##E, scores_##E)                                     \
    DEFINE_ATTEND(attend_##E##_d64, 64, ELEM, load_##E, scores_##E)                                     \
    DEFINE_ATTEND(attend_##E##_d128, 128, ELEM, load_##E, scores_##E)

DEFINE_ATTENDS(f32, float)
DEFINE_ATTENDS(bf16, uint16_t)

#define CALL_ATTEND(E)                                                                                   \
    switch (D) {                                                                                       \
    case 16: attend_##E##_d16(q, heads, G, scale, blocks, n, layer, out, lse); return 0;                \
    case 32: attend_##E##_d32(q, heads, G, scale, blocks, n, layer, out, lse); return 0;                \
    case 64: attend_##E##_d64(q, heads, G, scale, blocks, n, layer, out, lse); return 0;                \
    case 128: attend_##E##_d128(q, heads, G, scale, blocks, n, layer, out, lse); return 0;              \
    default: return 1;                                                                                 \
    }

/* 0 when done; 1 when the head dimension is not one this kernel has; 2 when the element is not */
int prefix_attend(const float *q, int64_t heads, int64_t G, int64_t D, float scale, const int64_t *blocks,
                  int64_t n, int64_t layer, float *out, float *lse) {
    const int64_t size = n > 0 ? blocks[6] : 4;
    if (size == 4) CALL_ATTEND(f32)
    if (size == 2) CALL_ATTEND(bf16)
    return 2;
}
