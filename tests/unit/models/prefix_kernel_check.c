/* A check of prefix_kernel.c run as a program of its own (for targets this host runs only under
 * emulation): prefix_attend over random float32 and bfloat16 blocks against attention computed
 * in double precision over the same values. Prints the build and the worst absolute error;
 * exits 0 when it is under 1e-5. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int prefix_attend(const float *q, int64_t heads, int64_t G, int64_t D, float scale, const int64_t *blocks,
                  int64_t n, int64_t layer, float *out, float *lse);
const char *prefix_kernel_isa(void);

enum { LAYERS = 2, HEADS = 2, TOKENS = 77, BLOCK = 16, BLOCKS = (TOKENS + BLOCK - 1) / BLOCK, FIELDS = 7 };

static float uniform(void) { return (float)rand() / (float)RAND_MAX * 2.0f - 1.0f; }

/* element i of a block described by d, as a double (a bfloat16 is a float32's upper half) */
static double element(const int64_t *d, int64_t i) {
    if (d[6] == 4) return ((const float *)(intptr_t)d[0])[i];
    const uint32_t bits = (uint32_t)((const uint16_t *)(intptr_t)d[0])[i] << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* blocks of [LAYERS, 2, HEADS, tokens, D] of size-byte elements (4: float32, 2: bfloat16), each
 * allocated on its own, described as the kernel reads them */
static void make_blocks(int D, int size, void **blocks, int64_t *desc) {
    for (int b = 0; b < BLOCKS; b++) {
        const int t = TOKENS - b * BLOCK < BLOCK ? TOKENS - b * BLOCK : BLOCK;
        const long n = (long)LAYERS * 2 * HEADS * t * D;
        blocks[b] = malloc((size_t)n * (size_t)size);
        for (long i = 0; i < n; i++) {
            const float x = 3.0f * uniform();
            uint32_t bits;
            memcpy(&bits, &x, sizeof bits);
            if (size == 4) ((float *)blocks[b])[i] = x;
            else ((uint16_t *)blocks[b])[i] = (uint16_t)(bits >> 16);
        }
        int64_t *d = desc + b * FIELDS;
        d[0] = (int64_t)(intptr_t)blocks[b];
        d[1] = t;
        d[2] = 2L * HEADS * t * D; /* layer */
        d[3] = (long)HEADS * t * D; /* key → value */
        d[4] = (long)t * D;         /* head */
        d[5] = D;                   /* token */
        d[6] = size;
    }
}

/* the worst error of one query's output and log-sum-exp against a double-precision softmax */
static double query_error(const float *qg, int D, float scale, const int64_t *desc, int layer, int h,
                          const float *out, float lse) {
    double scores[TOKENS], top = -INFINITY, sum = 0, acc[128] = {0}, worst = 0;
    for (int pass = 0, k = 0; pass < 2; pass++, k = 0) {
        for (int b = 0; b < BLOCKS; b++) {
            const int64_t *d = desc + b * FIELDS;
            const int64_t keys = layer * d[2] + h * d[4];
            for (int t = 0; t < d[1]; t++, k++) {
                if (pass == 0) {
                    double dot = 0;
                    for (int x = 0; x < D; x++) dot += (double)qg[x] * element(d, keys + t * d[5] + x);
                    scores[k] = dot * scale;
                    top = scores[k] > top ? scores[k] : top;
                } else {
                    const double w = exp(scores[k] - top);
                    sum += w;
                    for (int x = 0; x < D; x++) acc[x] += w * element(d, keys + d[3] + t * d[5] + x);
                }
            }
        }
    }
    for (int x = 0; x < D; x++) worst = fmax(worst, fabs(acc[x] / sum - out[x]));
    return fmax(worst, fabs(top + log(sum) - lse));
}

int main(void) {
    const int dims[] = {16, 32, 64, 128};
    double worst = 0;
    srand(1);
    for (int i = 0; i < 8; i++) {
        for (int G = 1; G <= 13; G += 4) { /* queries per KV head: one to past several register passes */
            const int D = dims[i % 4], size = i < 4 ? 4 : 2;
            float *q = malloc(sizeof(float) * HEADS * G * D), *out = malloc(sizeof(float) * HEADS * G * D);
            float *lse = malloc(sizeof(float) * HEADS * G);
            void *blocks[BLOCKS];
            int64_t desc[BLOCKS * FIELDS];
            make_blocks(D, size, blocks, desc);
            for (int x = 0; x < HEADS * G * D; x++) q[x] = uniform();
            const float scale = 1.0f / sqrtf((float)D);
            for (int layer = 0; layer < LAYERS; layer++) {
                if (prefix_attend(q, HEADS, G, D, scale, desc, BLOCKS, layer, out, lse) != 0) return 2;
                for (int h = 0; h < HEADS; h++)
                    for (int g = 0; g < G; g++) {
                        const int row = h * G + g;
                        worst = fmax(worst, query_error(q + row * D, D, scale, desc, layer, h, out + row * D, lse[row]));
                    }
            }
            for (int b = 0; b < BLOCKS; b++) free(blocks[b]);
            free(q), free(out), free(lse);
        }
    }
    printf("%s: worst absolute error %.2e\n", prefix_kernel_isa(), worst);
    return worst < 1e-5 ? 0 : 1;
}
