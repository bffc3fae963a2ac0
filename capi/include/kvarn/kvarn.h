/*
 * kvarn.h - the public C API of libkvarn (KVarN KV-cache quantization).
 *
 * Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
 *
 * Three layers (see docs/API.md):
 *   1. Codec (stateless): rotate, quantize tiles to records, dequantize records.
 *   2. Paged attention (stateless, engine-owned memory): append tokens into fp16 pages, flush
 *      completed tiles into records, decode/extend attention over records + pages.
 *   3. Managed cache (stateful): kvarn_cache_t owns its pools; sequences, append, commit,
 *      truncate, fork, attention, statistics, export/import.
 *
 * ABI rules: every fallible call returns kvarn_status_t (0 = OK) and sets a thread-local message
 * readable with kvarn_last_error(). No call aborts the process on bad input. A failing call
 * changes nothing it was given to write (outputs and caches are left as they were); running out
 * of memory is such a failure (KVARN_ERR_OUT_OF_MEMORY), with one exception: kvarn_rotate,
 * kvarn_dequantize and the attention calls may have written part of their outputs when they fail
 * with KVARN_ERR_OUT_OF_MEMORY (an in-place rotate may leave some rows rotated). On a GPU
 * context, "failing" covers what the host can check: bad contents of device memory (table
 * entries, lengths, NaN rows) are found by the kernels after the call has returned KVARN_OK, and
 * reported by the context's next synchronize or copy (append and flush then write nothing;
 * attention outputs are unspecified), or per sequence through the run calls' status array
 * (layer 2, capturable form). Enum arguments
 * and fields are read as integers: a value outside its enumeration gives
 * KVARN_ERR_INVALID_ARGUMENT (or "unknown" / 0 from the calls that cannot fail). Sizes formed
 * from arguments are computed with overflow checks.
 *
 * Growable structs (docs/API.md, "Growable structs"): every struct passed by pointer starts with
 * `size_t size`, which the caller sets to the sizeof() of the header it was compiled with;
 * initialize structs with their *_defaults() function (it sets size, the defaults and zero
 * padding), or zero them and set size. A newer library reads an older, smaller struct, and an
 * older library a newer, larger one:
 *   - Input structs (kvarn_context_options_t, kvarn_config_t, kvarn_paged_kv_t,
 *     kvarn_attention_params_t, kvarn_launch_t, kvarn_attention_shape_t,
 *     kvarn_cache_options_t): a field is read when it lies wholly within `size`; a field past
 *     `size` (or cut by it) takes the default its *_defaults() function gives. Bytes past the
 *     library's own sizeof must be zero (fields of a newer header left unset): if one is not,
 *     the call fails with KVARN_ERR_UNSUPPORTED (the caller asked for something this library
 *     does not know).
 *   - Output structs (kvarn_backend_info_t, kvarn_cache_stats_t): the library writes the fields
 *     that lie wholly within `size`, zeroes the caller's other bytes up to `size` (fields this
 *     library does not know read as 0) and leaves `size` as it was.
 *   - `size` below sizeof(size_t) (kvarn_cache_options_t: below the end of its embedded
 *     `config`) or above 4096 is KVARN_ERR_INVALID_ARGUMENT, with nothing read or written.
 *   - Fields added in later versions go at the end and take 0 to mean "as before".
 *     kvarn_config_t does not grow: it is embedded in kvarn_cache_options_t (see there).
 *
 * Experimental entry points (the KVARN_ABLATE_* values of kvarn_config_t's flag fields and the
 * baseline quantizers) are in kvarn/kvarn_experimental.h, outside these stability promises.
 *
 * Threads: kvarn_last_error() is per thread; kvarn_set_max_cpu_isa() is process-wide and may be
 * called from any thread. A context (kvarn_context_t) may be used by one thread at a time: calls
 * that name the same context, directly or through a cache created on it, must not overlap in
 * time; it may move between threads between calls. Different contexts are independent and may
 * be used from different threads at once (one context per thread is the way to concurrency). A
 * cache (kvarn_cache_t) serializes its own calls with a lock, so one cache may be called from
 * several threads; as its calls use its context, no other call may use that context meanwhile.
 * Destroying a context or cache must not overlap any call on it (or, for a context, on its
 * caches). The stateless calls (config, record layout, names, versions, baselines) may be
 * called from any thread at any time.
 *
 * Memory: "host" pointers are ordinary process memory. For a context on a GPU backend, tensor
 * pointers are device pointers of the context's device, and `stream` is a cudaStream_t /
 * hipStream_t passed as void* (NULL = the default stream).
 *
 * Layouts: all tensors are dense, row-major, with the shapes written beside each argument; the
 * run calls of layer 2 also take token rows with a stride (kvarn_launch_t).
 * Dtypes are named by kvarn_dtype_t. "Hk" = KV heads, "Hq" = query heads (a multiple of Hk),
 * "D" = head_dim, "G" = tile tokens.
 */
#ifndef KVARN_KVARN_H_
#define KVARN_KVARN_H_

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#if defined(KVARN_BUILDING_LIBRARY)
#define KVARN_API __declspec(dllexport)
#else
#define KVARN_API __declspec(dllimport)
#endif
#elif defined(__GNUC__) || defined(__clang__)
#define KVARN_API __attribute__((visibility("default")))
#else
#define KVARN_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * Versions
 * ------------------------------------------------------------------------------------------- */

#define KVARN_VERSION_MAJOR 0
#define KVARN_VERSION_MINOR 1
#define KVARN_VERSION_PATCH 0
/* The ABI major: the SONAME is libkvarn.so.<KVARN_ABI_VERSION>. */
#define KVARN_ABI_VERSION 0
/* major * 10000 + minor * 100 + patch */
#define KVARN_VERSION_NUMBER \
  (KVARN_VERSION_MAJOR * 10000 + KVARN_VERSION_MINOR * 100 + KVARN_VERSION_PATCH)

/* Run-time version of the loaded library: major * 10000 + minor * 100 + patch. */
KVARN_API uint32_t kvarn_version_number(void);
/* "MAJOR.MINOR.PATCH"; static storage, never NULL. */
KVARN_API const char* kvarn_version_string(void);
/* The ABI major of the loaded library (equals KVARN_ABI_VERSION it was built with). */
KVARN_API uint32_t kvarn_abi_version(void);

/* ---------------------------------------------------------------------------------------------
 * Status codes (values are pinned and stable)
 * ------------------------------------------------------------------------------------------- */

typedef enum kvarn_status {
  KVARN_OK = 0,
  KVARN_ERR_INVALID_ARGUMENT = 1,     /* NULL pointer, bad size, bad value */
  KVARN_ERR_UNSUPPORTED = 2,          /* valid but unsupported (shape, dtype, bits, backend op) */
  KVARN_ERR_OUT_OF_MEMORY = 3,        /* an allocation failed */
  KVARN_ERR_BACKEND_UNAVAILABLE = 4,  /* backend not built or no device present */
  KVARN_ERR_NON_FINITE = 5,           /* NaN or Inf in an input */
  KVARN_ERR_OVERFLOW = 6,             /* a value or scale does not fit fp16 */
  KVARN_ERR_CAPACITY = 7,             /* a managed cache limit would be exceeded */
  KVARN_ERR_NOT_FOUND = 8,            /* unknown sequence id, preset name, index */
  KVARN_ERR_ALREADY_EXISTS = 9,       /* sequence id already in use */
  KVARN_ERR_CORRUPT_DATA = 10,        /* blob truncated, bit-flipped or of another version */
  KVARN_ERR_BUFFER_TOO_SMALL = 11,    /* output or workspace buffer too small */
  KVARN_ERR_INVALID_STATE = 12,       /* operation not allowed in the current state */
  KVARN_ERR_DEVICE = 13,              /* a device (CUDA/HIP) call failed; message has details */
  KVARN_ERR_INTERNAL = 14,            /* a bug: please report */
  KVARN_STATUS_SENTINEL_ = 0x7fffffff /* pins the enum to 32 bits */
} kvarn_status_t;

/* A static English description of a status; never NULL (unknown values give "unknown status"). */
KVARN_API const char* kvarn_status_string(kvarn_status_t status);
/* The detail message of the last failing call on this thread ("" after a successful fallible
 * call). Never NULL. Valid until the next fallible kvarn_* call on this thread; the functions
 * that cannot fail (kvarn_status_string, kvarn_last_error, *_defaults, names, versions) leave it
 * unchanged, so `printf("%s: %s", kvarn_status_string(s), kvarn_last_error())` is safe. */
KVARN_API const char* kvarn_last_error(void);

/* ---------------------------------------------------------------------------------------------
 * Enumerations
 * ------------------------------------------------------------------------------------------- */

typedef enum kvarn_dtype {
  KVARN_DTYPE_F32 = 0,
  KVARN_DTYPE_F16 = 1,  /* IEEE binary16 */
  KVARN_DTYPE_BF16 = 2, /* bfloat16 */
  KVARN_DTYPE_SENTINEL_ = 0x7fffffff
} kvarn_dtype_t;

/* Bytes per element of a dtype (0 for an unknown value). */
KVARN_API size_t kvarn_dtype_size(kvarn_dtype_t dtype);

typedef enum kvarn_backend {
  KVARN_BACKEND_AUTO = 0, /* a GPU when one is present, else the CPU */
  KVARN_BACKEND_CPU = 1,
  KVARN_BACKEND_CUDA = 2,
  KVARN_BACKEND_ROCM = 3,
  KVARN_BACKEND_SENTINEL_ = 0x7fffffff
} kvarn_backend_t;

typedef enum kvarn_cpu_isa {
  KVARN_CPU_ISA_SCALAR = 0,
  KVARN_CPU_ISA_AVX2 = 1,
  KVARN_CPU_ISA_AVX512 = 2,
  KVARN_CPU_ISA_NEON = 3,
  KVARN_CPU_ISA_NONE = 255, /* the context does not run on the CPU */
  KVARN_CPU_ISA_SENTINEL_ = 0x7fffffff
} kvarn_cpu_isa_t;

/* ---------------------------------------------------------------------------------------------
 * Backends and CPU features
 * ------------------------------------------------------------------------------------------- */

typedef struct kvarn_backend_info {
  size_t size; /* sizeof(kvarn_backend_info_t); set by the caller */
  kvarn_backend_t backend;
  const char* name;     /* "cpu", "cuda", "rocm"; static storage */
  int32_t available;    /* 1 if contexts can be created on it */
  int32_t device_count; /* devices found (1 for the CPU) */
  const char* reason;   /* why not available ("" when available); static storage */
} kvarn_backend_info_t;

/* Number of backends libkvarn knows (built or not); indexes run 0..count-1. */
KVARN_API int32_t kvarn_backend_count(void);
/* Describes backend `index`. info->size must be set. */
KVARN_API kvarn_status_t kvarn_backend_get_info(int32_t index, kvarn_backend_info_t* info);
/* Short name of a backend value ("auto", "cpu", ...); never NULL. */
KVARN_API const char* kvarn_backend_name(kvarn_backend_t backend);

/* Name of a CPU ISA ("scalar", "avx2", "avx512", "neon", "none"); never NULL. */
KVARN_API const char* kvarn_cpu_isa_name(kvarn_cpu_isa_t isa);
/* The best ISA this CPU supports that libkvarn was built with. */
KVARN_API kvarn_cpu_isa_t kvarn_cpu_isa_best(void);
/* Writes a space-separated list of detected CPU features ("sse4.2 avx2 fma avx512f ...") into
 * buf (NUL-terminated, truncated to buf_bytes). Returns KVARN_ERR_BUFFER_TOO_SMALL if truncated.*/
KVARN_API kvarn_status_t kvarn_cpu_features(char* buf, size_t buf_bytes);
/* Caps the ISA used by CPU contexts created after this call (process-wide; the environment
 * variable KVARN_CPU_ISA=scalar|avx2|avx512|neon sets the initial cap). */
KVARN_API kvarn_status_t kvarn_set_max_cpu_isa(kvarn_cpu_isa_t isa);

/* ---------------------------------------------------------------------------------------------
 * Contexts
 * ------------------------------------------------------------------------------------------- */

typedef struct kvarn_context kvarn_context_t;

typedef struct kvarn_context_options {
  size_t size;             /* sizeof(kvarn_context_options_t) */
  kvarn_backend_t backend; /* default KVARN_BACKEND_AUTO */
  int32_t device;          /* device ordinal for GPU backends; default 0 */
  void* stream;            /* cudaStream_t / hipStream_t; NULL = default stream */
  int32_t num_threads;     /* CPU worker threads; 0 = hardware concurrency (default) */
} kvarn_context_options_t;

KVARN_API void kvarn_context_options_defaults(kvarn_context_options_t* options);
/* Creates a context. options may be NULL (defaults). An explicitly requested backend that is not
 * available fails with KVARN_ERR_BACKEND_UNAVAILABLE (never a silent fallback). */
KVARN_API kvarn_status_t kvarn_context_create(const kvarn_context_options_t* options,
                                              kvarn_context_t** out_context);
/* NULL is a no-op. */
KVARN_API void kvarn_context_destroy(kvarn_context_t* context);
/* The backend that runs this context's calls (never AUTO). */
KVARN_API kvarn_status_t kvarn_context_get_backend(const kvarn_context_t* context,
                                                   kvarn_backend_t* out_backend);
/* The CPU ISA of this context (KVARN_CPU_ISA_NONE for GPU contexts). */
KVARN_API kvarn_status_t kvarn_context_get_cpu_isa(const kvarn_context_t* context,
                                                   kvarn_cpu_isa_t* out_isa);
/* Device ordinal (0 for the CPU) and worker threads (1 for GPU contexts). */
KVARN_API kvarn_status_t kvarn_context_get_device(const kvarn_context_t* context,
                                                  int32_t* out_device);
KVARN_API kvarn_status_t kvarn_context_get_num_threads(const kvarn_context_t* context,
                                                       int32_t* out_threads);

/* Memory in the context's address space (device memory of the context's device for GPU
 * backends, 64-byte aligned host memory for the CPU), for callers that have no allocator of
 * their own (bindings, tools). Free with kvarn_memory_free (NULL is a no-op). */
KVARN_API kvarn_status_t kvarn_memory_alloc(kvarn_context_t* context, size_t bytes, void** out_ptr);
KVARN_API void kvarn_memory_free(kvarn_context_t* context, void* ptr);

typedef enum kvarn_copy_kind {
  KVARN_COPY_HOST_TO_DEVICE = 0,
  KVARN_COPY_DEVICE_TO_HOST = 1,
  KVARN_COPY_DEVICE_TO_DEVICE = 2,
  KVARN_COPY_SENTINEL_ = 0x7fffffff
} kvarn_copy_kind_t;

/* Copies bytes between host memory and the context's memory, ordered on the context's stream;
 * returns when the copy is complete. "Device" means the context's memory (host for the CPU). */
KVARN_API kvarn_status_t kvarn_memory_copy(kvarn_context_t* context, void* dst, const void* src,
                                           size_t bytes, kvarn_copy_kind_t kind);
/* Waits until all work queued on the context's stream is complete (a no-op on the CPU, whose
 * calls are synchronous). */
KVARN_API kvarn_status_t kvarn_context_synchronize(kvarn_context_t* context);
/* The context's error word, for engines that never synchronize through libkvarn: an int32 in the
 * context's memory (device memory on GPU contexts) that holds the kvarn_status_t of the first
 * data error a kernel found in device memory (a call without launch->seq_status, or any call of
 * the non-run layer-2 API) since that error was last reported, and 0 while there is none. Kernels
 * set it on the context's stream as they run, so the engine can read it asynchronously (a copy
 * to pinned memory on its own schedule, or a kernel of its own captured in the same graph). The
 * error, with its message, is still reported by the context's next kvarn_context_synchronize or
 * kvarn_memory_copy, which also clears the word. The pointer is valid until the context is
 * destroyed. On the CPU every error is returned by its own call and the word stays 0. */
KVARN_API kvarn_status_t kvarn_context_error_word(kvarn_context_t* context,
                                                  const int32_t** out_word);

/* ---------------------------------------------------------------------------------------------
 * Configurations (docs/FORMAT.md sections 2-7)
 * ------------------------------------------------------------------------------------------- */

/* A quantization config. A growable input struct like the others when passed alone (fields past
 * `size` keep the kvarn_config_defaults values), but its layout is frozen: kvarn_cache_options_t
 * embeds it by value, so its size places the cache options' later fields, and an embedded
 * config must have size == sizeof(kvarn_config_t) exactly. New quantization settings will go
 * into new structs or new fields of the structs that take a config, never into this one.
 * key_flags / value_flags are experimental: their values (KVARN_ABLATE_*) are defined in
 * kvarn/kvarn_experimental.h and may change in any release; 0 (the default, the KVarN
 * algorithm) is their only stable value. */
typedef struct kvarn_config {
  size_t size;          /* sizeof(kvarn_config_t) */
  int32_t head_dim;     /* D: 64, 80, 96, 128, 256, 512 (80, 96: CPU backend only) */
  int32_t tile_tokens;  /* G: 64, 128 */
  int32_t key_bits;     /* bK: 2, 4, 8 */
  int32_t value_bits;   /* bV: 2, 4, 8 */
  int32_t iterations;   /* Sinkhorn passes T: 0..32 (default 8) */
  int32_t sink_tiles;   /* leading tiles kept fp16: 0..64 (default 1) */
  uint32_t key_flags;   /* experimental: 0, or KVARN_ABLATE_* (kvarn_experimental.h) for K */
  uint32_t value_flags; /* experimental: 0, or KVARN_ABLATE_* (kvarn_experimental.h) for V */
} kvarn_config_t;

/* The default configuration: preset "k4v2_g128", D 128, T 8, one sink tile, flags 0. */
KVARN_API void kvarn_config_defaults(kvarn_config_t* config);
/* Fills config from a preset name ("k4v2_g128", "k4v2_g64", "k4v4_g128", "k4v4_g64",
 * "k2v2_g128", "k8v8_g128", and any "k<b>v<b>_g<G>" with b in {2,4,8}, G in {64,128}) and a head
 * dim; other fields get their defaults. Unknown names give KVARN_ERR_NOT_FOUND. */
KVARN_API kvarn_status_t kvarn_config_from_preset(const char* preset, int32_t head_dim,
                                                  kvarn_config_t* config);
/* Number of named presets and the name of preset `index` (static storage; NULL if out of range).*/
KVARN_API int32_t kvarn_preset_count(void);
KVARN_API const char* kvarn_preset_name(int32_t index);
/* KVARN_OK if every field is supported; else KVARN_ERR_UNSUPPORTED or INVALID_ARGUMENT. */
KVARN_API kvarn_status_t kvarn_config_validate(const kvarn_config_t* config);

/* Record fields in storage order (docs/FORMAT.md section 7). */
typedef enum kvarn_record_field {
  KVARN_FIELD_K_CODES = 0,         /* D rows x G codes of bK bits */
  KVARN_FIELD_K_SCALE = 1,         /* a: fp16 [D] */
  KVARN_FIELD_K_ZERO = 2,          /* z: fp16 [D] */
  KVARN_FIELD_K_TOKEN_SCALE = 3,   /* c: fp16 [G] */
  KVARN_FIELD_V_CODES = 4,         /* G rows x D codes of bV bits */
  KVARN_FIELD_V_CHANNEL_SCALE = 5, /* c': fp16 [D] */
  KVARN_FIELD_V_SCALE = 6,         /* a': fp16 [G] */
  KVARN_FIELD_V_ZERO = 7,          /* z': fp16 [G] */
  KVARN_FIELD_COUNT = 8,
  KVARN_FIELD_SENTINEL_ = 0x7fffffff
} kvarn_record_field_t;

/* Bytes of one record: D*G*(bK+bV)/8 + 6D + 6G (13,824 for D128 G128 k4v2). */
KVARN_API kvarn_status_t kvarn_record_bytes(const kvarn_config_t* config, size_t* out_bytes);
/* Byte offset and length of one field inside a record. */
KVARN_API kvarn_status_t kvarn_record_field(const kvarn_config_t* config,
                                            kvarn_record_field_t field, size_t* out_offset,
                                            size_t* out_bytes);

/* ---------------------------------------------------------------------------------------------
 * Layer 1: codec (stateless, batched)
 * ------------------------------------------------------------------------------------------- */

/* Rotates n_rows vectors of head_dim channels by the orthonormal Hadamard matrix of
 * docs/FORMAT.md section 3 (Sylvester; for head_dim 80 and 96 the Kronecker product of a symmetric
 * Paley matrix and a Sylvester matrix): out[r,:] = in[r,:] H, computed in fp32, rounded to
 * out_dtype (nearest even). H is its own inverse, so the same call un-rotates.
 * in:  [n_rows][head_dim] of in_dtype;  out: [n_rows][head_dim] of out_dtype (may equal in when
 * the dtypes are equal). head_dim in {64,80,96,128,256,512}; 80 and 96 on the CPU backend only
 * (GPU contexts return KVARN_ERR_UNSUPPORTED). */
KVARN_API kvarn_status_t kvarn_rotate(kvarn_context_t* context, int32_t head_dim, size_t n_rows,
                                      kvarn_dtype_t in_dtype, const void* in,
                                      kvarn_dtype_t out_dtype, void* out);

/* Flags of kvarn_quantize / kvarn_dequantize. */
#define KVARN_CODEC_DEFAULT 0u
/* quantize: the inputs are already in the cache frame (rotated per the config flags, fp16 values)
 * so no rotation is applied. dequantize: return the cache frame (do not un-rotate). */
#define KVARN_CODEC_CACHE_FRAME 1u

/* Quantizes n_tiles (K, V) tile pairs into records (docs/FORMAT.md sections 3-7).
 * k, v: [n_tiles][G][D] of dtype, tokens x channels, unrotated (as an engine appends them) unless
 *       KVARN_CODEC_CACHE_FRAME is set. They are rotated (unless ablated) and rounded to fp16
 *       exactly as the cache stores them, then quantized.
 * records: n_tiles records, record_stride bytes apart (>= kvarn_record_bytes; padding bytes are
 *       left untouched).
 * NaN/Inf inputs fail with KVARN_ERR_NON_FINITE, values or scales beyond fp16 with
 * KVARN_ERR_OVERFLOW; on any failure no record is written. */
KVARN_API kvarn_status_t kvarn_quantize(kvarn_context_t* context, const kvarn_config_t* config,
                                        size_t n_tiles, kvarn_dtype_t dtype, const void* k,
                                        const void* v, uint32_t flags, void* records,
                                        size_t record_stride);

/* Reconstructs tiles from records: K'[t,d] = (code*a_d + z_d)*c_t, V'[t,d] = (code*a'_t +
 * z'_t)*c'_d, then un-rotates (unless KVARN_CODEC_CACHE_FRAME or the tensor was not rotated).
 * records: n_tiles records record_stride bytes apart; k_out, v_out: [n_tiles][G][D] of out_dtype
 * (either may be NULL to skip it).
 * Records are not validated: any bytes are read safely, but scale or zero fields holding NaN or
 * Inf (which kvarn_quantize never writes) give NaN or Inf in the outputs they reach (after
 * un-rotation, the whole row), with KVARN_OK; so does attention over such records (the output
 * rows of the queries that see them). kvarn_cache_import_sequence refuses such records. */
KVARN_API kvarn_status_t kvarn_dequantize(kvarn_context_t* context, const kvarn_config_t* config,
                                          size_t n_tiles, const void* records, size_t record_stride,
                                          uint32_t flags, kvarn_dtype_t out_dtype, void* k_out,
                                          void* v_out);

/* ---------------------------------------------------------------------------------------------
 * Layer 2: paged attention over engine-owned memory
 *
 * A sequence of N tokens is a list of tiles of G tokens; tile i covers tokens [i*G, (i+1)*G).
 * Tiles [0, sink_tiles) (the sink) and tiles from sink_tiles + num_record_tiles on (the tail) are
 * fp16 pages; the num_record_tiles tiles in between are records. block_table[b][i] names the
 * page (fp16 tiles) or the record block (record tiles) of tile i of sequence b.
 *   page p:          k_pages + p * Hk*G*D halves, layout [Hk][G][D] (HND), same for v_pages;
 *                    holds rotated fp16 vectors (the cache frame).
 *   record block r:  records + r * Hk * record_stride bytes: the Hk records of one tile, in KV
 *                    head order, record_stride bytes apart.
 * Memory: records, pages, block_table, seq_lens and record_tiles are in the context's memory
 * (device memory for GPU contexts); the indptr arrays and the flush id lists are host memory
 * (they size the launch), so these calls cannot be captured in a CUDA graph: the plan / run form
 * below takes every per-step array from the context's memory.
 * ------------------------------------------------------------------------------------------- */

typedef struct kvarn_paged_kv {
  size_t size;                 /* sizeof(kvarn_paged_kv_t) */
  int32_t num_kv_heads;        /* Hk */
  int32_t batch;               /* number of sequences */
  void* records;               /* record pool, num_record_blocks * Hk * record_stride bytes */
  size_t record_stride;        /* bytes between records (>= kvarn_record_bytes, multiple of 2)*/
  int32_t num_record_blocks;   /* blocks in the record pool (bounds check) */
  void* k_pages;               /* fp16 [num_pages][Hk][G][D] */
  void* v_pages;               /* fp16 [num_pages][Hk][G][D] */
  int32_t num_pages;           /* pages in each page pool (bounds check) */
  const int32_t* block_table;  /* [batch][max_blocks_per_seq] (context memory) */
  int32_t max_blocks_per_seq;  /* row stride of block_table */
  const int32_t* seq_lens;     /* [batch] tokens N_b in the cache (context memory) */
  const int32_t* record_tiles; /* [batch] tiles held as records (context memory) */
} kvarn_paged_kv_t;

KVARN_API void kvarn_paged_kv_defaults(kvarn_paged_kv_t* kv);

/* Writes new tokens into the fp16 pages: for sequence b, the tokens
 * [token_indptr[b], token_indptr[b+1]) of k/v go to positions seq_lens[b], seq_lens[b]+1, ...,
 * rotated (per the config) and rounded to fp16. The pages of those positions must already be in
 * block_table and must be fp16 tiles. seq_lens is not modified (the engine owns it).
 * token_indptr: [batch+1] int32 (host); k, v: [token_indptr[batch]][Hk][D] of dtype.
 * Non-finite or fp16-overflowing inputs fail with nothing written. */
KVARN_API kvarn_status_t kvarn_paged_append(kvarn_context_t* context, const kvarn_config_t* config,
                                            const kvarn_paged_kv_t* kv, const int32_t* token_indptr,
                                            kvarn_dtype_t dtype, const void* k, const void* v);

/* Quantizes n_tiles complete fp16 pages into record blocks: page src_pages[i] (all Hk heads)
 * -> record block dst_blocks[i]. Only kv->num_kv_heads, pools, strides and counts are read.
 * src_pages, dst_blocks: [n_tiles] int32 (host). On failure no record is written. */
KVARN_API kvarn_status_t kvarn_paged_flush(kvarn_context_t* context, const kvarn_config_t* config,
                                           const kvarn_paged_kv_t* kv, size_t n_tiles,
                                           const int32_t* src_pages, const int32_t* dst_blocks);

/* Which cached keys a query sees (positions as in kvarn_attention_params_t). */
typedef enum kvarn_attention_mode {
  /* Queries are the last n_b tokens of the cache (appended before the call): query i of n_b is
   * at position p = N_b - n_b + i and sees keys [0, p]. */
  KVARN_ATTENTION_CAUSAL = 0,
  /* Queries follow the cache (not appended): query i of n_b is at position p = N_b + i and sees
   * every cached key [0, N_b), for an engine that attends to the new tokens with its own fp16
   * kernel and merges the two results by lse. A query that sees no key gets zeros and lse = its
   * sink logit, or -inf without sinks. */
  KVARN_ATTENTION_PREFIX = 1,
  KVARN_ATTENTION_MODE_SENTINEL_ = 0x7fffffff
} kvarn_attention_mode_t;

typedef struct kvarn_attention_params {
  size_t size;             /* sizeof(kvarn_attention_params_t) */
  int32_t num_q_heads;     /* Hq, a multiple of Hk; query head h reads KV head h / (Hq/Hk) */
  float scale;             /* softmax scale; 0 = 1/sqrt(D) (default 0) */
  const int32_t* q_indptr; /* [batch+1] query tokens per sequence (host), or NULL = decode
                              (one query token per sequence). Query i of n_b attends to keys
                              [0, N_b - n_b + i] (causal, aligned to the sequence end; `mode`
                              and `sliding_window` below change which keys). */
  kvarn_dtype_t q_dtype;   /* dtype of q */
  kvarn_dtype_t out_dtype; /* dtype of out */
  int32_t num_splits;      /* split-K partitions per (sequence, KV head); 0 = automatic */
  /* Model variants (0 / NULL: plain causal attention, the behaviour before these fields);
   * docs/API.md "Model variants" maps model configs onto these fields. */
  const float* sinks;          /* [Hq] learned sink logits (gpt-oss), context memory, or NULL: each
                                  joins its head's softmax denominator as exp(sinks[h]) (a logit in
                                  the scaled-score domain, not softcapped, with no value), and lse
                                  includes it. Read at every call (a plan keeps the pointer); must be
                                  finite. */
  int32_t sliding_window;      /* 0 = full attention; W > 0: the query at position p sees the W most
                                  recent keys, itself included: [p - W + 1, p] (transformers'
                                  config.sliding_window; FlashAttention's window_left is W - 1).
                                  Tiles wholly outside every query's window are never read. */
  float logit_softcap;         /* 0 = off; c > 0: each scaled score s becomes c * tanh(s / c) before
                                  the softmax (Gemma 2's attn_logit_softcapping) */
  kvarn_attention_mode_t mode; /* KVARN_ATTENTION_CAUSAL (default) or KVARN_ATTENTION_PREFIX */
} kvarn_attention_params_t;

KVARN_API void kvarn_attention_params_defaults(kvarn_attention_params_t* params);

/* Workspace bytes kvarn_paged_attention needs for this shape (0 is possible). */
KVARN_API kvarn_status_t kvarn_paged_attention_workspace_size(
    kvarn_context_t* context, const kvarn_config_t* config, const kvarn_paged_kv_t* kv,
    const kvarn_attention_params_t* params, size_t total_q_tokens, size_t* out_bytes);

/* Attention of queries over the cache (docs/FORMAT.md section 9): the query is rotated when K is,
 * the output un-rotated when V is; fp32 online softmax. A sequence with seq_lens[b] == 0 is a
 * padding slot: its output rows are zeros and its lse -inf (the sink logit with params->sinks).
 * The model variants (sinks, sliding_window, logit_softcap, KVARN_ATTENTION_PREFIX; section 9.1)
 * run on every backend and kernel (CUDA: the tensor-core kernels the plan would choose without
 * them); head_dim 80 and 96 run on the CPU backend only.
 * q:   [total_q_tokens][Hq][D] of params->q_dtype, unrotated; total_q_tokens = batch for decode,
 *      q_indptr[batch] for extend.
 * out: [total_q_tokens][Hq][D] of params->out_dtype.
 * lse: [total_q_tokens][Hq] float (context memory), natural log of the softmax denominator of
 *      the scaled scores, or NULL.
 * workspace: workspace_bytes bytes of the context's memory (>= the queried size), may be NULL
 *      when the queried size is 0. */
KVARN_API kvarn_status_t kvarn_paged_attention(kvarn_context_t* context,
                                               const kvarn_config_t* config,
                                               const kvarn_paged_kv_t* kv,
                                               const kvarn_attention_params_t* params,
                                               const void* q, void* out, float* lse,
                                               void* workspace, size_t workspace_bytes);

/* ---------------------------------------------------------------------------------------------
 * Layer 2, capturable form: plan / run over device-resident metadata
 *
 * For engines that run each decode step under a CUDA graph (the vLLM / SGLang / TensorRT-LLM
 * pattern). What the scheduler knows when it fixes a batch shape goes into a plan, made once
 * and outside any capture; every per-step value (lengths, tables, offsets, write slots, flush
 * lists and their count) lives in the context's memory. On a GPU context the *_run calls read
 * no host memory other than their argument structs, never synchronize, never allocate, and only
 * enqueue work on the launch's stream, so they can be captured once and replayed while the
 * metadata they point to changes between replays. On a CPU context they run synchronously over
 * host memory with the same semantics.
 *
 * Padding: a sequence slot with no tokens is skipped: append and flush write nothing for it,
 * and attention writes zeros to its output rows and -inf to its lse (seq_lens[b] == 0; also in
 * kvarn_paged_attention).
 *
 * Size-0 launches: a call whose host size is 0 (append: batch 0 or max_tokens 0; flush:
 * max_tiles 0; attention: batch 0, or an extend plan's max_total_q 0) reads none of its lists,
 * tables or buffers (they may be NULL), enqueues nothing and returns KVARN_OK, whatever the
 * device-resident metadata says; no sequence faults. Argument errors (the structs, the plan's
 * shape, the workspace) are still checked.
 *
 * Row ranges (token_indptr, q_indptr): sequence b owns rows [indptr[b], indptr[b+1]). A boundary
 * indptr[j] is bad when indptr[0] != 0, when it lies outside [0, limit] (limit: max_tokens for
 * token_indptr, the plan's max_total_q for q_indptr), or when it is below an earlier boundary or
 * above a later one. Every sequence with a bad boundary (j == b or j == b + 1) faults with
 * KVARN_ERR_INVALID_ARGUMENT, so ranges that overlap fault every sequence touching them and the
 * sequences left own disjoint rows. The rule is the same with and without a status array and on
 * every backend.
 *
 * Error model:
 *   - Argument errors (NULL pointers, sizes, dtypes, shapes that disagree with the plan, a
 *     workspace too small) are found on the host: the call returns their status and enqueues
 *     nothing.
 *   - Data errors are found by the kernels in the context's memory: a NaN/Inf or fp16-overflowing
 *     row, a slot or pool index out of range, lengths that do not add up. With
 *     launch->seq_status set they are per sequence: seq_status[b] receives the kvarn_status_t
 *     code of the first fault of sequence b (KVARN_ERR_NON_FINITE, KVARN_ERR_OVERFLOW or
 *     KVARN_ERR_INVALID_ARGUMENT), sequence b stays exactly as it was (none of its tokens is
 *     appended, none of its flush entries writes a record), and every other sequence proceeds.
 *     The calls never clear an entry, and an entry already non-zero when a call starts makes the
 *     call skip that sequence: one step can chain append -> flush -> attention on one status
 *     array, which the engine clears (cudaMemsetAsync) when it has read it.
 *     Without seq_status a data error fails the whole call: append and flush write nothing, and
 *     the error is returned by the context's next kvarn_context_synchronize or
 *     kvarn_memory_copy (on the CPU, by the call itself).
 *   - Attention output rows (and lse) of a sequence that faults, or had faulted, are unspecified.
 * ------------------------------------------------------------------------------------------- */

/* The integer type of a run call's slot and index lists (kvarn_launch_t.index_type). */
typedef enum kvarn_index_type {
  KVARN_INDEX_INT32 = 0, /* int32_t (the default) */
  KVARN_INDEX_INT64 = 1, /* int64_t (vLLM's slot_mapping, torch's default integer) */
  KVARN_INDEX_SENTINEL_ = 0x7fffffff
} kvarn_index_type_t;

/* Where and with what a *_run call executes, and the layout of its token tensors.
 * Row strides: a "row" is one token, [H][D] elements (H = Hk for k and v, Hq for q and out);
 * heads stay dense inside a row. Row t starts t * stride elements after the pointer. 0 means
 * dense (H * D); else at least H * D (rows never overlap), so an engine can pass views of a
 * fused qkv projection ([tokens][(Hq + 2 Hk) * D]) or of a larger output buffer without a copy.
 * A call reads the strides of the tensors it takes (append: k, v; attention: q, out) and
 * ignores the others, so one launch struct may serve a whole step. lse stays dense. */
typedef struct kvarn_launch {
  size_t size;            /* sizeof(kvarn_launch_t) */
  void* stream;           /* cudaStream_t / hipStream_t of this call; NULL = the context's */
  int32_t* seq_status;    /* [batch] int32 per-sequence status (context memory), or NULL */
  void* workspace;        /* caller-owned scratch (context memory); NULL when none is needed */
  size_t workspace_bytes; /* bytes at workspace */
  /* Later fields (growable struct: a caller built with an older header gets 0, as before). */
  int64_t q_row_stride;   /* elements between query tokens of q; 0 = dense */
  int64_t k_row_stride;   /* elements between tokens of k; 0 = dense */
  int64_t v_row_stride;   /* elements between tokens of v; 0 = dense */
  int64_t out_row_stride; /* elements between tokens of out; 0 = dense */
  /* The type of slot_mapping (append) and of src_pages, dst_blocks, tile_seqs (flush): the
   * pointers are passed as const int32_t* and read as int64_t when KVARN_INDEX_INT64. The
   * indptr arrays, n_tiles, and kv's tables stay int32. Default KVARN_INDEX_INT32. */
  kvarn_index_type_t index_type;
} kvarn_launch_t;

KVARN_API void kvarn_launch_defaults(kvarn_launch_t* launch);

/* Writes new tokens by slot (vLLM's slot_mapping): token t goes, rotated (per the config) and
 * rounded to fp16, to position slot_mapping[t] % G of page slot_mapping[t] / G, in the K and V
 * pages. slot_mapping[t] == -1 skips token t (padding). Sequence b owns tokens
 * [token_indptr[b], token_indptr[b+1]) (for seq_status). Of kv, only num_kv_heads, batch,
 * k_pages, v_pages and num_pages are read: append never reads seq_lens or block_table, so one
 * set of lengths (after the append) serves append and attention.
 * token_indptr: [batch+1] int32, slot_mapping: [max_tokens] int32 (int64 with
 * launch->index_type KVARN_INDEX_INT64), both context memory;
 * k, v: [max_tokens][Hk][D] of dtype, tokens launch->k_row_stride / v_row_stride elements apart.
 * max_tokens (host) sizes the launch. Data errors: a bad token_indptr range (see "Row
 * ranges": not starting at 0, decreasing, or beyond max_tokens), a slot outside the page
 * pool, a non-finite or fp16-overflowing row. No workspace. */
KVARN_API kvarn_status_t kvarn_paged_append_run(
    kvarn_context_t* context, const kvarn_config_t* config, const kvarn_paged_kv_t* kv,
    const kvarn_launch_t* launch, const int32_t* token_indptr, const int32_t* slot_mapping,
    size_t max_tokens, kvarn_dtype_t dtype, const void* k, const void* v);

/* Workspace bytes kvarn_paged_flush_run needs for up to max_tiles tiles (from shapes alone). */
KVARN_API kvarn_status_t kvarn_paged_flush_workspace_size(const kvarn_config_t* config,
                                                          int32_t num_kv_heads, size_t max_tiles,
                                                          size_t* out_bytes);

/* Quantizes the first *n_tiles entries of a device list: page src_pages[i] (all Hk heads) ->
 * record block dst_blocks[i]. n_tiles: one int32 in context memory; max_tiles (host) sizes the
 * launch. src_pages, dst_blocks, tile_seqs: [max_tiles] int32 (int64 with launch->index_type
 * KVARN_INDEX_INT64), context memory; tile_seqs[i] names the sequence (0..batch-1) entry i
 * belongs to, or is -1 for an entry of no sequence (a request that has left the batch, whose
 * last tile is still to be quantized, e.g. for prefix caching): such an entry is flushed
 * whatever seq_status holds. tile_seqs is required with launch->seq_status (else it may be NULL
 * and is not read). Of kv, only num_kv_heads, batch and the pools are read.
 * Data errors of an entry (its sequence's, per the error model above): a page or block outside
 * its pool, a NaN/Inf in the page, a scale beyond fp16. Data errors of the call (nothing is
 * flushed, reported as without seq_status): *n_tiles outside [0, max_tiles], a tile_seqs entry
 * that is neither in the batch nor -1, a data error of an entry whose tile_seqs is -1. Workspace:
 * kvarn_paged_flush_workspace_size bytes, 256-byte aligned on a GPU context (as kvarn_memory_alloc
 * and cudaMalloc return). */
KVARN_API kvarn_status_t kvarn_paged_flush_run(kvarn_context_t* context,
                                               const kvarn_config_t* config,
                                               const kvarn_paged_kv_t* kv,
                                               const kvarn_launch_t* launch, size_t max_tiles,
                                               const int32_t* n_tiles, const int32_t* src_pages,
                                               const int32_t* dst_blocks, const int32_t* tile_seqs);

/* The shape an attention plan is made for. */
typedef struct kvarn_attention_shape {
  size_t size;                /* sizeof(kvarn_attention_shape_t) */
  int32_t batch;              /* sequence slots (padding slots included) */
  int32_t num_kv_heads;       /* Hk */
  int32_t max_blocks_per_seq; /* block_table row stride: the longest context, in tiles */
  int32_t max_q_per_seq;      /* 0 = decode (one query token per slot, no q_indptr); else the
                                 most query tokens of one sequence (extend) */
  int64_t max_total_q;        /* extend: the most query tokens of a step (rows of q, out and
                                 lse); ignored for decode (= batch) */
} kvarn_attention_shape_t;

KVARN_API void kvarn_attention_shape_defaults(kvarn_attention_shape_t* shape);

typedef struct kvarn_attention_plan kvarn_attention_plan_t;

/* Makes a plan for every step of this shape: kernel choice, split counts and workspace size.
 * params: as for kvarn_paged_attention, with q_indptr NULL (queries come at run time). The plan
 * belongs to the context (destroy it first) and may be used by any call on it. */
KVARN_API kvarn_status_t kvarn_attention_plan_create(kvarn_context_t* context,
                                                     const kvarn_config_t* config,
                                                     const kvarn_attention_shape_t* shape,
                                                     const kvarn_attention_params_t* params,
                                                     kvarn_attention_plan_t** out_plan);
/* NULL is a no-op. */
KVARN_API void kvarn_attention_plan_destroy(kvarn_attention_plan_t* plan);
/* Workspace bytes every run of the plan needs (0 is possible). */
KVARN_API kvarn_status_t kvarn_attention_plan_workspace_size(const kvarn_attention_plan_t* plan,
                                                             size_t* out_bytes);
/* The kernel the plan runs, a static string: "cpu", "cuda-tensor-core-decode",
 * "cuda-tensor-core-extend" or "cuda-general" (ROCm contexts: "cuda-general" too, the same
 * kernel compiled as HIP). The tensor-core kernels read the pools with 16-byte copies: a run whose
 * records, k_pages or v_pages are not 16-byte aligned, or whose record_stride is not a multiple of
 * 16, fails with KVARN_ERR_INVALID_ARGUMENT (never a silent fall back to the slower kernel;
 * kvarn_paged_attention, without a plan, does fall back). "cuda-general" is chosen only for
 * shapes the tensor-core family lacks (D 512 with G 128 and k8v8, k8v4 or k4v8) or when the
 * environment forces it (KVARN_CUDA_ATTENTION=generic). */
KVARN_API kvarn_status_t kvarn_attention_plan_kernel(const kvarn_attention_plan_t* plan,
                                                     const char** out_name);

/* Attention of one step under a plan (docs/FORMAT.md section 9, as kvarn_paged_attention).
 * kv: batch, num_kv_heads and max_blocks_per_seq equal to the plan's shape; seq_lens (the
 * lengths after this step's append), record_tiles and block_table in context memory.
 * q_indptr: decode plans NULL; extend plans [batch+1] int32 in context memory (sequence b has
 * q_indptr[b+1] - q_indptr[b] <= max_q_per_seq query tokens; a bad range, see "Row ranges"
 * with limit max_total_q, or more tokens is a data error). q, out: [rows][Hq][D], tokens
 * launch->q_row_stride / out_row_stride elements apart (only the rows' [Hq][D] elements are
 * read or written); lse: [rows][Hq] float or NULL, dense; rows = batch (decode) or
 * max_total_q (extend; rows past q_indptr[batch] are not written).
 * launch->workspace: kvarn_attention_plan_workspace_size bytes. */
KVARN_API kvarn_status_t kvarn_paged_attention_run(
    kvarn_context_t* context, const kvarn_attention_plan_t* plan, const kvarn_paged_kv_t* kv,
    const kvarn_launch_t* launch, const int32_t* q_indptr, const void* q, void* out, float* lse);

/* ---------------------------------------------------------------------------------------------
 * Layer 3: managed cache
 *
 * A cache owns, for each layer, a record pool and fp16 page pools on the context's device.
 * Sequences are named by caller-chosen int64 ids. Tokens appended to a layer are committed at
 * once unless appended with KVARN_APPEND_SPECULATIVE; a tile is quantized exactly once, when all
 * its G tokens are committed (and it is not a sink tile). Attention sees every appended token,
 * speculative or not.
 * ------------------------------------------------------------------------------------------- */

typedef struct kvarn_cache kvarn_cache_t;

typedef struct kvarn_cache_options {
  size_t size;           /* sizeof(kvarn_cache_options_t) */
  kvarn_config_t config; /* the quantization config (default: kvarn_config_defaults) */
  int32_t num_layers;    /* >= 1 (default 1) */
  int32_t num_kv_heads;  /* Hk >= 1 (default 8) */
  int64_t max_tokens;    /* size of the record pool, in tokens (default 65536): see below */
  int32_t max_sequences; /* (default 256) */
} kvarn_cache_options_t;

KVARN_API void kvarn_cache_options_defaults(kvarn_cache_options_t* options);
/* Creates a cache on the context's backend/device. The context must outlive the cache.
 * Capacity, per layer: max_tokens sizes the record pool, ceil(max_tokens / tile_tokens) record
 * tiles shared by all sequences (a forked prefix counts once). It is not a cap on tokens: the
 * sink tiles and the fp16 tail of each sequence (committed or speculative) live in a separate
 * page pool of max_sequences * (sink_tiles + 2) tiles, so a layer can hold up to that many more
 * tiles of tokens (with max_tokens = 1, G = 64 and one sink tile, one sequence holds 191 tokens).
 * An append or commit that needs a record tile or a page beyond these pools fails with
 * KVARN_ERR_CAPACITY and changes nothing. max_tokens whose pools do not fit in 2^30 record tiles
 * (or pages) fail with KVARN_ERR_CAPACITY. */
KVARN_API kvarn_status_t kvarn_cache_create(kvarn_context_t* context,
                                            const kvarn_cache_options_t* options,
                                            kvarn_cache_t** out_cache);
KVARN_API void kvarn_cache_destroy(kvarn_cache_t* cache);

KVARN_API kvarn_status_t kvarn_cache_add_sequence(kvarn_cache_t* cache, int64_t seq_id);
/* Removes a sequence and frees what only it used. */
KVARN_API kvarn_status_t kvarn_cache_remove_sequence(kvarn_cache_t* cache, int64_t seq_id);
/* New sequence dst_id holding the first n_tokens tokens of src_id in every layer (n_tokens <= the
 * committed length of src in every layer; -1 = all committed tokens). Records of the shared
 * prefix are shared, not copied. Fails with INVALID_STATE if n_tokens cuts a record tile. */
KVARN_API kvarn_status_t kvarn_cache_fork(kvarn_cache_t* cache, int64_t src_id, int64_t dst_id,
                                          int64_t n_tokens);
/* Drops tokens beyond n_tokens in every layer (committed or speculative). Tokens inside a tile
 * already quantized cannot be dropped alone: n_tokens must not fall strictly inside a record
 * tile (INVALID_STATE); whole record tiles may be dropped. */
KVARN_API kvarn_status_t kvarn_cache_truncate(kvarn_cache_t* cache, int64_t seq_id,
                                              int64_t n_tokens);

#define KVARN_APPEND_DEFAULT 0u
#define KVARN_APPEND_SPECULATIVE 1u /* tokens stay uncommitted until commit/truncate */

/* Appends n_tokens tokens to one layer of one sequence. k, v: [n_tokens][Hk][D] of dtype,
 * unrotated, in the context's memory. Without KVARN_APPEND_SPECULATIVE the tokens are committed
 * (not allowed while the layer holds speculative tokens: INVALID_STATE) and completed tiles are
 * quantized. On any failure the cache is exactly as before. */
KVARN_API kvarn_status_t kvarn_cache_append(kvarn_cache_t* cache, int64_t seq_id, int32_t layer,
                                            size_t n_tokens, kvarn_dtype_t dtype, const void* k,
                                            const void* v, uint32_t flags);
/* Commits the first n_tokens tokens of the sequence in every layer (every layer must hold at
 * least n_tokens; committing fewer than already committed is INVALID_ARGUMENT). Completed tiles
 * are quantized. Speculative tokens beyond n_tokens stay speculative. */
KVARN_API kvarn_status_t kvarn_cache_commit(kvarn_cache_t* cache, int64_t seq_id, int64_t n_tokens);

/* Tokens in one layer of a sequence (committed + speculative) and the committed count. */
KVARN_API kvarn_status_t kvarn_cache_sequence_length(const kvarn_cache_t* cache, int64_t seq_id,
                                                     int32_t layer, int64_t* out_tokens,
                                                     int64_t* out_committed);

/* Attention for one layer over n_seqs sequences (decode when params->q_indptr is NULL, extend
 * otherwise). q: [total_q_tokens][Hq][D], out likewise, lse [total_q_tokens][Hq] or NULL, all in
 * the context's memory; seq_ids: [n_seqs] (host). */
KVARN_API kvarn_status_t kvarn_cache_attention(kvarn_cache_t* cache, int32_t layer, size_t n_seqs,
                                               const int64_t* seq_ids,
                                               const kvarn_attention_params_t* params,
                                               const void* q, void* out, float* lse);

typedef struct kvarn_cache_stats {
  size_t size; /* sizeof(kvarn_cache_stats_t) */
  int64_t sequences;
  int64_t tokens;           /* summed over sequences and layers */
  int64_t committed_tokens; /* summed over sequences and layers */
  int64_t records;          /* distinct records in use (one per tile per KV head per layer) */
  int64_t pages;            /* fp16 pages in use */
  int64_t bytes_used;       /* record + page bytes in use */
  int64_t bytes_capacity;   /* bytes reserved by the pools */
  int64_t fp16_bytes;       /* bytes the same tokens take as an fp16 K/V cache */
  double compression_ratio; /* fp16_bytes / bytes_used (0 when empty) */
} kvarn_cache_stats_t;

/* stats->size must be set by the caller. */
KVARN_API kvarn_status_t kvarn_cache_get_stats(const kvarn_cache_t* cache,
                                               kvarn_cache_stats_t* stats);

/* Serializes one sequence (all layers, committed and speculative state) as a versioned,
 * checksummed blob. With buffer == NULL, only *out_bytes is set (the size needed). Fails with
 * KVARN_ERR_BUFFER_TOO_SMALL (and sets *out_bytes) when buffer_bytes is too small. */
KVARN_API kvarn_status_t kvarn_cache_export_sequence(const kvarn_cache_t* cache, int64_t seq_id,
                                                     void* buffer, size_t buffer_bytes,
                                                     size_t* out_bytes);
/* Adds sequence seq_id from a blob made by kvarn_cache_export_sequence on a cache of the same
 * config, layers and KV heads. Truncated, corrupted or foreign blobs give KVARN_ERR_CORRUPT_DATA
 * and change nothing; so do blobs whose checksum matches but whose contents append would refuse
 * (sizes or lengths that do not add up, NaN/Inf fp16 token values, non-zero bytes past the end
 * of the sequence, non-finite record scales or zeros). The checksum detects accidents, not
 * tampering: only blob_bytes bytes of blob are ever read. blob: host memory. */
KVARN_API kvarn_status_t kvarn_cache_import_sequence(kvarn_cache_t* cache, int64_t seq_id,
                                                     const void* blob, size_t blob_bytes);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KVARN_KVARN_H_ */
