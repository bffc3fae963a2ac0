# The ROCm backend: the same kernels as the CUDA backend (backends/gpu/*.cu), compiled as HIP by
# clang (-x hip, one device pass per --offload-arch) and linked against libamdhip64. Included from
# the top-level CMakeLists.txt when KVARN_ENABLE_HIP is ON.
#
# CMake's HIP language wants an AMD-layout ROCm (hip-lang-config, /opt/rocm); Debian 12 ships
# ROCm 5.2 split over /usr (hipcc, libamdhip64-dev, rocm-device-libs, clang-15). So the .cu files
# are compiled as CXX sources of the library targets with the HIP flags, which needs clang as the
# C++ compiler (preset `hip`: clang++-15, the compiler Debian's hipcc drives).
set(KVARN_HIP_ARCHITECTURES "gfx90a;gfx1030" CACHE STRING
    "AMD GPU targets of the HIP build (--offload-arch), e.g. gfx90a (CDNA2, wave64) gfx1030 (RDNA2, wave32)")
set(KVARN_ROCM_PATH "/usr" CACHE PATH "ROCm root (Debian/Ubuntu packages: /usr; AMD packages: /opt/rocm)")
set(KVARN_ROCM_DEVICE_LIB_PATH "" CACHE PATH
    "ROCm device bitcode (ocml.bc, ...); empty = search under KVARN_ROCM_PATH")

if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "KVARN_ENABLE_HIP compiles the kernels with clang -x hip: configure with "
                      "CMAKE_CXX_COMPILER=clang++ (the clang of the ROCm install; preset 'hip' uses clang++-15)")
endif()
if(NOT KVARN_ROCM_DEVICE_LIB_PATH)
  find_path(_kvarn_rocm_bitcode ocml.bc
    PATHS ${KVARN_ROCM_PATH}/lib/${CMAKE_LIBRARY_ARCHITECTURE}/amdgcn/bitcode
          ${KVARN_ROCM_PATH}/amdgcn/bitcode ${KVARN_ROCM_PATH}/lib/amdgcn/bitcode
    NO_DEFAULT_PATH)
  if(NOT _kvarn_rocm_bitcode)
    message(FATAL_ERROR "ROCm device libraries (ocml.bc) not found under ${KVARN_ROCM_PATH}; "
                        "install rocm-device-libs or set KVARN_ROCM_DEVICE_LIB_PATH")
  endif()
  set(KVARN_ROCM_DEVICE_LIB_PATH ${_kvarn_rocm_bitcode})
endif()
find_library(KVARN_AMDHIP64 amdhip64 HINTS ${KVARN_ROCM_PATH}/lib REQUIRED)
find_path(KVARN_HIP_INCLUDE hip/hip_runtime.h HINTS ${KVARN_ROCM_PATH}/include REQUIRED)
message(STATUS "kvarn: HIP kernels for ${KVARN_HIP_ARCHITECTURES} (ROCm ${KVARN_ROCM_PATH}, "
               "device libs ${KVARN_ROCM_DEVICE_LIB_PATH}, ${KVARN_AMDHIP64})")

set(_kvarn_hip_flags -x hip --rocm-path=${KVARN_ROCM_PATH}
    --rocm-device-lib-path=${KVARN_ROCM_DEVICE_LIB_PATH} -D__HIP_PLATFORM_AMD__=1
    # hipError_t is [[nodiscard]] in ROCm; the kernels ignore it where CUDA's is ignored too
    # (cleanup paths, clearing a sticky error).
    -Wno-unused-result
    # The device passes see the host-only backend functions (the table is host-only) as unused.
    -Xarch_device -Wno-unused-function)
foreach(_arch IN LISTS KVARN_HIP_ARCHITECTURES)
  list(APPEND _kvarn_hip_flags --offload-arch=${_arch})
endforeach()

file(GLOB KVARN_HIP_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/*.cu)
set_source_files_properties(${KVARN_HIP_SOURCES} PROPERTIES
  LANGUAGE CXX COMPILE_OPTIONS "${_kvarn_hip_flags}")
foreach(_t kvarn kvarn_internal)
  target_sources(${_t} PRIVATE ${KVARN_HIP_SOURCES})
  target_compile_definitions(${_t} PRIVATE KVARN_WITH_HIP=1)
  target_link_libraries(${_t} PRIVATE ${KVARN_AMDHIP64})
endforeach()
