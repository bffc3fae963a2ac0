#include <kvarn/kvarn.h>
#include <stdio.h>
#define CHECK(call) \
  if ((call) != KVARN_OK) return fprintf(stderr, "%s: %s\n", #call, kvarn_last_error()), 1

enum { LAYERS = 2, HK = 2, HQ = 8, D = 128, N = 4000 }; /* GQA 4, 4000 tokens */
static float k[N * HK * D], v[N * HK * D], q[HQ * D], out[HQ * D];

int main(void) {
  kvarn_context_options_t copt;
  kvarn_context_t* ctx;
  kvarn_cache_options_t opt;
  kvarn_cache_t* cache;
  kvarn_attention_params_t ap;
  kvarn_cache_stats_t s;
  int64_t seq = 42;
  int layer, i;
  for (i = 0; i < N * HK * D; ++i) k[i] = v[i] = i * 7919L % 2001 / 1e3f - 1; /* model data */
  for (i = 0; i < HQ * D; ++i) q[i] = i * 7919L % 2001 / 1e3f - 1;

  kvarn_context_options_defaults(&copt);
  copt.backend = KVARN_BACKEND_CPU;
  CHECK(kvarn_context_create(&copt, &ctx));
  kvarn_cache_options_defaults(&opt);
  CHECK(kvarn_config_from_preset("k4v2_g128", D, &opt.config)); /* 4-bit K, 2-bit V */
  opt.num_layers = LAYERS, opt.num_kv_heads = HK, opt.max_tokens = 4096, opt.max_sequences = 1;
  CHECK(kvarn_cache_create(ctx, &opt, &cache));
  s.size = sizeof s;
  CHECK(kvarn_cache_get_stats(cache, &s));
  printf("cache: %lld bytes reserved\n", (long long)s.bytes_capacity);

  CHECK(kvarn_cache_add_sequence(cache, seq));
  for (layer = 0; layer < LAYERS; ++layer) /* k, v: [N][HK][D] fp32, unrotated */
    CHECK(kvarn_cache_append(cache, seq, layer, N, KVARN_DTYPE_F32, k, v, KVARN_APPEND_DEFAULT));
  kvarn_attention_params_defaults(&ap); /* fp32 q and out */
  ap.num_q_heads = HQ;
  CHECK(kvarn_cache_attention(cache, 0, 1, &seq, &ap, q, out, NULL)); /* decode: out [HQ][D] */

  CHECK(kvarn_cache_get_stats(cache, &s));
  printf("%lld tokens: %lld bytes used, %lld as fp16: %.2fx smaller\n", (long long)s.tokens,
         (long long)s.bytes_used, (long long)s.fp16_bytes, s.compression_ratio);
  kvarn_cache_destroy(cache);
  kvarn_context_destroy(ctx);
  return 0;
}
