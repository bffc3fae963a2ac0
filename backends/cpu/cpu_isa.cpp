#include "backends/cpu/cpu_isa.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "backends/cpu/kernels.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#define KVARN_X86 1
#endif

namespace kvarn {
namespace cpu {
namespace {

struct Features {
  bool sse42 = false, avx = false, avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool neon = false;
};

#ifdef KVARN_X86
uint64_t Xgetbv0() {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}
#endif

Features Detect() {
  Features f;
#ifdef KVARN_X86
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  f.sse42 = c & (1u << 20);
  f.fma = c & (1u << 12);
  f.f16c = c & (1u << 29);
  const bool osxsave = c & (1u << 27);
  const bool avx_hw = c & (1u << 28);
  // The OS must save the YMM (and for AVX-512 the opmask/ZMM) state: XCR0 bits 1-2 and 5-7.
  const uint64_t xcr0 = osxsave ? Xgetbv0() : 0;
  const bool ymm_os = (xcr0 & 0x6) == 0x6;
  const bool zmm_os = (xcr0 & 0xe6) == 0xe6;
  f.avx = avx_hw && ymm_os;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    f.avx2 = f.avx && (b & (1u << 5));
    f.avx512f = zmm_os && (b & (1u << 16));
    f.avx512dq = zmm_os && (b & (1u << 17));
    f.avx512bw = zmm_os && (b & (1u << 30));
    f.avx512vl = zmm_os && (b & (1u << 31));
  }
  if (!ymm_os) f.fma = f.f16c = false;
#elif defined(__aarch64__)
  f.neon = true;  // mandatory in AArch64
#endif
  return f;
}

const Features& GetFeatures() {
  static const Features f = Detect();
  return f;
}

kvarn_cpu_isa_t ParseIsaEnv() {
  const char* s = std::getenv("KVARN_CPU_ISA");
  if (s == nullptr) return KVARN_CPU_ISA_NONE;  // no cap
  if (!std::strcmp(s, "scalar")) return KVARN_CPU_ISA_SCALAR;
  if (!std::strcmp(s, "avx2")) return KVARN_CPU_ISA_AVX2;
  if (!std::strcmp(s, "avx512")) return KVARN_CPU_ISA_AVX512;
  if (!std::strcmp(s, "neon")) return KVARN_CPU_ISA_NEON;
  return KVARN_CPU_ISA_NONE;
}

// KVARN_CPU_ISA_NONE here means "no cap".
std::atomic<int>& Cap() {
  static std::atomic<int> cap{static_cast<int>(ParseIsaEnv())};
  return cap;
}

// Preference order, best first.
const kvarn_cpu_isa_t kOrder[] = {KVARN_CPU_ISA_AVX512, KVARN_CPU_ISA_AVX2, KVARN_CPU_ISA_NEON,
                                  KVARN_CPU_ISA_SCALAR};

// Whether a context capped at `cap` may run `isa`: scalar always, AVX2 under an AVX-512 cap,
// otherwise only the cap itself (an Arm cap never admits an x86 ISA, and the reverse).
bool WithinCap(kvarn_cpu_isa_t isa, int cap) {
  return cap == KVARN_CPU_ISA_NONE || isa == KVARN_CPU_ISA_SCALAR || isa == cap ||
         (cap == KVARN_CPU_ISA_AVX512 && isa == KVARN_CPU_ISA_AVX2);
}

// The best ISA that is built, supported by this CPU and within the cap.
kvarn_cpu_isa_t BestWithin(int cap) {
  for (kvarn_cpu_isa_t isa : kOrder) {
    if (IsaBuilt(isa) && CpuHasIsa(isa) && WithinCap(isa, cap)) return isa;
  }
  return KVARN_CPU_ISA_SCALAR;
}

}  // namespace

bool CpuHasIsa(kvarn_cpu_isa_t isa) {
  const Features& f = GetFeatures();
  switch (isa) {
    case KVARN_CPU_ISA_SCALAR:
      return true;
    case KVARN_CPU_ISA_AVX2:
      return f.avx2 && f.fma && f.f16c;
    case KVARN_CPU_ISA_AVX512:
      return f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq;
    case KVARN_CPU_ISA_NEON:
      return f.neon;
    default:
      return false;
  }
}

std::string CpuFeatureString() {
  const Features& f = GetFeatures();
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(f.sse42, "sse4.2");
  add(f.avx, "avx");
  add(f.avx2, "avx2");
  add(f.fma, "fma");
  add(f.f16c, "f16c");
  add(f.avx512f, "avx512f");
  add(f.avx512bw, "avx512bw");
  add(f.avx512vl, "avx512vl");
  add(f.avx512dq, "avx512dq");
  add(f.neon, "neon");
  return s;
}

// Scalar always; a SIMD level when simd.cmake compiled its kernels into this build.
bool IsaBuilt(kvarn_cpu_isa_t isa) {
  if (isa == KVARN_CPU_ISA_SCALAR) return true;
  return &KernelsFor(isa) != &ScalarKernels();
}

kvarn_cpu_isa_t BestIsa() { return BestWithin(KVARN_CPU_ISA_NONE); }

kvarn_cpu_isa_t SelectIsa() { return BestWithin(Cap().load()); }

Status SetMaxIsa(kvarn_cpu_isa_t isa) {
  if (isa != KVARN_CPU_ISA_SCALAR && isa != KVARN_CPU_ISA_AVX2 && isa != KVARN_CPU_ISA_AVX512 &&
      isa != KVARN_CPU_ISA_NEON) {
    return InvalidArgument("unknown CPU ISA value " + std::to_string(static_cast<int>(isa)));
  }
  Cap().store(static_cast<int>(isa));
  return Status::Ok();
}

const char* IsaName(kvarn_cpu_isa_t isa) {
  switch (isa) {
    case KVARN_CPU_ISA_SCALAR:
      return "scalar";
    case KVARN_CPU_ISA_AVX2:
      return "avx2";
    case KVARN_CPU_ISA_AVX512:
      return "avx512";
    case KVARN_CPU_ISA_NEON:
      return "neon";
    case KVARN_CPU_ISA_NONE:
      return "none";
    default:
      return "unknown";
  }
}

}  // namespace cpu
}  // namespace kvarn
