# Layer 1 (codec) and layer 2 (paged attention) suites, plus the C-API bad-input checks.
# Included by tests/CMakeLists.txt. Labels: "codec", "attention", "api"; "slow" marks the long
# (128k-token) attention test, excluded from the default run (ctest -LE slow).

# White-box: link the static twin and test core/ and backends/cpu/ pieces directly.
kvarn_add_gtest(kvarn_test_half INTERNAL
  SOURCES test_half.cpp
  LABELS codec)
