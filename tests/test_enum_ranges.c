/* Regression test of issue 15, defect 6: enum arguments and enum fields given out-of-range
 * integers by a C caller (here -1, which C allows) must be refused with INVALID_ARGUMENT (or give
 * "unknown"/0 where a call cannot fail), never be undefined behaviour in the library. Written in
 * C on purpose: forming such a value in C++ would itself be undefined. Run under UBSan (preset
 * cpu-asan), where the library's invalid enum loads used to abort. */
#include <kvarn/kvarn.h>
#include <kvarn/kvarn_experimental.h>
#include <stdio.h>
#include <string.h>

static int failures = 0;

#define EXPECT_STATUS(call, want)                                                           \
  do {                                                                                      \
    kvarn_status_t got_ = (call);                                                           \
    if (got_ != (want)) {                                                                   \
      fprintf(stderr, "FAIL line %d: %s -> %d (%s), want %d\n", __LINE__, #call, (int)got_, \
              kvarn_last_error(), (int)(want));                                             \
      ++failures;                                                                           \
    }                                                                                       \
  } while (0)

#define EXPECT_TRUE(cond)                                     \
  do {                                                        \
    if (!(cond)) {                                            \
      fprintf(stderr, "FAIL line %d: %s\n", __LINE__, #cond); \
      ++failures;                                             \
    }                                                         \
  } while (0)

int main(void) {
  const int bad_values[] = {-1, -2147483647 - 1, 3, 1000};
  size_t i;
  kvarn_context_options_t copt;
  kvarn_context_t* ctx = NULL;
  kvarn_config_t cfg;
  kvarn_cache_options_t opt;
  kvarn_cache_t* cache = NULL;
  static float k[128 * 128], v[128 * 128], out[4 * 128 * 128];
  static unsigned char rec[16384];
  size_t off, bytes;

  kvarn_context_options_defaults(&copt);
  copt.backend = KVARN_BACKEND_CPU;
  copt.num_threads = 2;
  if (kvarn_context_create(&copt, &ctx) != KVARN_OK) {
    fprintf(stderr, "context: %s\n", kvarn_last_error());
    return 1;
  }
  kvarn_config_from_preset("k4v2_g128", 128, &cfg);
  kvarn_cache_options_defaults(&opt);
  opt.config = cfg;
  opt.num_kv_heads = 2;
  opt.max_tokens = 1024;
  opt.max_sequences = 2;
  if (kvarn_cache_create(ctx, &opt, &cache) != KVARN_OK) return 1;
  kvarn_cache_add_sequence(cache, 1);
  EXPECT_STATUS(kvarn_cache_append(cache, 1, 0, 1, KVARN_DTYPE_F32, k, v, 0), KVARN_OK);

  for (i = 0; i < sizeof bad_values / sizeof bad_values[0]; ++i) {
    const int b = bad_values[i];
    const int neg = b < 0;
    kvarn_context_options_t o;
    kvarn_context_t* c2 = NULL;
    kvarn_attention_params_t ap;
    kvarn_paged_kv_t kv;
    kvarn_launch_t launch;
    int32_t zero = 0, indptr[2] = {0, 0};
    int64_t id = 1;

    /* Calls that cannot fail. */
    EXPECT_TRUE(kvarn_status_string((kvarn_status_t)b) != NULL);
    if (neg) EXPECT_TRUE(strcmp(kvarn_status_string((kvarn_status_t)b), "unknown status") == 0);
    EXPECT_TRUE(kvarn_dtype_size((kvarn_dtype_t)b) == 0);
    EXPECT_TRUE(strcmp(kvarn_backend_name((kvarn_backend_t)(b == 3 ? 99 : b)), "unknown") == 0);
    EXPECT_TRUE(strcmp(kvarn_cpu_isa_name((kvarn_cpu_isa_t)(b == 3 ? 99 : b)), "unknown") == 0);

    /* Fallible calls. */
    if (b != 3)
      EXPECT_STATUS(kvarn_set_max_cpu_isa((kvarn_cpu_isa_t)b), KVARN_ERR_INVALID_ARGUMENT);
    kvarn_context_options_defaults(&o);
    o.backend = (kvarn_backend_t)(b == 3 ? 99 : b);
    EXPECT_STATUS(kvarn_context_create(&o, &c2), KVARN_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(kvarn_memory_copy(ctx, k, v, 4, (kvarn_copy_kind_t)b),
                  KVARN_ERR_INVALID_ARGUMENT);
    if (neg || b == 1000) {
      EXPECT_STATUS(kvarn_record_field(&cfg, (kvarn_record_field_t)b, &off, &bytes),
                    KVARN_ERR_INVALID_ARGUMENT);
    }
    EXPECT_STATUS(kvarn_rotate(ctx, 128, 1, (kvarn_dtype_t)b, k, KVARN_DTYPE_F32, v),
                  KVARN_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(kvarn_rotate(ctx, 128, 1, KVARN_DTYPE_F32, k, (kvarn_dtype_t)b, v),
                  KVARN_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(kvarn_quantize(ctx, &cfg, 1, (kvarn_dtype_t)b, k, v, 0, rec, sizeof rec),
                  KVARN_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(kvarn_dequantize(ctx, &cfg, 1, rec, sizeof rec, 0, (kvarn_dtype_t)b, k, v),
                  KVARN_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(kvarn_baseline_roundtrip((kvarn_baseline_t)(b == 3 ? 99 : b), 4, 1, 8, k, out),
                  KVARN_ERR_INVALID_ARGUMENT);

    kvarn_paged_kv_defaults(&kv);
    kv.num_kv_heads = 1;
    kv.batch = 1;
    kv.k_pages = out;
    kv.v_pages = out;
    kv.num_pages = 1;
    kv.block_table = &zero;
    kv.max_blocks_per_seq = 1;
    kv.seq_lens = &zero;
    kv.record_tiles = &zero;
    EXPECT_STATUS(kvarn_paged_append(ctx, &cfg, &kv, indptr, (kvarn_dtype_t)b, k, v),
                  KVARN_ERR_INVALID_ARGUMENT);
    /* Issue 28, defect 3: the slot-mapped append copied its dtype before checking it. */
    EXPECT_STATUS(
        kvarn_paged_append_run(ctx, &cfg, &kv, NULL, indptr, &zero, 1, (kvarn_dtype_t)b, k, v),
        KVARN_ERR_INVALID_ARGUMENT);
    kvarn_launch_defaults(&launch);
    launch.index_type = (kvarn_index_type_t)b; /* every bad value is outside {INT32, INT64} */
    EXPECT_STATUS(
        kvarn_paged_append_run(ctx, &cfg, &kv, &launch, indptr, &zero, 1, KVARN_DTYPE_F32, k, v),
        KVARN_ERR_INVALID_ARGUMENT);

    kvarn_attention_params_defaults(&ap);
    ap.num_q_heads = 2;
    ap.q_dtype = (kvarn_dtype_t)b;
    EXPECT_STATUS(kvarn_paged_attention_workspace_size(ctx, &cfg, &kv, &ap, 1, &bytes),
                  KVARN_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(kvarn_cache_attention(cache, 0, 1, &id, &ap, k, out, NULL),
                  KVARN_ERR_INVALID_ARGUMENT);
    {
      kvarn_attention_shape_t shape;
      kvarn_attention_plan_t* plan = NULL;
      kvarn_attention_shape_defaults(&shape);
      shape.batch = 1;
      shape.max_blocks_per_seq = 1;
      EXPECT_STATUS(kvarn_attention_plan_create(ctx, &cfg, &shape, &ap, &plan),
                    KVARN_ERR_INVALID_ARGUMENT);
      EXPECT_TRUE(plan == NULL);
    }
    ap.q_dtype = KVARN_DTYPE_F32;
    ap.out_dtype = (kvarn_dtype_t)b;
    EXPECT_STATUS(kvarn_paged_attention(ctx, &cfg, &kv, &ap, k, out, NULL, NULL, 0),
                  KVARN_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(kvarn_cache_attention(cache, 0, 1, &id, &ap, k, out, NULL),
                  KVARN_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(kvarn_cache_append(cache, 1, 0, 1, (kvarn_dtype_t)b, k, v, 0),
                  KVARN_ERR_INVALID_ARGUMENT);
  }

  kvarn_cache_destroy(cache);
  kvarn_context_destroy(ctx);
  if (failures) {
    fprintf(stderr, "%d failures\n", failures);
    return 1;
  }
  printf("all enum range checks passed\n");
  return 0;
}
