# The capturable layer 2 (plan / run) on the CPU and, where a device exists, the GPU backend.
kvarn_add_gtest(kvarn_test_paged_run
  SOURCES test_paged_run.cpp
  LABELS "attention;gpu")
if(KVARN_ENABLE_HIP AND TARGET kvarn_test_paged_run)
  target_compile_definitions(kvarn_test_paged_run PRIVATE KVT_GPU_BACKEND_ROCM=1)
endif()

# What an engine must reserve per request (blocks + tail state): the table of README.md.
kvarn_add_gtest(kvarn_test_engine_budget
  SOURCES test_engine_budget.cpp
  LABELS api)

# The per-request tail state (kvarn_experimental.h): one block pool + tail slots, CPU.
kvarn_add_gtest(kvarn_test_tail_state
  SOURCES test_tail_state.cpp
  LABELS "attention;gpu")
