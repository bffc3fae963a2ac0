# Issue 15 (reliability): regression tests of the defects found by fuzzing and fault injection,
# and the fault-injection test (an interposed operator new fails every allocation in turn).
kvarn_add_gtest(test_reliability SOURCES test_reliability.cpp LABELS reliability)
kvarn_add_gtest(test_fault_injection SOURCES test_fault_injection.cpp LABELS reliability)
# Issue 28: per-sequence isolation of the plan/run calls, CPU and GPU (the GPU instances skip
# without a device): the regression tests and the fault-isolation suite (support/run_isolation.h).
kvarn_add_gtest(test_run_isolation SOURCES test_run_isolation.cpp LABELS "reliability;gpu")
if(KVARN_ENABLE_HIP)
  target_compile_definitions(test_run_isolation PRIVATE KVT_GPU_BACKEND_ROCM=1)
endif()

# Out-of-range enum values from C (defect 6): a C program, since C++ cannot form them.
add_executable(test_enum_ranges test_enum_ranges.c)
target_link_libraries(test_enum_ranges PRIVATE kvarn::kvarn)
add_test(NAME reliability.enum_ranges COMMAND test_enum_ranges)
set_tests_properties(reliability.enum_ranges PROPERTIES LABELS reliability TIMEOUT 60)

# libFuzzer targets (tests/fuzz): only with clang, see tests/fuzz/CMakeLists.txt.
if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/CMakeLists.txt)
  add_subdirectory(fuzz)
endif()
