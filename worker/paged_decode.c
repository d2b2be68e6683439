/* Paged decode attention on CPU: one query token per row against its context, read from the KV pool's blocks in
 * place (float32, heads-major: keys [Hkv, num_blocks, D, block_size], transposed within each block, values
 * [Hkv, num_blocks, block_size, D]). Per row and KV head: the scores of the group's query heads, their softmax,
 * and the weighted sum of values. With keys transposed, a block's scores are block_size-wide vector FMAs over the
 * head dimension, with no sum across lanes. Built and loaded by worker/cpu_decode_kernel.py. */
#include <math.h>
#include <stdint.h>
#include <string.h>

/* exp for x <= 0 as Cephes' expf does it (range reduction by ln 2, a degree-6 polynomial; within 2 ulp of the
 * exact value), written without calls or branches so that the compiler vectorizes the loop around it. */
static inline float exp_nonpositive(float x) {
    x = x < -87.0f ? -87.0f : x;
    const float n = floorf(1.44269504088896341f * x + 0.5f);
    /* fmaf keeps the two-step reduction by ln 2 exact; written as x - n * c, -fassociative-math would merge the
     * steps and cost up to 62 ulp */
    float r = fmaf(-n, 0.693359375f, x);
    r = fmaf(n, 2.12194440e-4f, r);
    const float r2 = r * r;
    float y = 1.9875691500e-4f;
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * r2 + r + 1.0f;
    const int32_t bits = ((int32_t)n + 127) << 23; /* 2^n: n is in [-126, 0] after the clamp */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return y * scale;
}

#define FIXED_BLOCK 16 /* the SDPA path's default block size: a block's scores are one 16-float vector */
typedef float block_vector __attribute__((vector_size(FIXED_BLOCK * sizeof(float))));

/* scores[i] = scale * query . key i of a block stored [D][block_size], for its first n tokens */
static inline void block_scores(const float *restrict query, const float *restrict block, float *restrict scores,
                                int64_t head_dim, int64_t block_size, int64_t n, float scale) {
    if (block_size == FIXED_BLOCK) { /* spelled as a vector: left to itself, gcc vectorizes over d instead */
        block_vector acc = {0.0f};
        for (int64_t d = 0; d < head_dim; d++) {
            block_vector keys_d;
            memcpy(&keys_d, block + d * FIXED_BLOCK, sizeof keys_d);
            acc += query[d] * keys_d;
        }
        float sums[FIXED_BLOCK];
        memcpy(sums, &acc, sizeof sums);
        for (int64_t i = 0; i < n; i++) scores[i] = sums[i] * scale;
        return;
    }
    for (int64_t i = 0; i < n; i++) scores[i] = 0.0f;
    for (int64_t d = 0; d < head_dim; d++)
        for (int64_t i = 0; i < n; i++) scores[i] += query[d] * block[d * block_size + i];
    for (int64_t i = 0; i < n; i++) scores[i] *= scale;
}

/* out = inverse * sum over t < len of weights[t] * V[t], V read from the row's blocks [block_size][D]. Head
 * dimensions of 32, 64 and 128 keep the sum in registers; others accumulate in `out`. */
#define WEIGHTED_VALUES_FIXED(DIM)                                                                                 \
    static void weighted_values_##DIM(const float *restrict weights, const float *restrict v_head,               \
                                      const int64_t *restrict table, int64_t len, int64_t block_size,             \
                                      float *restrict out, float inverse) {                                       \
        block_vector acc[DIM / FIXED_BLOCK] = {{0.0f}};                                                           \
        for (int64_t start = 0; start < len; start += block_size) {                                              \
            const float *block = v_head + table[start / block_size] * block_size * DIM;                         \
            const int64_t n = len - start < block_size ? len - start : block_size;                              \
            for (int64_t i = 0; i < n; i++) {                                                                   \
                const float weight = weights[start + i];                                                        \
                for (int64_t k = 0; k < DIM / FIXED_BLOCK; k++) {                                               \
                    block_vector value;                                                                          \
                    memcpy(&value, block + i * DIM + k * FIXED_BLOCK, sizeof value);                            \
                    acc[k] += weight * value;                                                                    \
                }                                                                                                \
            }                                                                                                    \
        }                                                                                                        \
        for (int64_t k = 0; k < DIM / FIXED_BLOCK; k++) {                                                       \
            acc[k] *= inverse;                                                                                   \
            memcpy(out + k * FIXED_BLOCK, &acc[k], sizeof acc[k]);                                              \
        }                                                                                                        \
    }
WEIGHTED_VALUES_FIXED(32)
WEIGHTED_VALUES_FIXED(64)
WEIGHTED_VALUES_FIXED(128)

static void weighted_values(const float *restrict weights, const float *restrict v_head, const int64_t *restrict table,
                            int64_t len, int64_t head_dim, int64_t block_size, float *restrict out, float inverse) {
    switch (head_dim) {
    case 32: weighted_values_32(weights, v_head, table, len, block_size, out, inverse); return;
    case 64: weighted_values_64(weights, v_head, table, len, block_size, out, inverse); return;
    case 128: weighted_values_128(weights, v_head, table, len, block_size, out, inverse); return;
    }
    for (int64_t d = 0; d < head_dim; d++) out[d] = 0.0f;
    for (int64_t start = 0; start < len; start += block_size) {
        const float *block = v_head + table[start / block_size] * block_size * head_dim;
        const int64_t n = len - start < block_size ? len - start : block_size;
        for (int64_t i = 0; i < n; i++)
            for (int64_t d = 0; d < head_dim; d++) out[d] += weights[start + i] * block[i * head_dim + d];
    }
    for (int64_t d = 0; d < head_dim; d++) out[d] *= inverse;
}

/* out[b, h] = softmax_t(scale * q[b, h] . K[b, t]) . V[b, t] over t < context_lens[b];
 * scratch holds num_heads / num_kv_heads * max_len floats. */
void paged_decode_attention(const float *q, const float *k_cache, const float *v_cache, const int64_t *block_tables,
                            const int64_t *context_lens, float *out, float *scratch, int64_t batch,
                            int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t num_blocks,
                            int64_t block_size, int64_t table_width, int64_t max_len, float scale) {
    const int64_t group = num_heads / num_kv_heads;
    const int64_t head_stride = num_blocks * block_size * head_dim;
    for (int64_t b = 0; b < batch; b++) {
        const int64_t len = context_lens[b];
        const int64_t *table = block_tables + b * table_width;
        for (int64_t kvh = 0; kvh < num_kv_heads; kvh++) {
            const float *k_head = k_cache + kvh * head_stride;
            const float *v_head = v_cache + kvh * head_stride;
            const float *queries = q + (b * num_heads + kvh * group) * head_dim; /* the group's heads, adjacent */
            float *attended = out + (b * num_heads + kvh * group) * head_dim;
            for (int64_t start = 0; start < len; start += block_size) {
                const float *block = k_head + table[start / block_size] * head_dim * block_size; /* [D][bs] */
                const int64_t n = len - start < block_size ? len - start : block_size;
                for (int64_t g = 0; g < group; g++)
                    block_scores(queries + g * head_dim, block, scratch + g * max_len + start, head_dim, block_size, n,
                                 scale);
            }
            for (int64_t g = 0; g < group; g++) {
                float *weights = scratch + g * max_len;
                float top = weights[0];
                for (int64_t t = 1; t < len; t++) top = weights[t] > top ? weights[t] : top;
                float total = 0.0f;
                for (int64_t t = 0; t < len; t++) {
                    weights[t] = exp_nonpositive(weights[t] - top);
                    total += weights[t];
                }
                weighted_values(weights, v_head, table, len, head_dim, block_size, attended + g * head_dim,
                                1.0f / total);
            }
        }
    }
}

/* Stores the step's new keys ([Hkv, N, D]) at their pool slots, transposed within blocks as the scores read them. */
void paged_write_keys(float *k_cache, const int64_t *slots, const float *keys, int64_t num_kv_heads, int64_t num_tokens,
                      int64_t head_dim, int64_t num_blocks, int64_t block_size) {
    for (int64_t h = 0; h < num_kv_heads; h++) {
        float *k_head = k_cache + h * num_blocks * head_dim * block_size;
        for (int64_t t = 0; t < num_tokens; t++) {
            const int64_t slot = slots[t];
            float *first = k_head + (slot / block_size) * head_dim * block_size + slot % block_size;
            const float *key = keys + (h * num_tokens + t) * head_dim;
            for (int64_t d = 0; d < head_dim; d++) first[d * block_size] = key[d];
        }
    }
}
