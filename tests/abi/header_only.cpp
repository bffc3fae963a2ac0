// Compiles the public header alone as C++ (abi.header_cxx17 test): no other include before it,
// included twice (include guard), declarations have C linkage, enums pinned to 32 bits.
#include <kvarn/kvarn.h>
// The experimental header after it (it includes kvarn.h itself: the guard makes that a no-op).
#include <kvarn/kvarn_experimental.h>

static_assert(sizeof(kvarn_status_t) == 4, "kvarn_status_t must be 32 bits");
static_assert(sizeof(kvarn_dtype_t) == 4, "kvarn_dtype_t must be 32 bits");
static_assert(sizeof(kvarn_backend_t) == 4, "kvarn_backend_t must be 32 bits");
static_assert(sizeof(kvarn_cpu_isa_t) == 4, "kvarn_cpu_isa_t must be 32 bits");
static_assert(sizeof(kvarn_record_field_t) == 4, "kvarn_record_field_t must be 32 bits");
static_assert(KVARN_OK == 0, "KVARN_OK must be 0");
static_assert(sizeof(kvarn_baseline_t) == 4, "kvarn_baseline_t must be 32 bits");
static_assert(KVARN_ABLATE_NONE == 0u, "0 is the stable value of the flag fields");

// Redeclaring with extern "C" is an error if the header declared the function with C++ linkage.
extern "C" KVARN_API const char* kvarn_version_string(void);
extern "C" KVARN_API kvarn_status_t kvarn_context_create(const kvarn_context_options_t* options,
                                                         kvarn_context_t** out_context);
extern "C" KVARN_API kvarn_status_t kvarn_baseline_roundtrip(kvarn_baseline_t method, int32_t bits,
                                                             size_t rows, int32_t cols,
                                                             const float* in, float* out);
