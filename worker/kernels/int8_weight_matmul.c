/* Int8 weight-only matmul on CPU: out[m][n] = scale[n] * sum_k x[m][k] * q[n][k] (+ bias[n]), float32 activations
 * and sums, int8 weights [N][K] as torchao's Int8Tensor stores them (one float32 scale per output channel). Each
 * weight byte is read once and widened in registers, never written back as a float weight: decode is bound by the
 * bytes of weights it streams, and this reads a quarter of float32's. Output channels are split across OpenMP
 * threads (torch's own runtime, libgomp, which this library shares when loaded into torch's process). Built and
 * loaded by worker/kernels/int8_matmul_kernel.py. */
#include <stdint.h>
#include <string.h>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#define LANES 16
typedef float float_vector __attribute__((vector_size(LANES * sizeof(float))));

static inline float lane_sum(float_vector v) {
    float sum = 0.0f;
    for (int i = 0; i < LANES; i++) sum += v[i];
    return sum;
}

/* GCC widens a vector of int8 to float one lane at a time, so the x86 instructions are named where there are some */
static inline float_vector widen(const int8_t *codes) {
#if defined(__AVX512F__)
    return (float_vector)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)codes)));
#elif defined(__AVX2__)
    const __m256 low = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)codes)));
    const __m256 high = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(codes + 8))));
    float_vector v;
    memcpy(&v, &low, sizeof low);
    memcpy((float *)&v + 8, &high, sizeof high);
    return v;
#else
    float_vector v;
    for (int i = 0; i < LANES; i++) v[i] = (float)codes[i];
    return v;
#endif
}

static inline float_vector load_floats(const float *values) {
    float_vector v;
    memcpy(&v, values, sizeof v);
    return v;
}

/* Without this, GCC folds the load of an x vector into each of the COLS FMAs that use it: with the widened weights'
 * loads, 20 loads a step for 16 FMAs, where Zen 4 issues one 64-byte load and one 16-lane FMA a cycle, so loads
 * bound the loop. Held in a register, a step is 8 loads (4 of x, 4 of codes) for 16 FMAs: at 32 rows on one thread,
 * 66 against 61 GFLOP/s (bench.quantization.kernel_timing). */
#if defined(__AVX512F__)
#define KEEP_IN_REGISTER(value) __asm__("" : "+v"(value))
#else
/* a 16-lane vector is two AVX2 registers (or more without AVX2): no one register can hold it, and GCC refuses the
 * constraint ("impossible constraint in asm") */
#define KEEP_IN_REGISTER(value) ((void)0)
#endif

/* ROWS rows of x against COLS weight rows: ROWS x COLS sums, each a vector of lanes summed at the end, so that every
 * widened weight vector feeds ROWS FMAs and every loaded x vector COLS. */
#define TILE(ROWS, COLS)                                                                                            \
    static void tile_##ROWS##_##COLS(const float *restrict x, const int8_t *restrict q, const float *restrict scale, \
                                     const float *restrict bias, float *restrict out, int64_t k_size,              \
                                     int64_t n_size) {                                                           \
        float_vector sums[ROWS][COLS];                                                                           \
        memset(sums, 0, sizeof sums);                                                                            \
        int64_t k = 0;                                                                                           \
        for (; k + LANES <= k_size; k += LANES) {                                                                \
            float_vector weights[COLS];                                                                          \
            for (int c = 0; c < COLS; c++) weights[c] = widen(q + c * k_size + k);                               \
            for (int r = 0; r < ROWS; r++) {                                                                     \
                float_vector inputs = load_floats(x + r * k_size + k);                                           \
                KEEP_IN_REGISTER(inputs);                                                                        \
                for (int c = 0; c < COLS; c++) sums[r][c] += inputs * weights[c];                                \
            }                                                                                                    \
        }                                                                                                        \
        for (int r = 0; r < ROWS; r++) {                                                                         \
            for (int c = 0; c < COLS; c++) {                                                                     \
                float sum = lane_sum(sums[r][c]);                                                                \
                for (int64_t t = k; t < k_size; t++) sum += x[r * k_size + t] * (float)q[c * k_size + t];        \
                sum *= scale[c];                                                                                 \
                out[r * n_size + c] = bias ? sum + bias[c] : sum;                                                \
            }                                                                                                    \
        }                                                                                                        \
    }

TILE(4, 4)
TILE(1, 4)
TILE(4, 1)
TILE(1, 1)

#define COLS_PER_TILE 4
#define ROWS_PER_TILE 4

/* x [M][K], q [N][K], scale [N], bias [N] or NULL, out [M][N]; all contiguous. */
void int8_weight_matmul(const float *x, const int8_t *q, const float *scale, const float *bias, float *out,
                        int64_t m_size, int64_t k_size, int64_t n_size, int64_t num_threads) {
    const int64_t num_col_tiles = (n_size + COLS_PER_TILE - 1) / COLS_PER_TILE;
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int64_t tile = 0; tile < num_col_tiles; tile++) {
        const int64_t n = tile * COLS_PER_TILE;
        const int8_t *q_tile = q + n * k_size;
        const float *b = bias ? bias + n : 0;
        const int full = n + COLS_PER_TILE <= n_size;
        int64_t m = 0;
        for (; m + ROWS_PER_TILE <= m_size; m += ROWS_PER_TILE) {
            if (full) {
                tile_4_4(x + m * k_size, q_tile, scale + n, b, out + m * n_size + n, k_size, n_size);
            } else {
                for (int64_t c = n; c < n_size; c++)
                    tile_4_1(x + m * k_size, q + c * k_size, scale + c, bias ? bias + c : 0, out + m * n_size + c,
                             k_size, n_size);
            }
        }
        for (; m < m_size; m++) {
            if (full) {
                tile_1_4(x + m * k_size, q_tile, scale + n, b, out + m * n_size + n, k_size, n_size);
            } else {
                for (int64_t c = n; c < n_size; c++)
                    tile_1_1(x + m * k_size, q + c * k_size, scale + c, bias ? bias + c : 0, out + m * n_size + c,
                             k_size, n_size);
            }
        }
    }
}
