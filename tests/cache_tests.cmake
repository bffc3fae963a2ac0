kvarn_add_gtest(test_managed_cache SOURCES test_managed_cache.cpp LABELS cache)
kvarn_add_gtest(test_concurrency SOURCES test_concurrency.cpp LABELS cache)
kvarn_add_gtest(test_memory_api SOURCES test_memory_api.cpp LABELS api)
kvarn_add_gtest(test_cpu_isa SOURCES test_cpu_isa.cpp LABELS api)
