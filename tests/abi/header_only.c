/* Compiles the public header alone (abi.header_c99 / abi.header_c11 tests): no other include
 * before it, included twice (include guard), and the pinned 32-bit enums checked at compile
 * time with a C89-compatible trick. */
#include <kvarn/kvarn.h>
/* The experimental header after it (it includes kvarn.h itself: the guard makes that a no-op). */
#include <kvarn/kvarn_experimental.h>

typedef char kvarn_check_status_size[sizeof(kvarn_status_t) == 4 ? 1 : -1];
typedef char kvarn_check_dtype_size[sizeof(kvarn_dtype_t) == 4 ? 1 : -1];
typedef char kvarn_check_backend_size[sizeof(kvarn_backend_t) == 4 ? 1 : -1];
typedef char kvarn_check_isa_size[sizeof(kvarn_cpu_isa_t) == 4 ? 1 : -1];
typedef char kvarn_check_field_size[sizeof(kvarn_record_field_t) == 4 ? 1 : -1];
typedef char kvarn_check_ok_is_zero[KVARN_OK == 0 ? 1 : -1];
typedef char kvarn_check_baseline_size[sizeof(kvarn_baseline_t) == 4 ? 1 : -1];
typedef char kvarn_check_ablate_none[KVARN_ABLATE_NONE == 0u ? 1 : -1];
