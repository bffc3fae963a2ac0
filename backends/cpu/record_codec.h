// One tile <-> one record, in the cache frame (docs/FORMAT.md sections 4-7). The scalar reference
// every other backend is compared with.
#pragma once

#include <cstdint>
#include <vector>

#include "backends/cpu/kernels.h"
#include "core/config.h"
#include "core/status.h"

namespace kvarn {
namespace cpu {

// Per-thread scratch so repeated calls do not allocate.
struct TileScratch {
  std::vector<float> M, V, X, B, s_r, s_c, lo, step;
  std::vector<uint8_t> codes;
};

// Quantizes one matrix M (R x C) with optional normalization: codes [R*C] (unpacked), absorbed
// fp16 row scale a [R], row zero z [R] and column scale c [C]. Fails (writing only scratch) with
// KVARN_ERR_OVERFLOW when an absorbed value does not fit fp16.
// The passes run on `k` (the scalar reference when NULL); every ISA writes the same bytes.
Status QuantizeMatrix(const float* M, int R, int C, int bits, bool normalize, int iterations,
                      TileScratch& s, uint8_t* codes, uint16_t* a, uint16_t* z, uint16_t* c,
                      const Kernels* k = nullptr);

// k_tile, v_tile: G x D fp16 (token-major) in the cache frame. Writes cfg.record_bytes() bytes.
// Non-finite inputs give KVARN_ERR_NON_FINITE. On failure `record` may hold partial bytes: the
// callers write into scratch and copy out only when every tile succeeded.
Status QuantizeRecord(const Config& cfg, const uint16_t* k_tile, const uint16_t* v_tile,
                      uint8_t* record, TileScratch& s, const Kernels* k = nullptr);

// Reconstructs the tile in the cache frame: k, v: G x D fp32 (token-major); either may be NULL.
// Runs on `kernels` (the scalar reference when NULL); every ISA gives the same bits.
void DequantizeRecord(const Config& cfg, const uint8_t* record, float* k, float* v,
                      const Kernels* kernels = nullptr);

// The record's six fp16 scale vectors decoded into `f` (6 vectors: ka kz vc [D], kc va vz [G])
// and pointers to its packed code fields.
RecordView ViewRecord(const Config& cfg, const uint8_t* rec, std::vector<float>& f,
                      const Kernels* kernels = nullptr);

// The scalar reference of the Kernels entry halves_to_floats.
void ScalarHalvesToFloats(const uint8_t* in, int n, float* out);

// The scalar reference of the Kernels entry dequantize_record:
// K'[t,d] = (code[d,t] a_d + z_d) c_t, V'[t,d] = (code[t,d] a'_t + z'_t) c'_d (section 6).
void ScalarDequantizeRecord(const RecordView& rec, int D, int G, int key_bits, int value_bits,
                            float* k, float* v);

}  // namespace cpu
}  // namespace kvarn
