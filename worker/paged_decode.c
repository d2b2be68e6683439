/* Paged decode attention on CPU: one query token per row against its context, read from the KV pool's blocks in
 * place (heads-major layout [Hkv, num_blocks, block_size, D], float32). Per row and KV head: the scores of the
 * group's query heads (GQA: each K/V token is read once for all of them), their softmax, and the weighted sum of
 * values. Built and loaded by worker/cpu_decode_kernel.py. */
#include <math.h>
#include <stdint.h>
#include <string.h>

/* exp for x <= 0 as Cephes' expf does it (range reduction by ln 2, a degree-6 polynomial; within 2 ulp of the
 * exact value), written without calls or branches so that the compiler vectorizes the loop around it. */
static inline float exp_nonpositive(float x) {
    x = x < -87.0f ? -87.0f : x;
    const float n = floorf(1.44269504088896341f * x + 0.5f);
    float r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
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
                const float *block = k_head + table[start / block_size] * block_size * head_dim;
                const int64_t n = len - start < block_size ? len - start : block_size;
                for (int64_t i = 0; i < n; i++) {
                    const float *key = block + i * head_dim;
                    for (int64_t g = 0; g < group; g++) {
                        const float *query = queries + g * head_dim;
                        float dot = 0.0f;
                        for (int64_t d = 0; d < head_dim; d++) dot += query[d] * key[d];
                        scratch[g * max_len + start + i] = dot * scale;
                    }
                }
            }
            for (int64_t g = 0; g < group; g++) {
                float *scores = scratch + g * max_len;
                float top = scores[0];
                for (int64_t t = 1; t < len; t++) top = scores[t] > top ? scores[t] : top;
                float total = 0.0f;
                for (int64_t t = 0; t < len; t++) {
                    scores[t] = exp_nonpositive(scores[t] - top);
                    total += scores[t];
                }
                const float inverse = 1.0f / total;
                for (int64_t t = 0; t < len; t++) scores[t] *= inverse;
            }
            for (int64_t x = 0; x < group * head_dim; x++) attended[x] = 0.0f;
            for (int64_t start = 0; start < len; start += block_size) {
                const float *block = v_head + table[start / block_size] * block_size * head_dim;
                const int64_t n = len - start < block_size ? len - start : block_size;
                for (int64_t g = 0; g < group; g++) {
                    const float *weights = scratch + g * max_len + start;
                    float *head_out = attended + g * head_dim;
                    for (int64_t i = 0; i < n; i++) {
                        const float *value = block + i * head_dim;
                        const float weight = weights[i];
                        for (int64_t d = 0; d < head_dim; d++) head_out[d] += weight * value[d];
                    }
                }
            }
        }
    }
}
