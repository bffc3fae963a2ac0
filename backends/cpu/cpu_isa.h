// CPU feature detection and the ISA cap (oneDNN-style "max CPU ISA").
#pragma once

#include <string>

#include "core/status.h"
#include "kvarn/kvarn.h"

namespace kvarn {
namespace cpu {

// What the processor supports (CPUID + XGETBV on x86-64, NEON on aarch64).
bool CpuHasIsa(kvarn_cpu_isa_t isa);
// Space-separated feature names detected on this CPU.
std::string CpuFeatureString();
// Whether kernels for this ISA are compiled into this build (scalar always is).
bool IsaBuilt(kvarn_cpu_isa_t isa);
// The best ISA that is both built and supported, before the cap.
kvarn_cpu_isa_t BestIsa();
// The ISA new CPU contexts use: BestIsa() limited by the cap (KVARN_CPU_ISA env or API).
kvarn_cpu_isa_t SelectIsa();
Status SetMaxIsa(kvarn_cpu_isa_t isa);
const char* IsaName(kvarn_cpu_isa_t isa);

}  // namespace cpu
}  // namespace kvarn
