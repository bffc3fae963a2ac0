# GPU suites: built in every configuration (they use only the public API), run on a machine with
# a CUDA device, and skipped cleanly (GTEST_SKIP, reported by CTest as skipped) elsewhere.
# Label "gpu". The CPU scalar reference is the oracle.
foreach(_gpu_suite cuda_codec cuda_attention cuda_cache cuda_multicontext cuda_tail_state)
  if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/test_${_gpu_suite}.cpp)
    kvarn_add_gtest(kvarn_test_${_gpu_suite}
      SOURCES test_${_gpu_suite}.cpp
      LABELS gpu)
    if(KVARN_ENABLE_HIP)  # the same suites against the ROCm backend (support/gpu_test.h)
      target_compile_definitions(kvarn_test_${_gpu_suite} PRIVATE KVT_GPU_BACKEND_ROCM=1)
    endif()
  endif()
endforeach()

# The decode step captured in a CUDA graph: needs the CUDA runtime for streams and graphs, so it
# is built with the CUDA backend only.
if(KVARN_ENABLE_CUDA AND TARGET CUDA::cudart_static)
  kvarn_add_gtest(kvarn_test_cuda_graph
    SOURCES test_cuda_graph.cpp
    LABELS gpu)
  target_link_libraries(kvarn_test_cuda_graph PRIVATE CUDA::cudart_static)
endif()
