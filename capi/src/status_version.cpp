// Versions, status strings and the thread-local last error.
#include <string>

#include "capi/src/shim.h"
#include "core/ops.h"

namespace kvarn {
namespace capi {
namespace {
thread_local std::string g_last_error;
// Set when the message could not be stored (no memory): kvarn_last_error then returns the
// status string, which needs no allocation.
thread_local const char* g_static_error = nullptr;
}  // namespace

kvarn_status_t Report(const Status& st) noexcept {
  g_static_error = nullptr;
  if (st.ok()) {
    g_last_error.clear();
    return KVARN_OK;
  }
  try {
    g_last_error = st.message().empty() ? kvarn_status_string(st.code()) : st.message();
  } catch (...) {
    g_last_error.clear();
    g_static_error = kvarn_status_string(st.code());
  }
  return st.code();
}

const char* LastErrorText() { return g_static_error ? g_static_error : g_last_error.c_str(); }

}  // namespace capi
}  // namespace kvarn

extern "C" {

uint32_t kvarn_version_number(void) { return KVARN_VERSION_NUMBER; }

const char* kvarn_version_string(void) {
#define KVARN_STR2(x) #x
#define KVARN_STR(x) KVARN_STR2(x)
  return KVARN_STR(KVARN_VERSION_MAJOR) "." KVARN_STR(KVARN_VERSION_MINOR) "." KVARN_STR(
      KVARN_VERSION_PATCH);
#undef KVARN_STR
#undef KVARN_STR2
}

uint32_t kvarn_abi_version(void) { return KVARN_ABI_VERSION; }

const char* kvarn_status_string(kvarn_status_t s) {
  switch (kvarn::EnumInt(s)) {  // an integer: C callers may pass any value
    case KVARN_OK:
      return "ok";
    case KVARN_ERR_INVALID_ARGUMENT:
      return "invalid argument";
    case KVARN_ERR_UNSUPPORTED:
      return "unsupported";
    case KVARN_ERR_OUT_OF_MEMORY:
      return "out of memory";
    case KVARN_ERR_BACKEND_UNAVAILABLE:
      return "backend unavailable";
    case KVARN_ERR_NON_FINITE:
      return "non-finite input";
    case KVARN_ERR_OVERFLOW:
      return "value exceeds fp16 range";
    case KVARN_ERR_CAPACITY:
      return "capacity exceeded";
    case KVARN_ERR_NOT_FOUND:
      return "not found";
    case KVARN_ERR_ALREADY_EXISTS:
      return "already exists";
    case KVARN_ERR_CORRUPT_DATA:
      return "corrupt data";
    case KVARN_ERR_BUFFER_TOO_SMALL:
      return "buffer too small";
    case KVARN_ERR_INVALID_STATE:
      return "invalid state";
    case KVARN_ERR_DEVICE:
      return "device error";
    case KVARN_ERR_INTERNAL:
      return "internal error";
    default:
      return "unknown status";
  }
}

const char* kvarn_last_error(void) { return kvarn::capi::LastErrorText(); }

size_t kvarn_dtype_size(kvarn_dtype_t dtype) {
  const int32_t v = kvarn::EnumInt(dtype);  // an integer: C callers may pass any value
  return v >= KVARN_DTYPE_F32 && v <= KVARN_DTYPE_BF16 ? kvarn::DtypeSize(dtype) : 0;
}

}  // extern "C"
