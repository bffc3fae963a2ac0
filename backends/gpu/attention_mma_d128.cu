// The tensor-core decode family at head dim 128 (attention_mma_family.cuh); one translation unit
// per head dim so the family's kernels compile in parallel.
#include "backends/gpu/gpu_runtime.h"

#if KVARN_GPU_HAS_MMA
#include "backends/gpu/attention_mma_family.cuh"

namespace kvarn {
namespace gpu {
namespace mma {

template bool FamilyHas<128>(int, int, int, bool, FamilyInfo*);
template int FamilyCtasPerSm<128>(int, int, int, int, bool);
template Status FamilyLaunch<128>(CudaState*, int, int, int, bool, const AttnParams&, dim3);

}  // namespace mma
}  // namespace gpu
}  // namespace kvarn
#endif  // KVARN_GPU_HAS_MMA
