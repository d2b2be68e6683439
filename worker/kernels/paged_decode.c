/* Paged decode attention on CPU: one query token per row against its context, read from the KV pool's blocks in
 * place (float32, heads-major: keys [Hkv, num_blocks, D, block_size], transposed within each block, values
 * [Hkv, num_blocks, block_size, D]). Per row and KV head: the scores of the group's query heads, their softmax,
 * and the weighted sum of values. With keys transposed, a block's scores are block_size-wide vector FMAs over the
 * head dimension, with no sum across lanes. A quantized pool (KV_CACHE_DTYPE int8 or fp8_e4m3) holds one-byte codes
 * in the same layouts: a row's blocks are turned back into floats as it attends, and its new K/V quantized as they
 * are stored. Built and loaded by worker/kernels/cpu_decode_kernel.py. */
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

/* In the engine a layer's K/V (megabytes) come from memory, and a sum kept in one vector waits for its previous FMA.
 * So the query heads of a group, which share their KV head, go through each key and value load together, HEADS at
 * a time, and every loop below keeps several independent sums. */

/* scores[h][i] = scale * queries[h] . key i of a block stored [D][16], for HEADS heads of a group (queries
 * head_dim apart, scores max_len apart) and the block's first n tokens. */
#define BLOCK_SCORES_FIXED(HEADS)                                                                                  \
    static void block_scores_##HEADS(const float *restrict queries, const float *restrict block,                 \
                                     float *restrict scores, int64_t head_dim, int64_t max_len, int64_t n,        \
                                     float scale) {                                                               \
        block_vector even[HEADS] = {{0.0f}}, odd[HEADS] = {{0.0f}};                                              \
        int64_t d = 0;                                                                                           \
        for (; d + 1 < head_dim; d += 2) {                                                                      \
            block_vector keys_even, keys_odd;                                                                    \
            memcpy(&keys_even, block + d * FIXED_BLOCK, sizeof keys_even);                                      \
            memcpy(&keys_odd, block + (d + 1) * FIXED_BLOCK, sizeof keys_odd);                                  \
            for (int h = 0; h < HEADS; h++) {                                                                   \
                even[h] += queries[h * head_dim + d] * keys_even;                                               \
                odd[h] += queries[h * head_dim + d + 1] * keys_odd;                                             \
            }                                                                                                    \
        }                                                                                                        \
        if (d < head_dim) {                                                                                      \
            block_vector keys_last;                                                                              \
            memcpy(&keys_last, block + d * FIXED_BLOCK, sizeof keys_last);                                      \
            for (int h = 0; h < HEADS; h++) even[h] += queries[h * head_dim + d] * keys_last;                   \
        }                                                                                                        \
        for (int h = 0; h < HEADS; h++) {                                                                       \
            float sums[FIXED_BLOCK];                                                                             \
            const block_vector total = (even[h] + odd[h]) * scale;                                              \
            memcpy(sums, &total, sizeof sums);                                                                   \
            memcpy(scores + h * max_len, sums, n * sizeof(float));                                              \
        }                                                                                                        \
    }
BLOCK_SCORES_FIXED(1)
BLOCK_SCORES_FIXED(2)
BLOCK_SCORES_FIXED(4)

/* scores[i] = scale * query . key i of a block stored [D][block_size], for its first n tokens: any block size */
static void block_scores(const float *restrict query, const float *restrict block, float *restrict scores,
                         int64_t head_dim, int64_t block_size, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) scores[i] = 0.0f;
    for (int64_t d = 0; d < head_dim; d++)
        for (int64_t i = 0; i < n; i++) scores[i] += query[d] * block[d * block_size + i];
    for (int64_t i = 0; i < n; i++) scores[i] *= scale;
}

/* Scores of a group's heads (queries head_dim apart, scores max_len apart) over one block of keys. */
static void group_block_scores(const float *queries, const float *block, float *scores, int64_t group,
                               int64_t head_dim, int64_t block_size, int64_t max_len, int64_t n, float scale) {
    int64_t g = 0;
    if (block_size == FIXED_BLOCK) { /* spelled as vectors: left to itself, gcc vectorizes over d instead */
        for (; g + 4 <= group; g += 4)
            block_scores_4(queries + g * head_dim, block, scores + g * max_len, head_dim, max_len, n, scale);
        for (; g + 2 <= group; g += 2)
            block_scores_2(queries + g * head_dim, block, scores + g * max_len, head_dim, max_len, n, scale);
        for (; g < group; g++)
            block_scores_1(queries + g * head_dim, block, scores + g * max_len, head_dim, max_len, n, scale);
        return;
    }
    for (; g < group; g++)
        block_scores(queries + g * head_dim, block, scores + g * max_len, head_dim, block_size, n, scale);
}

/* out[h] = inverse[h] * sum over t < len of weights[h][t] * V[t] for HEADS heads (weights max_len apart, out DIM
 * apart), V read from the row's blocks [block_size][DIM] once for all of them; even and odd tokens sum apart.
 * HEADS x 2 x DIM / 16 accumulators stay in registers. */
#define WEIGHTED_VALUES_FIXED(DIM, HEADS)                                                                          \
    static void weighted_values_##DIM##_##HEADS(const float *restrict weights, int64_t max_len,                  \
                                                const float *restrict v_head, const int64_t *restrict table,      \
                                                int64_t len, int64_t block_size, float *restrict out,             \
                                                const float *restrict inverse) {                                  \
        block_vector even[HEADS][DIM / FIXED_BLOCK] = {{{0.0f}}}, odd[HEADS][DIM / FIXED_BLOCK] = {{{0.0f}}};     \
        for (int64_t start = 0; start < len; start += block_size) {                                              \
            const float *block = v_head + table[start / block_size] * block_size * DIM;                         \
            const float *w = weights + start;                                                                    \
            const int64_t n = len - start < block_size ? len - start : block_size;                              \
            int64_t i = 0;                                                                                       \
            for (; i + 1 < n; i += 2) {                                                                         \
                for (int64_t k = 0; k < DIM / FIXED_BLOCK; k++) {                                               \
                    block_vector value_even, value_odd;                                                          \
                    memcpy(&value_even, block + i * DIM + k * FIXED_BLOCK, sizeof value_even);                  \
                    memcpy(&value_odd, block + (i + 1) * DIM + k * FIXED_BLOCK, sizeof value_odd);              \
                    for (int h = 0; h < HEADS; h++) {                                                           \
                        even[h][k] += w[h * max_len + i] * value_even;                                          \
                        odd[h][k] += w[h * max_len + i + 1] * value_odd;                                        \
                    }                                                                                            \
                }                                                                                                \
            }                                                                                                    \
            if (i < n) {                                                                                         \
                for (int64_t k = 0; k < DIM / FIXED_BLOCK; k++) {                                               \
                    block_vector value;                                                                          \
                    memcpy(&value, block + i * DIM + k * FIXED_BLOCK, sizeof value);                            \
                    for (int h = 0; h < HEADS; h++) even[h][k] += w[h * max_len + i] * value;                   \
                }                                                                                                \
            }                                                                                                    \
        }                                                                                                        \
        for (int h = 0; h < HEADS; h++)                                                                         \
            for (int64_t k = 0; k < DIM / FIXED_BLOCK; k++) {                                                   \
                const block_vector total = (even[h][k] + odd[h][k]) * inverse[h];                               \
                memcpy(out + h * DIM + k * FIXED_BLOCK, &total, sizeof total);                                  \
            }                                                                                                    \
    }
WEIGHTED_VALUES_FIXED(32, 1)
WEIGHTED_VALUES_FIXED(32, 2)
WEIGHTED_VALUES_FIXED(64, 1)
WEIGHTED_VALUES_FIXED(64, 2)
WEIGHTED_VALUES_FIXED(128, 1)

/* out = inverse * sum over t < len of weights[t] * V[t] for one head: any head dimension */
static void weighted_values(const float *restrict weights, const float *restrict v_head, const int64_t *restrict table,
                            int64_t len, int64_t head_dim, int64_t block_size, float *restrict out, float inverse) {
    for (int64_t d = 0; d < head_dim; d++) out[d] = 0.0f;
    for (int64_t start = 0; start < len; start += block_size) {
        const float *block = v_head + table[start / block_size] * block_size * head_dim;
        const int64_t n = len - start < block_size ? len - start : block_size;
        for (int64_t i = 0; i < n; i++)
            for (int64_t d = 0; d < head_dim; d++) out[d] += weights[start + i] * block[i * head_dim + d];
    }
    for (int64_t d = 0; d < head_dim; d++) out[d] *= inverse;
}

/* The attended values of a group's heads: two at a time where the head dimension allows, else one. */
static void group_weighted_values(const float *weights, const float *v_head, const int64_t *table, int64_t len,
                                  int64_t group, int64_t head_dim, int64_t block_size, int64_t max_len, float *out,
                                  const float *inverse) {
    int64_t g = 0;
#define PAIRS_THEN_ONES(DIM)                                                                                       \
    for (; g + 2 <= group; g += 2)                                                                              \
        weighted_values_##DIM##_2(weights + g * max_len, max_len, v_head, table, len, block_size, out + g * DIM, \
                                  inverse + g);                                                                  \
    for (; g < group; g++)                                                                                      \
        weighted_values_##DIM##_1(weights + g * max_len, max_len, v_head, table, len, block_size, out + g * DIM, \
                                  inverse + g);
    switch (head_dim) {
    case 32: PAIRS_THEN_ONES(32) return;
    case 64: PAIRS_THEN_ONES(64) return;
    case 128:
        for (; g < group; g++)
            weighted_values_128_1(weights + g * max_len, max_len, v_head, table, len, block_size, out + g * 128,
                                  inverse + g);
        return;
    }
#undef PAIRS_THEN_ONES
    for (; g < group; g++)
        weighted_values(weights + g * max_len, v_head, table, len, head_dim, block_size, out + g * head_dim,
                        inverse[g]);
}

/* How a layer attends beyond plain causal attention (LayerVariant in worker/engine/attention/layer_attention.py);
 * its sinks, [H] logits that join each head's softmax as a key with no value, come apart, per KV head's group. */
struct variant {
    int64_t window; /* a row sees its `window` latest tokens; 0: all of them */
    float softcap;  /* scores become softcap * tanh(score / softcap); 0: none */
};

/* Turns len scores into unnormalized softmax weights in place, after the soft-cap; returns 1 / their sum, to which
 * the head's sink (when `has_sink`) adds its own weight. */
static float exponentiate(float *weights, int64_t len, float softcap, int has_sink, float sink) {
    if (softcap > 0.0f)
        for (int64_t t = 0; t < len; t++) weights[t] = softcap * tanhf(weights[t] / softcap);
    float tops[4] = {weights[0], weights[0], weights[0], weights[0]};
    for (int64_t t = 0; t < len; t++) tops[t % 4] = weights[t] > tops[t % 4] ? weights[t] : tops[t % 4];
    float top = tops[0];
    for (int i = 1; i < 4; i++) top = tops[i] > top ? tops[i] : top;
    top = has_sink && sink > top ? sink : top;
    float total = has_sink ? exp_nonpositive(sink - top) : 0.0f;
    for (int64_t t = 0; t < len; t++) {
        weights[t] = exp_nonpositive(weights[t] - top);
        total += weights[t];
    }
    return 1.0f / total;
}

#define MAX_GROUP 64 /* query heads per KV head; the wrapper refuses more */

/* Stores one key at its slot of a KV head's keys, transposed within the slot's block ([D][block_size]). */
static void store_key(float *k_head, int64_t slot, const float *key, int64_t head_dim, int64_t block_size) {
    float *column = k_head + (slot / block_size) * head_dim * block_size + slot % block_size;
    for (int64_t d = 0; d < head_dim; d++) column[d * block_size] = key[d];
}

/* One row's KV head over `span` tokens from the start of the blocks `blocks` lists (the window's first block read
 * whole, its first `skipped` tokens weighted 0): the scores of its group's query heads (`queries`, head_dim apart;
 * `sinks` theirs), their softmax, and the weighted values into `out` (head_dim apart); scratch holds group * max_len
 * floats. */
static void attend_blocks(const float *queries, const float *k_head, const float *v_head, const int64_t *blocks,
                          int64_t span, int64_t skipped, float *out, float *scratch, int64_t group, int64_t head_dim,
                          int64_t block_size, int64_t max_len, float scale, float softcap, const float *sinks) {
    float inverse[MAX_GROUP];
    for (int64_t start = 0; start < span; start += block_size) {
        const float *block = k_head + blocks[start / block_size] * head_dim * block_size; /* [D][bs] */
        const int64_t n = span - start < block_size ? span - start : block_size;
        group_block_scores(queries, block, scratch + start, group, head_dim, block_size, max_len, n, scale);
    }
    for (int64_t g = 0; g < group; g++) {
        float *weights = scratch + g * max_len;
        const float sink = sinks != NULL ? sinks[g] : 0.0f;
        inverse[g] = exponentiate(weights + skipped, span - skipped, softcap, sinks != NULL, sink);
        for (int64_t t = 0; t < skipped; t++) weights[t] = 0.0f;
    }
    group_weighted_values(scratch, v_head, blocks, span, group, head_dim, block_size, max_len, out, inverse);
}

/* The tokens of a row of len tokens that the variant's window reaches, as whole blocks: the window's first block in
 * the row's table, the tokens from its start, and those of them before the window. */
struct row_span {
    int64_t first_block, span, skipped;
};

static struct row_span row_span(int64_t len, int64_t window, int64_t block_size) {
    const int64_t first = window > 0 && len > window ? len - window : 0;
    const int64_t skipped = first % block_size;
    return (struct row_span){first / block_size, len - (first - skipped), skipped};
}

/* One row's KV head in a float pool: its window's blocks attended in place (attend_blocks). */
static void attend(const float *queries, const float *k_head, const float *v_head, const int64_t *table, int64_t len,
                   float *out, float *scratch, int64_t group, int64_t head_dim, int64_t block_size, int64_t max_len,
                   float scale, const struct variant *variant, const float *sinks) {
    const struct row_span rows = row_span(len, variant->window, block_size);
    attend_blocks(queries, k_head, v_head, table + rows.first_block, rows.span, rows.skipped, out, scratch, group,
                  head_dim, block_size, max_len, scale, variant->softcap, sinks);
}

/* A quantized pool (KV_CACHE_DTYPE, worker/kernels/kv_quant.py): one-byte codes in the float pool's layouts, and a
 * layer's scales for K and V at [kv head * head_stride + slot * token_stride] (strides 0: fp8's one scale per layer). */
struct kv_codes {
    int64_t kind;        /* 1: int8 codes; 2: float8 e4m3fn bytes, valued through `table` */
    const float *table;  /* [256]: each e4m3fn byte's value */
    float *k_scales, *v_scales;
    int64_t scale_head_stride, scale_token_stride;
};

static inline float code_value(const struct kv_codes *codes, uint8_t code) {
    return codes->kind == 1 ? (float)(int8_t)code : codes->table[code];
}

/* One row's KV head in a quantized pool: the blocks its window reaches are turned into float keys ([D][bs] per
 * block) and values ([bs][D]), each token times its scale, in `buffers`; the float attention then reads them there. */
static void attend_codes(const float *queries, const uint8_t *k_head, const uint8_t *v_head, const int64_t *table,
                         int64_t len, float *out, float *scratch, float *buffers, int64_t group, int64_t head_dim,
                         int64_t block_size, int64_t max_len, float scale, const struct variant *variant,
                         const float *sinks, const struct kv_codes *codes, int64_t kvh) {
    const struct row_span rows = row_span(len, variant->window, block_size);
    const int64_t num_blocks = (rows.span + block_size - 1) / block_size, block_floats = block_size * head_dim;
    int64_t *local = (int64_t *)(((uintptr_t)buffers + 7) & ~(uintptr_t)7);
    float *keys = (float *)(local + num_blocks), *values = keys + num_blocks * block_floats;
    const float *k_scales = codes->k_scales + kvh * codes->scale_head_stride;
    const float *v_scales = codes->v_scales + kvh * codes->scale_head_stride;
    for (int64_t j = 0; j < num_blocks; j++) {
        const int64_t block = table[rows.first_block + j];
        const int64_t n = rows.span - j * block_size < block_size ? rows.span - j * block_size : block_size;
        const uint8_t *k_block = k_head + block * block_floats, *v_block = v_head + block * block_floats;
        float *k_out = keys + j * block_floats, *v_out = values + j * block_floats;
        local[j] = j;
        for (int64_t i = 0; i < n; i++) {
            const int64_t slot = block * block_size + i;
            const float k_scale = k_scales[slot * codes->scale_token_stride];
            const float v_scale = v_scales[slot * codes->scale_token_stride];
            for (int64_t d = 0; d < head_dim; d++) {
                k_out[d * block_size + i] = code_value(codes, k_block[d * block_size + i]) * k_scale;
                v_out[i * head_dim + d] = code_value(codes, v_block[i * head_dim + d]) * v_scale;
            }
        }
    }
    attend_blocks(queries, keys, values, local, rows.span, rows.skipped, out, scratch, group, head_dim, block_size,
                  max_len, scale, variant->softcap, sinks);
}

/* The e4m3fn byte nearest x (ties to the even byte, saturating at +-448), as torch converts: a binary search of the
 * table's non-negative values, which grow with their bytes 0..126. */
static uint8_t e4m3_code(float x, const float *table) {
    const uint8_t sign = signbit(x) ? 0x80 : 0;
    const float magnitude = fabsf(x);
    if (magnitude >= table[126]) return sign | 126;
    int lo = 0, hi = 126; /* table[lo] <= magnitude < table[hi] */
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (table[mid] <= magnitude) lo = mid;
        else hi = mid;
    }
    const float below = magnitude - table[lo], above = table[hi] - magnitude;
    return sign | (uint8_t)(below < above ? lo : above < below ? hi : (lo & 1 ? hi : lo));
}

/* Stores one KV head's new key (transposed within its block) and value as codes at `slot`: int8 with the token's own
 * scales (amax / 127, written beside), fp8 divided by the layer's. As kv_quant.py quantizes, to the bit. */
static void store_codes(uint8_t *k_head, uint8_t *v_head, int64_t slot, const float *key, const float *value,
                        int64_t head_dim, int64_t block_size, const struct kv_codes *codes, int64_t kvh) {
    float *scale_of[2] = {codes->k_scales + kvh * codes->scale_head_stride + slot * codes->scale_token_stride,
                          codes->v_scales + kvh * codes->scale_head_stride + slot * codes->scale_token_stride};
    const float *sources[2] = {key, value};
    uint8_t *k_column = k_head + (slot / block_size) * head_dim * block_size + slot % block_size;
    uint8_t *targets[2] = {k_column, v_head + slot * head_dim};
    const int64_t steps[2] = {block_size, 1};
    for (int kv = 0; kv < 2; kv++) {
        const float *x = sources[kv];
        float scale = *scale_of[kv];
        if (codes->kind == 1) {
            float amax = 0.0f;
            for (int64_t d = 0; d < head_dim; d++) amax = fabsf(x[d]) > amax ? fabsf(x[d]) : amax;
            scale = (amax < 1.27e-6f ? 1.27e-6f : amax) / 127.0f;
            *scale_of[kv] = scale;
        }
        for (int64_t d = 0; d < head_dim; d++) {
            const float scaled = x[d] / scale;
            uint8_t code;
            if (codes->kind == 1) {
                const float rounded = nearbyintf(scaled);
                code = (uint8_t)(int8_t)(rounded > 127.0f ? 127.0f : rounded < -127.0f ? -127.0f : rounded);
            } else {
                code = e4m3_code(scaled, codes->table);
            }
            targets[kv][d * steps[kv]] = code;
        }
    }
}

/* One row's KV head in either pool: float (codes NULL) or quantized; `buffers` is attend_codes' scratch. */
static void attend_any(const float *queries, const void *k_head, const void *v_head, const int64_t *table,
                       int64_t len, float *out, float *scratch, float *buffers, int64_t group, int64_t head_dim,
                       int64_t block_size, int64_t max_len, float scale, const struct variant *variant,
                       const float *sinks, const struct kv_codes *codes, int64_t kvh) {
    if (codes == NULL)
        attend(queries, k_head, v_head, table, len, out, scratch, group, head_dim, block_size, max_len, scale, variant,
               sinks);
    else
        attend_codes(queries, k_head, v_head, table, len, out, scratch, buffers, group, head_dim, block_size, max_len,
                     scale, variant, sinks, codes, kvh);
}

/* out[b, h] = softmax_t(scale * q[b, h] . K[b, t]) . V[b, t] over t < context_lens[b] (the latest `window` of
 * them when window > 0), soft-capped when softcap > 0, with sinks [H] unless NULL; the pool holds float32, or codes
 * when `codes` is not NULL. scratch holds num_heads / num_kv_heads * max_len floats, and the codes' buffers more
 * (cpu_decode_kernel.py's codes_scratch_floats). */
void paged_decode_attention(const float *q, const void *k_cache, const void *v_cache, const int64_t *block_tables,
                            const int64_t *context_lens, float *out, float *scratch, int64_t batch,
                            int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t num_blocks,
                            int64_t block_size, int64_t table_width, int64_t max_len, float scale, int64_t window,
                            float softcap, const float *sinks, const struct kv_codes *codes) {
    const int64_t group = num_heads / num_kv_heads;
    const struct variant variant = {window, softcap};
    const int64_t head_stride = num_blocks * block_size * head_dim * (codes == NULL ? sizeof(float) : 1);
    for (int64_t b = 0; b < batch; b++)
        for (int64_t kvh = 0; kvh < num_kv_heads; kvh++) {
            const int64_t first = (b * num_heads + kvh * group) * head_dim; /* the group's heads, adjacent */
            attend_any(q + first, (const char *)k_cache + kvh * head_stride, (const char *)v_cache + kvh * head_stride,
                       block_tables + b * table_width, context_lens[b], out + first, scratch, scratch + group * max_len,
                       group, head_dim, block_size, max_len, scale, &variant, sinks != NULL ? sinks + kvh * group : NULL,
                       codes, kvh);
        }
}

/* A step of decode rows only, row b being the step's token b: stores each row's new key (transposed within its
 * block) and value at slots[b] (as codes when `codes` is not NULL), then attends as paged_decode_attention. One
 * pass per row, so the lines the stores bring in are the ones its attention reads next, rather than a scatter over
 * every row before any attention. q [B, H, D], k_new and v_new [B, Hkv, D] are strided views (token stride, head
 * stride; D contiguous), as the model's projections leave them. scratch holds group * (max_len + head_dim) floats,
 * and the codes' buffers more. */
void paged_decode_step(const float *q, int64_t q_token_stride, int64_t q_head_stride, const float *k_new,
                       int64_t k_token_stride, int64_t k_head_stride, const float *v_new, int64_t v_token_stride,
                       int64_t v_head_stride, void *k_cache, void *v_cache, const int64_t *slots,
                       const int64_t *block_tables, const int64_t *context_lens, float *out, float *scratch,
                       int64_t batch, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t num_blocks,
                       int64_t block_size, int64_t table_width, int64_t max_len, float scale, int64_t window,
                       float softcap, const float *sinks, const struct kv_codes *codes) {
    const int64_t group = num_heads / num_kv_heads;
    const int64_t head_elements = num_blocks * block_size * head_dim;
    const int64_t head_stride = head_elements * (codes == NULL ? sizeof(float) : 1);
    const struct variant variant = {window, softcap};
    float *queries = scratch + group * max_len; /* the group's queries, copied adjacent */
    for (int64_t b = 0; b < batch; b++) {
        for (int64_t kvh = 0; kvh < num_kv_heads; kvh++) {
            char *k_head = (char *)k_cache + kvh * head_stride, *v_head = (char *)v_cache + kvh * head_stride;
            const float *key = k_new + b * k_token_stride + kvh * k_head_stride;
            const float *value = v_new + b * v_token_stride + kvh * v_head_stride;
            if (codes == NULL) {
                store_key((float *)k_head, slots[b], key, head_dim, block_size);
                memcpy((float *)v_head + slots[b] * head_dim, value, head_dim * sizeof(float));
            } else {
                store_codes((uint8_t *)k_head, (uint8_t *)v_head, slots[b], key, value, head_dim, block_size, codes,
                            kvh);
            }
            for (int64_t g = 0; g < group; g++)
                memcpy(queries + g * head_dim, q + b * q_token_stride + (kvh * group + g) * q_head_stride,
                       head_dim * sizeof(float));
            attend_any(queries, k_head, v_head, block_tables + b * table_width, context_lens[b],
                       out + (b * num_heads + kvh * group) * head_dim, scratch, queries + group * head_dim, group,
                       head_dim, block_size, max_len, scale, &variant, sinks != NULL ? sinks + kvh * group : NULL,
                       codes, kvh);
        }
    }
}

/* Stores the step's new keys ([Hkv, N, D]) at their pool slots, transposed within blocks as the scores read them. */
void paged_write_keys(float *k_cache, const int64_t *slots, const float *keys, int64_t num_kv_heads, int64_t num_tokens,
                      int64_t head_dim, int64_t num_blocks, int64_t block_size) {
    for (int64_t h = 0; h < num_kv_heads; h++) {
        float *k_head = k_cache + h * num_blocks * head_dim * block_size;
        for (int64_t t = 0; t < num_tokens; t++)
            store_key(k_head, slots[t], keys + (h * num_tokens + t) * head_dim, head_dim, block_size);
    }
}

typedef int32_t lane_mask __attribute__((vector_size(FIXED_BLOCK * sizeof(int32_t))));

/* The first index of the row's largest value, or of its first NaN, one value at a time. */
static int64_t first_argmax(const float *row, int64_t cols) {
    int64_t index = 0;
    for (int64_t i = 1; i < cols && row[index] == row[index]; i++)
        if (row[i] > row[index] || row[i] != row[i]) index = i;
    return index;
}

/* out[r] = the index of the first largest value of row r of x [rows, cols], or of its first NaN, as torch.argmax
 * picks. Each of 16 lanes keeps its best value and the first chunk that held it; the lanes are then compared. */
void greedy_argmax(const float *x, int64_t rows, int64_t cols, int64_t *out) {
    const int64_t num_chunks = cols / FIXED_BLOCK;
    for (int64_t r = 0; r < rows; r++) {
        const float *row = x + r * cols;
        if (num_chunks == 0) {
            out[r] = first_argmax(row, cols);
            continue;
        }
        block_vector best;
        memcpy(&best, row, sizeof best);
        lane_mask best_chunk = {0}, has_nan = best != best;
        for (int64_t c = 1; c < num_chunks; c++) {
            block_vector chunk;
            memcpy(&chunk, row + c * FIXED_BLOCK, sizeof chunk);
            const lane_mask beats = chunk > best;
            best = (block_vector)((beats & (lane_mask)chunk) | (~beats & (lane_mask)best));
            best_chunk = (beats & (int32_t)c) | (~beats & best_chunk);
            has_nan |= chunk != chunk;
        }
        int32_t any_nan = 0;
        for (int k = 0; k < FIXED_BLOCK; k++) any_nan |= has_nan[k];
        if (any_nan) {
            out[r] = first_argmax(row, cols);
            continue;
        }
        int64_t index = best_chunk[0] * FIXED_BLOCK;
        float top = best[0];
        for (int k = 1; k < FIXED_BLOCK; k++) {
            const int64_t lane_index = best_chunk[k] * FIXED_BLOCK + k;
            if (best[k] > top || (best[k] == top && lane_index < index)) top = best[k], index = lane_index;
        }
        for (int64_t i = num_chunks * FIXED_BLOCK; i < cols; i++) /* the tail: later than every chunk */
            if (row[i] > top || row[i] != row[i]) {
                if (row[i] != row[i]) { index = i; break; }
                top = row[i], index = i;
            }
        out[r] = index;
    }
}
