# Layer 1 (codec) and layer 2 (paged attention) suites, plus the C-API bad-input checks.
# Included by tests/CMakeLists.txt. Labels: "codec", "attention", "api"; "slow" marks the long
# (128k-token) attention test, excluded from the default run (ctest -LE slow).

# White-box: link the static twin and test core/ and backends/cpu/ pieces directly.
kvarn_add_gtest(kvarn_test_half INTERNAL
  SOURCES test_half.cpp
  LABELS codec)
kvarn_add_gtest(kvarn_test_hadamard INTERNAL
  SOURCES test_hadamard.cpp
  LABELS codec)

# Black-box: the shared library through the public header only.
kvarn_add_gtest(kvarn_test_format
  SOURCES test_format.cpp
  LABELS codec api)
kvarn_add_gtest(kvarn_test_normalize INTERNAL
  SOURCES test_normalize.cpp
  LABELS codec)
kvarn_add_gtest(kvarn_test_rtn_pack INTERNAL
  SOURCES test_rtn_pack.cpp
  LABELS codec)
kvarn_add_gtest(kvarn_test_golden
  SOURCES test_golden.cpp
  LABELS codec)
kvarn_add_gtest(kvarn_test_codec_api
  SOURCES test_codec_api.cpp
  LABELS codec)
