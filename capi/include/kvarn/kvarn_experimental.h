/*
 * kvarn_experimental.h - research-only entry points of libkvarn.
 *
 * Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
 *
 * ============================================================================================
 *  EXPERIMENTAL: NO STABILITY PROMISE. Everything declared in this header may change or
 *  disappear in any release, minor and patch releases included, without a deprecation period
 *  and without a change of the ABI version. It exists for accuracy studies (docs/ACCURACY.md)
 *  and tests; serving code should use kvarn.h alone.
 * ============================================================================================
 *
 * It holds:
 *   - the KVARN_ABLATE_* flags, the values of kvarn_config_t's key_flags / value_flags fields
 *     (kvarn.h keeps the fields, for layout stability; 0 is their only stable value), which
 *     switch parts of the KVarN algorithm off to compute baselines with the same code;
 *   - kvarn_baseline_roundtrip, reference quantizers the KVarN record is compared against.
 *
 * kvarn_baseline_roundtrip is exported by libkvarn.so like the stable functions (it is listed in
 * capi/symbols.txt), but its signature and behaviour are covered by this banner, not by the
 * ABI rules of kvarn.h. The rules of kvarn.h otherwise apply (status codes, kvarn_last_error,
 * nothing written on failure).
 */
#ifndef KVARN_KVARN_EXPERIMENTAL_H_
#define KVARN_KVARN_EXPERIMENTAL_H_

#include "kvarn/kvarn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * Ablation switches (kvarn_config_t.key_flags / value_flags), per tensor (K and V separately)
 * ------------------------------------------------------------------------------------------- */

#define KVARN_ABLATE_NONE 0u
#define KVARN_ABLATE_NO_ROTATION 1u      /* the cache holds unrotated vectors */
#define KVARN_ABLATE_NO_NORMALIZATION 2u /* no Sinkhorn passes: plain per-row RTN */

/* ---------------------------------------------------------------------------------------------
 * Baseline quantizers
 * ------------------------------------------------------------------------------------------- */

/* Baseline quantizers for accuracy studies (docs/ACCURACY.md): methods the KVarN record is
 * compared against that its ablation switches cannot express. Host memory, fp32, no context. */
typedef enum kvarn_baseline {
  /* Asymmetric min/max round-to-nearest of each row at `bits` (2..8) bits with an fp16 scale and
   * zero per row: code = clamp(rint((x - z) / s), 0, 2^bits - 1), x' = code * s + z. */
  KVARN_BASELINE_PER_TOKEN_RTN = 0,
  /* fp8 e4m3 (OCP, max 448) with an fp16 per-row scale absmax / 448; `bits` is ignored. */
  KVARN_BASELINE_FP8_E4M3 = 1,
  KVARN_BASELINE_SENTINEL_ = 0x7fffffff
} kvarn_baseline_t;

/* Quantizes and reconstructs each of `rows` rows of `cols` floats (a token's channels) with
 * `method`; `out` may equal `in`. NaN/Inf inputs give KVARN_ERR_NON_FINITE and |x| > 65504
 * KVARN_ERR_OVERFLOW, with nothing written. */
KVARN_API kvarn_status_t kvarn_baseline_roundtrip(kvarn_baseline_t method, int32_t bits,
                                                  size_t rows, int32_t cols, const float* in,
                                                  float* out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KVARN_KVARN_EXPERIMENTAL_H_ */
