// The tensor-core decode family's host entry points, one explicit instantiation per head dim
// (attention_mma_d64.cu ... attention_mma_d512.cu: four translation units that compile in
// parallel), declared here for attention_kernels.cu, which plans and dispatches.
#pragma once

#include "backends/gpu/gpu_common.cuh"

namespace kvarn {
namespace gpu {

struct AttnParams;

namespace mma {

// What planning needs of a member of the family.
struct FamilyInfo {
  int record_bytes = 0;  // the record this member reads (equals the config's)
  int groups = 1;        // records a CTA consumes at once
};

// Whether the family has (D, G, key bits, value bits) in the default or the narrow layout
// (KVARN_CUDA_SLICE=64), and what planning needs of it.
template <int D>
bool FamilyHas(int G, int key_bits, int value_bits, bool narrow, FamilyInfo* info);
// Its resident CTAs per SM on `device` (0: it cannot run there); raises its shared-memory limit
// once per device.
template <int D>
int FamilyCtasPerSm(int device, int G, int key_bits, int value_bits, bool narrow);
// Launches it on st's stream over `grid` (P.bulk_ring chosen by the caller).
template <int D>
Status FamilyLaunch(CudaState* st, int G, int key_bits, int value_bits, bool narrow,
                    const AttnParams& P, dim3 grid);

}  // namespace mma
}  // namespace gpu
}  // namespace kvarn
