# The growable-struct rule of the public structs (issue 16): tests/test_struct_abi.cpp, white-box
# (it also tests core/abi_struct.h directly), label "api". Included by tests/CMakeLists.txt.
kvarn_add_gtest(kvarn_test_struct_abi INTERNAL
  SOURCES test_struct_abi.cpp
  LABELS api)
