# CPU SIMD levels against the scalar reference (issue "CPU SIMD backend"); included by
# tests/CMakeLists.txt. Every test selects its ISA through the public cap and skips the levels
# this host or build lacks, so one executable covers scalar + every SIMD level the machine has.
kvarn_add_gtest(kvarn_test_simd_parity
  SOURCES test_simd_parity.cpp
  LABELS simd)

# The NEON level on x86-64 hosts: a cross build for aarch64 whose parity suites run under
# qemu-aarch64 (scripts/neon-qemu-test.sh; a few minutes). Skipped (exit 77) when the cross
# compiler or qemu-user is missing; scripts/install-deps.sh installs both.
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$" AND NOT CMAKE_CROSSCOMPILING)
  add_test(NAME simd.neon_qemu
           COMMAND ${PROJECT_SOURCE_DIR}/scripts/neon-qemu-test.sh ${CMAKE_BINARY_DIR}/neon)
  set_tests_properties(simd.neon_qemu PROPERTIES LABELS neon SKIP_RETURN_CODE 77 TIMEOUT 1500)
endif()
