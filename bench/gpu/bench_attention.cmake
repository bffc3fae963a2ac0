# GPU attention benchmark (CUDA events over the public API); built with the CUDA backend.
add_executable(bench_cuda_attention ${CMAKE_CURRENT_LIST_DIR}/bench_cuda_attention.cu)
target_link_libraries(bench_cuda_attention PRIVATE kvarn::kvarn CUDA::cudart)
# core/half.h: the library's one fp16 rounding, for the synthetic pages.
target_include_directories(bench_cuda_attention PRIVATE ${PROJECT_SOURCE_DIR})
set_target_properties(bench_cuda_attention PROPERTIES CUDA_STANDARD 17)

# A whole decode step (append, flush, attention per layer), eager against a CUDA graph replay.
add_executable(bench_decode_step ${CMAKE_CURRENT_LIST_DIR}/bench_decode_step.cu)
target_link_libraries(bench_decode_step PRIVATE kvarn::kvarn CUDA::cudart)
target_include_directories(bench_decode_step PRIVATE ${PROJECT_SOURCE_DIR})
set_target_properties(bench_decode_step PROPERTIES CUDA_STANDARD 17)
