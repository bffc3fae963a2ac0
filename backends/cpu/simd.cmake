# CPU SIMD kernels (issue "CPU SIMD backend"), included by the top-level CMakeLists.txt after the
# targets kvarn and kvarn_internal exist. Each ISA level is one translation unit compiled with its
# own flags and selected at run time (backends/cpu/cpu_isa.cpp); the library is never built with
# -march=native. KVARN_CPU_BUILD_<ISA> tells backends/cpu/kernels.cpp which tables exist.
#
# Every backends/cpu source is compiled with -ffp-contract=off: the fixed numerics of the record
# (docs/FORMAT.md, "Numerics") need each multiply and add rounded on its own at every ISA level,
# so the compiler may not fuse them (FMA is only used where written explicitly, in attention).

option(KVARN_CPU_SIMD "Build the CPU SIMD kernels (AVX2, AVX-512 on x86-64; NEON on aarch64)" ON)

file(GLOB _kvarn_cpu_all CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/*.cpp)
set(_kvarn_cpu_simd_sources)
set(_kvarn_cpu_simd_defs)

if(KVARN_CPU_SIMD AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$"
     AND EXISTS ${CMAKE_CURRENT_LIST_DIR}/simd/kernels_avx512.cpp)
    set(_avx2 ${CMAKE_CURRENT_LIST_DIR}/simd/kernels_avx2.cpp)
    set(_avx512 ${CMAKE_CURRENT_LIST_DIR}/simd/kernels_avx512.cpp)
    set_source_files_properties(${_avx2} PROPERTIES COMPILE_OPTIONS "-mavx2;-mfma;-mf16c")
    set_source_files_properties(${_avx512} PROPERTIES COMPILE_OPTIONS
      "-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx2;-mfma;-mf16c")
    if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
      # GCC 12 reports its own _mm512_undefined_* placeholders inside the AVX-512 intrinsics as
      # "maybe uninitialized" (a false positive that -Werror would turn into a build failure).
      set_property(SOURCE ${_avx512} APPEND PROPERTY COMPILE_OPTIONS -Wno-maybe-uninitialized)
    endif()
    list(APPEND _kvarn_cpu_simd_sources ${_avx2} ${_avx512})
    list(APPEND _kvarn_cpu_simd_defs KVARN_CPU_BUILD_AVX2 KVARN_CPU_BUILD_AVX512)
  elseif(CMAKE_SYSTEM_PROCESSOR MATCHES "^(aarch64|arm64|ARM64)$"
         AND EXISTS ${CMAKE_CURRENT_LIST_DIR}/simd/kernels_neon.cpp)
    # NEON (Advanced SIMD) is part of the AArch64 baseline: no extra flags.
    list(APPEND _kvarn_cpu_simd_sources ${CMAKE_CURRENT_LIST_DIR}/simd/kernels_neon.cpp)
    list(APPEND _kvarn_cpu_simd_defs KVARN_CPU_BUILD_NEON)
  endif()
endif()

set_property(SOURCE ${_kvarn_cpu_all} ${_kvarn_cpu_simd_sources} APPEND PROPERTY COMPILE_OPTIONS
  -ffp-contract=off)
foreach(_t kvarn kvarn_internal)
  if(TARGET ${_t})
    target_sources(${_t} PRIVATE ${_kvarn_cpu_simd_sources})
    target_compile_definitions(${_t} PRIVATE ${_kvarn_cpu_simd_defs})
  endif()
endforeach()
