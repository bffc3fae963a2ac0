// Reference quantizers that are not KVarN, for accuracy studies: the baselines the KVarN record
// is compared against (docs/ACCURACY.md). Host-only, fp32 in and out, quantize-then-reconstruct.
//
// Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/status.h"
#include "kvarn/kvarn.h"
#include "kvarn/kvarn_experimental.h"  // kvarn_baseline_t

namespace kvarn {

// Checks the arguments, then writes the reconstruction of every row of `in` ([rows][cols]) to
// `out` (which may alias `in`). Nothing is written unless every input is finite.
Status BaselineRoundtrip(kvarn_baseline_t method, int32_t bits, size_t rows, int32_t cols,
                         const float* in, float* out);

// One row of asymmetric min/max round-to-nearest at `bits` bits, with the fp16 scale and zero a
// kernel would store: zero = fp16(min), scale = fp16((max - zero) / (2^bits - 1)), codes
// clamp(rint((x - zero) / scale)) (round half even), reconstruction code * scale + zero.
void PerTokenRtnRow(const float* in, int32_t cols, int32_t bits, float* out);

// One row of fp8 e4m3 (OCP FN: bias 7, max 448, subnormals, no infinities) with a per-row
// fp16 scale fp16(absmax / 448): x / scale rounded to nearest even e4m3, saturating at 448.
void Fp8E4m3Row(const float* in, int32_t cols, float* out);

// Rounds x to the nearest fp8 e4m3 value (ties to even), saturating at +-448.
float RoundToE4m3(float x);

}  // namespace kvarn
