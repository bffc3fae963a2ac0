# Layer 1 (codec) and layer 2 (paged attention) suites, plus the C-API bad-input checks.
# Included by tests/CMakeLists.txt. Labels: "codec", "attention", "api"; "slow" marks the long
# (128k-token) attention test, excluded from the default run (ctest -LE slow).
# One label per executable: kvarn_add_gtest passes LABELS through gtest_discover_tests'
# PROPERTIES, where a second label would be read as a property name (only the first one sticks).
# Test-side helpers live in tests/support/ (seeded RNG, fp16/bf16 oracle, safetensors reader,
# float64 references, a paged-cache builder over the public layer-2 calls).

# White-box: the static twin (kvarn_internal), testing core/ and backends/cpu/ pieces directly.
kvarn_add_gtest(kvarn_test_half INTERNAL
  SOURCES test_half.cpp
  LABELS codec)
kvarn_add_gtest(kvarn_test_hadamard INTERNAL
  SOURCES test_hadamard.cpp
  LABELS codec)
kvarn_add_gtest(kvarn_test_normalize INTERNAL
  SOURCES test_normalize.cpp
  LABELS codec)
kvarn_add_gtest(kvarn_test_rtn_pack INTERNAL
  SOURCES test_rtn_pack.cpp
  LABELS codec)

# Black-box: the shared library through the public header only.
kvarn_add_gtest(kvarn_test_format
  SOURCES test_format.cpp
  LABELS codec)
kvarn_add_gtest(kvarn_test_golden
  SOURCES test_golden.cpp
  LABELS codec)
kvarn_add_gtest(kvarn_test_codec_api
  SOURCES test_codec_api.cpp
  LABELS codec)
kvarn_add_gtest(kvarn_test_paged_cache
  SOURCES test_paged_cache.cpp
  LABELS attention)
kvarn_add_gtest(kvarn_test_paged_attention
  SOURCES test_paged_attention.cpp
  LABELS attention)
kvarn_add_gtest(kvarn_test_api_errors
  SOURCES test_api_errors.cpp
  LABELS api)

# The 128k-token context: its own executable so every test in it carries the `slow` label.
kvarn_add_gtest(kvarn_test_attention_long
  SOURCES test_attention_long.cpp
  LABELS slow)

# The accuracy study's baseline quantizers (kvarn_baseline_roundtrip).
kvarn_add_gtest(kvarn_test_baselines
  SOURCES test_baselines.cpp
  LABELS codec)

# The model variants (sinks, sliding window, softcap, prefix mode) against float64, every ISA.
kvarn_add_gtest(kvarn_test_attention_variants
  SOURCES test_attention_variants.cpp
  LABELS attention)
