// Definitions of the decode family's host entry points (attention_mma_family.h), included by the
// attention_mma_d<D>.cu translation units, each of which instantiates them for its head dim.
#pragma once

#include <string>

#include "backends/gpu/attention_common.cuh"
#include "backends/gpu/attention_mma.cuh"
#include "backends/gpu/attention_mma_family.h"

namespace kvarn {
namespace gpu {
namespace mma {

template <int D>
bool FamilyHas(int G, int key_bits, int value_bits, bool narrow, FamilyInfo* info) {
  auto fill = [&](auto s) {
    using S = decltype(s);
    info->record_bytes = S::kRecordBytes;
    info->groups = S::kGroups;
  };
  return WithTileTokens<D>(G, key_bits, value_bits, narrow, fill);
}

template <class S>
int PrepareMma(int device) {
  return PrepareKernel<MmaAttentionKernel<S>, sizeof(MmaSmem<S>), S::kThreads>(device);
}

template <int D>
int FamilyCtasPerSm(int device, int G, int key_bits, int value_bits, bool narrow) {
  int n = 0;
  auto prepare = [&](auto s) { n = PrepareMma<decltype(s)>(device); };
  WithTileTokens<D>(G, key_bits, value_bits, narrow, prepare);
  return n;
}

template <int D>
Status FamilyLaunch(CudaState* st, int G, int key_bits, int value_bits, bool narrow,
                    const AttnParams& P, dim3 grid) {
  Status status = {KVARN_ERR_INTERNAL, "no tensor-core attention kernel for this shape"};
  auto launch = [&](auto s) {
    using S = decltype(s);
    const size_t smem = sizeof(MmaSmem<S>);
    if (PrepareMma<S>(st->device) == 0) {
      status = {KVARN_ERR_DEVICE, "the tensor-core attention kernel cannot run on this device (" +
                                      std::to_string(smem) + " bytes of shared memory per CTA)"};
      return;
    }
    MmaAttentionKernel<S><<<grid, S::kThreads, smem, st->stream>>>(P);
    status = CheckLaunch("MmaAttentionKernel");
  };
  WithTileTokens<D>(G, key_bits, value_bits, narrow, launch);
  return status;
}

}  // namespace mma
}  // namespace gpu
}  // namespace kvarn
