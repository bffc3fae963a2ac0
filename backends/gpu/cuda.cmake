# The CUDA backend: kernels in backends/gpu/*.cu, added to both library targets.
# Included from the top-level CMakeLists.txt when KVARN_ENABLE_CUDA is ON.
file(GLOB KVARN_CUDA_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/*.cu)
foreach(_t kvarn kvarn_internal)
  target_sources(${_t} PRIVATE ${KVARN_CUDA_SOURCES})
  target_compile_definitions(${_t} PRIVATE KVARN_WITH_CUDA=1)
  # The static runtime keeps libkvarn.so free of a libcudart.so dependency of a given version.
  target_link_libraries(${_t} PRIVATE CUDA::cudart_static)
  set_target_properties(${_t} PROPERTIES CUDA_SEPARABLE_COMPILATION OFF CUDA_STANDARD 17
                                         CUDA_STANDARD_REQUIRED ON)
endforeach()
target_compile_options(kvarn PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-fvisibility=hidden --expt-relaxed-constexpr -lineinfo>)
target_compile_options(kvarn_internal PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo>)
