// The scalar reference's kernel table and the selection of a table by ISA level.
#include "backends/cpu/kernels.h"

#include "backends/cpu/cpu_kernels.h"
#include "backends/cpu/hadamard.h"
#include "backends/cpu/normalize.h"
#include "backends/cpu/record_codec.h"
#include "backends/cpu/rtn_pack.h"
#include "core/half.h"

namespace kvarn {
namespace cpu {
namespace {

void ScalarFloatsToHalves(const float* in, int n, uint16_t* out) {
  for (int i = 0; i < n; ++i) out[i] = float_to_half(in[i]);
}

bool ScalarLoadTile(const uint16_t* tile, int G, int D, bool transpose, float* M) {
  const size_t n = static_cast<size_t>(G) * D;
  for (size_t e = 0; e < n; ++e) {
    if ((tile[e] & 0x7c00u) == 0x7c00u) return false;
  }
  for (int t = 0; t < G; ++t) {
    for (int d = 0; d < D; ++d) {
      const float x = half_to_float(tile[static_cast<size_t>(t) * D + d]);
      M[transpose ? static_cast<size_t>(d) * G + t : static_cast<size_t>(t) * D + d] = x;
    }
  }
  return true;
}

const Kernels kScalar = {
    KVARN_CPU_ISA_SCALAR,    // isa
    ScalarStats,             // stats
    ScalarColumnPass,        // column_pass
    ScalarRowPass,           // row_pass
    ScalarBalanceRtn,        // balance_rtn
    PackRows,                // pack_rows
    ScalarDequantizeRecord,  // dequantize_record
    HadamardInPlace,         // hadamard
    ScalarLoadTile,          // load_tile
    ScalarHalvesToFloats,    // halves_to_floats
    ScalarFloatsToHalves,    // floats_to_halves
    ToCacheFrame,            // to_cache_frame
    ScalarAttendRecord,      // attend_record
    ScalarAttendPage,        // attend_page
};

}  // namespace

const Kernels& ScalarKernels() { return kScalar; }

const Kernels& KernelsFor(kvarn_cpu_isa_t isa) {
  const Kernels* k = nullptr;
  switch (isa) {
    case KVARN_CPU_ISA_AVX2:
      k = Avx2Kernels();
      break;
    case KVARN_CPU_ISA_AVX512:
      k = Avx512Kernels();
      break;
    case KVARN_CPU_ISA_NEON:
      k = NeonKernels();
      break;
    default:
      break;
  }
  return k ? *k : kScalar;
}

// Levels not compiled into this build (simd.cmake defines KVARN_CPU_BUILD_<ISA> for each level it
// adds) have no table.
#ifndef KVARN_CPU_BUILD_AVX2
const Kernels* Avx2Kernels() { return nullptr; }
#endif
#ifndef KVARN_CPU_BUILD_AVX512
const Kernels* Avx512Kernels() { return nullptr; }
#endif
#ifndef KVARN_CPU_BUILD_NEON
const Kernels* NeonKernels() { return nullptr; }
#endif

}  // namespace cpu
}  // namespace kvarn
