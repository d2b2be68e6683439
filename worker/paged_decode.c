/* Paged decode attention on CPU: one query token per row against its context, read from the KV pool's blocks in
 * place (heads-major layout [Hkv, num_blocks, block_size, D], float32). Two passes around a softmax that torch does:
 * scores, then the probability-weighted sum of values. Each K/V token is read once for all the query heads of its
 * group (GQA). Built and loaded by worker/cpu_decode_kernel.py. */
#include <math.h>
#include <stdint.h>

/* scores[b, h, t] = scale * q[b, h] . K[b, t] for t < context_lens[b]; -inf for the rest of max_len */
void paged_decode_scores(const float *q, const float *k_cache, const int64_t *block_tables,
                         const int64_t *context_lens, float *scores, int64_t batch, int64_t num_heads,
                         int64_t num_kv_heads, int64_t head_dim, int64_t num_blocks, int64_t block_size,
                         int64_t table_width, int64_t max_len, float scale) {
    const int64_t group = num_heads / num_kv_heads;
    for (int64_t b = 0; b < batch; b++) {
        const int64_t len = context_lens[b];
        const int64_t *table = block_tables + b * table_width;
        for (int64_t kvh = 0; kvh < num_kv_heads; kvh++) {
            const float *k_head = k_cache + kvh * num_blocks * block_size * head_dim;
            const float *queries = q + (b * num_heads + kvh * group) * head_dim; /* the group's heads, adjacent */
            float *out = scores + (b * num_heads + kvh * group) * max_len;
            for (int64_t start = 0; start < len; start += block_size) {
                const float *block = k_head + table[start / block_size] * block_size * head_dim;
                const int64_t n = len - start < block_size ? len - start : block_size;
                for (int64_t i = 0; i < n; i++) {
                    const float *key = block + i * head_dim;
                    for (int64_t g = 0; g < group; g++) {
                        const float *query = queries + g * head_dim;
                        float dot = 0.0f;
                        for (int64_t d = 0; d < head_dim; d++) dot += query[d] * key[d];
                        out[g * max_len + start + i] = dot * scale;
                    }
                }
            }
            for (int64_t g = 0; g < group; g++)
                for (int64_t t = len; t < max_len; t++) out[g * max_len + t] = -INFINITY;
        }
    }
}

/* out[b, h] = sum over t < context_lens[b] of probs[b, h, t] * V[b, t] */
void paged_decode_values(const float *probs, const float *v_cache, const int64_t *block_tables,
                         const int64_t *context_lens, float *out, int64_t batch, int64_t num_heads,
                         int64_t num_kv_heads, int64_t head_dim, int64_t num_blocks, int64_t block_size,
                         int64_t table_width, int64_t max_len) {
    const int64_t group = num_heads / num_kv_heads;
    for (int64_t b = 0; b < batch; b++) {
        const int64_t len = context_lens[b];
        const int64_t *table = block_tables + b * table_width;
        for (int64_t kvh = 0; kvh < num_kv_heads; kvh++) {
            const float *v_head = v_cache + kvh * num_blocks * block_size * head_dim;
            const float *weights = probs + (b * num_heads + kvh * group) * max_len;
            float *attended = out + (b * num_heads + kvh * group) * head_dim;
            for (int64_t x = 0; x < group * head_dim; x++) attended[x] = 0.0f;
            for (int64_t start = 0; start < len; start += block_size) {
                const float *block = v_head + table[start / block_size] * block_size * head_dim;
                const int64_t n = len - start < block_size ? len - start : block_size;
                for (int64_t i = 0; i < n; i++) {
                    const float *value = block + i * head_dim;
                    for (int64_t g = 0; g < group; g++) {
                        const float weight = weights[g * max_len + start + i];
                        float *head_out = attended + g * head_dim;
                        for (int64_t d = 0; d < head_dim; d++) head_out[d] += weight * value[d];
                    }
                }
            }
        }
    }
}
