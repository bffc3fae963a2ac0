// The indptr rule of the run calls (kvarn.h "plan / run"; the CPU backend's IndptrFaults):
// sequence b owns rows [indptr[b], indptr[b+1]); a boundary is bad when indptr[0] != 0, when it
// lies outside [0, limit], or when it is below an earlier boundary or above a later one, and a
// sequence faults when one of its boundaries is bad. The sequences left own disjoint rows, so
// the row-parallel kernels after this one (whose owner search assumes sorted boundaries around
// them) can neither write one row twice nor give a sequence another's rows. One block: the
// boundaries are split into kThreads chunks, the chunks' maxima and minima scanned, then each
// thread walks its chunk forward (against the maximum before it) and backward (the minimum after).
#include <climits>

#include "backends/gpu/gpu_common.cuh"

namespace kvarn {
namespace gpu {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ void ReportBoundary(int32_t* seq_status, DeviceErrorWords* errors,
                                               int batch, int j, int32_t which) {
  // Boundary j closes sequence j - 1 and opens sequence j.
  if (j >= 1) {
    ReportSequenceError(seq_status, errors, j - 1, KVARN_ERR_INVALID_ARGUMENT, kErrIndptr, j - 1,
                        which);
  }
  if (j < batch) {
    ReportSequenceError(seq_status, errors, j, KVARN_ERR_INVALID_ARGUMENT, kErrIndptr, j, which);
  }
}

__global__ void __launch_bounds__(kThreads)
    IndptrCheckKernel(const int32_t* indptr, int batch, int64_t limit, int32_t* seq_status,
                      DeviceErrorWords* errors, int32_t which) {
  __shared__ int32_t before_s[kThreads], after_s[kThreads];
  const int n = batch + 1, t = threadIdx.x;
  const int per = (n + kThreads - 1) / kThreads;
  const int j0 = min(n, t * per), j1 = min(n, j0 + per);
  int32_t mx = INT_MIN, mn = INT_MAX;
  for (int j = j0; j < j1; ++j) {
    mx = max(mx, indptr[j]);
    mn = min(mn, indptr[j]);
  }
  before_s[t] = mx;
  after_s[t] = mn;
  __syncthreads();
  // Exclusive scans over the chunks: the largest boundary left of chunk c, the smallest right.
  if (t == 0) {
    int32_t run = INT_MIN;
    for (int c = 0; c < kThreads; ++c) {
      const int32_t x = before_s[c];
      before_s[c] = run;
      run = max(run, x);
    }
  } else if (t == 1) {
    int32_t run = INT_MAX;
    for (int c = kThreads - 1; c >= 0; --c) {
      const int32_t x = after_s[c];
      after_s[c] = run;
      run = min(run, x);
    }
  }
  __syncthreads();
  int32_t before = before_s[t];
  for (int j = j0; j < j1; ++j) {
    const int32_t x = indptr[j];
    if (x < 0 || x > limit || (j == 0 && x != 0) || x < before) {
      ReportBoundary(seq_status, errors, batch, j, which);
    }
    before = max(before, x);
  }
  int32_t after = after_s[t];
  for (int j = j1 - 1; j >= j0; --j) {
    const int32_t x = indptr[j];
    if (x > after) ReportBoundary(seq_status, errors, batch, j, which);
    after = min(after, x);
  }
}

}  // namespace

Status CheckIndptr(CudaState* s, const int32_t* indptr, int batch, int64_t limit,
                   int32_t* seq_status, IndptrKind which) {
  IndptrCheckKernel<<<1, kThreads, 0, s->stream>>>(indptr, batch, limit, seq_status, s->errors,
                                                   static_cast<int32_t>(which));
  return CheckLaunch("IndptrCheckKernel");
}

}  // namespace gpu
}  // namespace kvarn
