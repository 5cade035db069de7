/* Products y = x W^T (+ b) for the few rows of a decoding step (one token, or a draft tree's nodes), on AVX2 + FMA.
 *
 * W is packed once in panels of 16 output columns: panel p holds W[16p + j, k] at [p][k][j] (K x 16, contiguous),
 * so a product streams every weight from memory exactly once, whatever the number of rows, and reuses each loaded
 * weight vector for every row (up to 4 rows per pass over a panel, which stays in L1 for the next 4).
 *
 * Weights are bfloat16 (the upper half of a float32, widened exactly by a shift) or float32; inputs, accumulation
 * and outputs are float32: the numbers of a bf16 GEMM with float32 accumulation, up to summation order.
 * One 256-bit load gives 16 bf16 weights: the even columns (shifted left by 16) and the odd ones (masked), so
 * the two accumulators of a row hold the even and the odd columns of the panel (the store undoes it).
 * Each output vector is split over KU partial sums for one or two rows, so that enough FMA chains are in flight to
 * hide the FMA latency. Panels are split over OpenMP threads (torch's own runtime: same soname, loaded first). */
#include <immintrin.h>
#include <stdint.h>

#define NB 16
#define PREFETCH 1024 /* elements ahead: the hardware prefetcher alone leaves about a fifth of the bandwidth */

#define LD_F32(p, w0, w1) do { w0 = _mm256_loadu_ps(p); w1 = _mm256_loadu_ps((p) + 8); } while (0)
#define LD_BF16(p, w0, w1) do {                                                                              \
    __m256i v_ = _mm256_loadu_si256((const __m256i *)(p));                                                   \
    w0 = _mm256_castsi256_ps(_mm256_slli_epi32(v_, 16));                                                     \
    w1 = _mm256_castsi256_ps(_mm256_and_si256(v_, _mm256_set1_epi32((int)0xFFFF0000u)));                     \
} while (0)
#define COL_F32(j) (j)
#define COL_BF16(j) (((j) & 1) * 8 + ((j) >> 1))

/* One panel times M rows (M a compile-time constant), the k loop split KU ways. */
#define BLOCK(NAME, WT, LOAD, M, KU)                                                                         \
static void NAME##_m##M(const float *x, int64_t K, const WT *panel, float *acc) {                            \
    __m256 a[M][KU][2];                                                                                      \
    for (int m = 0; m < M; m++)                                                                              \
        for (int u = 0; u < KU; u++) a[m][u][0] = a[m][u][1] = _mm256_setzero_ps();                         \
    int64_t k = 0;                                                                                           \
    for (; k + KU <= K; k += KU) {                                                                           \
        for (int u = 0; u < KU; u++) {                                                                       \
            const WT *p = panel + (k + u) * NB;                                                              \
            _mm_prefetch((const char *)(p + PREFETCH), _MM_HINT_T0);                                         \
            __m256 w0, w1;                                                                                   \
            LOAD(p, w0, w1);                                                                                 \
            for (int m = 0; m < M; m++) {                                                                    \
                __m256 xv = _mm256_broadcast_ss(x + m * K + k + u);                                          \
                a[m][u][0] = _mm256_fmadd_ps(xv, w0, a[m][u][0]);                                            \
                a[m][u][1] = _mm256_fmadd_ps(xv, w1, a[m][u][1]);                                            \
            }                                                                                                \
        }                                                                                                    \
    }                                                                                                        \
    for (; k < K; k++) {                                                                                     \
        __m256 w0, w1;                                                                                       \
        LOAD(panel + k * NB, w0, w1);                                                                        \
        for (int m = 0; m < M; m++) {                                                                        \
            __m256 xv = _mm256_broadcast_ss(x + m * K + k);                                                  \
            a[m][0][0] = _mm256_fmadd_ps(xv, w0, a[m][0][0]);                                                \
            a[m][0][1] = _mm256_fmadd_ps(xv, w1, a[m][0][1]);                                                \
        }                                                                                                    \
    }                                                                                                        \
    for (int m = 0; m < M; m++) {                                                                            \
        for (int u = 1; u < KU; u++) {                                                                       \
            a[m][0][0] = _mm256_add_ps(a[m][0][0], a[m][u][0]);                                              \
            a[m][0][1] = _mm256_add_ps(a[m][0][1], a[m][u][1]);                                              \
        }                                                                                                    \
        _mm256_storeu_ps(acc + m * NB, a[m][0][0]);                                                          \
        _mm256_storeu_ps(acc + m * NB + 8, a[m][0][1]);                                                      \
    }                                                                                                        \
}

#define KERNEL(NAME, WT, LOAD, COL)                                                                          \
BLOCK(NAME, WT, LOAD, 1, 2)                                                                                  \
BLOCK(NAME, WT, LOAD, 2, 2)                                                                                  \
BLOCK(NAME, WT, LOAD, 3, 1)                                                                                  \
BLOCK(NAME, WT, LOAD, 4, 1)                                                                                  \
void NAME(const float *x, int64_t M, int64_t K, const WT *w, int64_t N, const float *bias, float *y,         \
          int threads) {                                                                                     \
    int64_t panels = (N + NB - 1) / NB;                                                                      \
    _Pragma("omp parallel for num_threads(threads) schedule(static)")                                        \
    for (int64_t p = 0; p < panels; p++) {                                                                   \
        float acc[4 * NB];                                                                                   \
        const WT *panel = w + p * K * NB;                                                                    \
        int64_t n0 = p * NB, nn = N - n0 < NB ? N - n0 : NB;                                                 \
        for (int64_t m0 = 0; m0 < M; m0 += 4) {                                                              \
            int64_t rows = M - m0 < 4 ? M - m0 : 4;                                                          \
            const float *xr = x + m0 * K;                                                                    \
            switch (rows) {                                                                                  \
                case 1: NAME##_m1(xr, K, panel, acc); break;                                                 \
                case 2: NAME##_m2(xr, K, panel, acc); break;                                                 \
                case 3: NAME##_m3(xr, K, panel, acc); break;                                                 \
                default: NAME##_m4(xr, K, panel, acc); break;                                                \
            }                                                                                                \
            for (int64_t m = 0; m < rows; m++) {                                                             \
                float *out = y + (m0 + m) * N + n0;                                                          \
                for (int64_t j = 0; j < nn; j++)                                                             \
                    out[j] = acc[m * NB + COL(j)] + (bias ? bias[n0 + j] : 0.0f);                            \
            }                                                                                                \
        }                                                                                                    \
    }                                                                                                        \
}

KERNEL(skinny_bf16, uint16_t, LD_BF16, COL_BF16)
KERNEL(skinny_f32, float, LD_F32, COL_F32)
