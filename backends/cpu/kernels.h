// The CPU backend's inner loops as a table per ISA level: the scalar reference (always built) and
// the SIMD levels (backends/cpu/simd/, each compiled with its own ISA flags by simd.cmake). The
// operations' skeletons (normalize.cpp, record_codec.cpp, codec_ops.cpp, paged_attention.cpp) are
// written once and call these entries, so every ISA runs the same algorithm; the quantization
// entries give bit-identical results at every level (docs/FORMAT.md, "Numerics").
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvarn/kvarn.h"

namespace kvarn {
namespace cpu {

// One (query token, query head) of an attention work item, in the rotated frame.
struct AttnQuery {
  const float* q;  // [D] rotated query (fp32)
  int lo;          // first key of the current tile it sees (> 0 under a sliding window)
  int n_valid;     // keys of the current tile it sees are [lo, n_valid); n_valid <= lo: none
  float* m;        // running max of the scaled scores
  float* l;        // running softmax denominator
  float* acc;      // [D] running numerator
};

// How scores are formed: s = scale * q.k, then c * tanh(s / c) when softcap c > 0.
struct ScoreParams {
  float scale;
  float softcap;
};

// A record of the tile being visited, decoded to fp32 scales (codes stay packed).
struct RecordView {
  const uint8_t* k_codes;  // D rows x G codes of key_bits, packed (docs/FORMAT.md section 7)
  const uint8_t* v_codes;  // G rows x D codes of value_bits, packed
  const float* ka;         // [D]
  const float* kz;         // [D]
  const float* kc;         // [G]
  const float* vc;         // [D]
  const float* va;         // [G]
  const float* vz;         // [G]
};

struct Kernels {
  kvarn_cpu_isa_t isa;

  // ---- normalization (docs/FORMAT.md section 4; fixed numerics of docs/FORMAT.md) ----
  // Unbiased deviations of the columns [C] and rows [R] of X (R x C, row-major).
  void (*stats)(const float* X, int R, int C, float* col_std, float* row_std);
  // Y = M / ec (per column); row_std = row deviations of Y / er (per row).
  void (*column_pass)(const float* M, int R, int C, const float* ec, const float* er, float* Y,
                      float* row_std);
  // X = Y / er (per row); col_std and row_std of X.
  void (*row_pass)(const float* Y, int R, int C, const float* er, float* X, float* col_std,
                   float* row_std);
  // B = (M / s_c) / s_r, then round-to-nearest per row (section 5): codes [R*C] unpacked,
  // lo [R], step [R].
  void (*balance_rtn)(const float* M, int R, int C, const float* s_c, const float* s_r, int bits,
                      float* B, uint8_t* codes, float* lo, float* step);
  // Packs R rows of C codes (section 7).
  void (*pack_rows)(const uint8_t* codes, int R, int C, int bits, uint8_t* out);
  // Reconstructs a record in the cache frame (section 6), k, v: G x D fp32 token-major (either
  // may be NULL), with the reference's operation order: (code * a + z) * c.
  void (*dequantize_record)(const RecordView& rec, int D, int G, int key_bits, int value_bits,
                            float* k, float* v);

  // ---- conversions and rotation (section 3) ----
  // x <- x H / sqrt(n), the same butterflies as the scalar reference.
  void (*hadamard)(float* x, int n);
  // fp16 tile (G x D, token-major) -> fp32 M: transposed (D x G) when `transpose`. Returns false
  // (M partly written) when the tile holds an inf or NaN.
  bool (*load_tile)(const uint16_t* tile, int G, int D, bool transpose, float* M);
  // n fp16 values (little-endian, any alignment) -> fp32; n a multiple of 16.
  void (*halves_to_floats)(const uint8_t* in, int n, float* out);
  // n fp32 values -> fp16 (round to nearest even, overflow to inf); n a multiple of 16.
  void (*floats_to_halves)(const float* in, int n, uint16_t* out);
  // Rotates (when `rotate`) and rounds one row of D floats to fp16. Returns false if a value is
  // not finite or does not fit fp16. `in` is not modified; scratch holds D floats.
  bool (*to_cache_frame)(const float* in, int D, bool rotate, float* scratch, uint16_t* out);

  // ---- attention (section 9) ----
  // Adds one record tile to `nq` queries' online-softmax states. scores: scratch of (nq + 4) * G
  // floats; vsum: scratch of (nq + 4) * D floats (kernels may work on groups of 4 queries).
  void (*attend_record)(const RecordView& rec, int D, int G, int key_bits, int value_bits,
                        const ScoreParams& sp, AttnQuery* qs, int nq, float* scores, float* vsum);
  // The same for an fp16 page tile of one KV head: k, v: G x D fp16 (token-major).
  void (*attend_page)(const uint16_t* k, const uint16_t* v, int D, int G, const ScoreParams& sp,
                      AttnQuery* qs, int nq, float* scores);
};

// The scalar reference's table.
const Kernels& ScalarKernels();
// The table of an ISA level; the scalar table for scalar and for levels not built.
const Kernels& KernelsFor(kvarn_cpu_isa_t isa);

// Per-ISA tables, defined in backends/cpu/simd/ when built (see simd.cmake).
const Kernels* Avx2Kernels();
const Kernels* Avx512Kernels();
const Kernels* NeonKernels();

}  // namespace cpu
}  // namespace kvarn
