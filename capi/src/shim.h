// Shared pieces of the C shims: the handle types, the last-error slot and the catch-all that
// keeps every C++ exception on this side of the ABI.
#pragma once

#include <exception>
#include <memory>
#include <new>

#include "core/backend.h"
#include "core/status.h"
#include "kvarn/kvarn.h"

struct kvarn_context {
  std::unique_ptr<kvarn::Context> impl;
};

namespace kvarn {
namespace capi {

// Records `st` as this thread's last error (or clears it) and returns its code.
kvarn_status_t Report(const Status& st);
const char* LastErrorText();

// Runs fn() -> Status, turning any exception into a status.
template <typename Fn>
kvarn_status_t Guard(Fn&& fn) noexcept {
  try {
    return Report(fn());
  } catch (const std::bad_alloc&) {
    return Report(Status(KVARN_ERR_OUT_OF_MEMORY, "out of memory"));
  } catch (const std::exception& e) {
    return Report(Status(KVARN_ERR_INTERNAL, std::string("internal error: ") + e.what()));
  } catch (...) {
    return Report(Status(KVARN_ERR_INTERNAL, "internal error: unknown exception"));
  }
}

inline Status NeedContext(const kvarn_context_t* c) {
  if (c == nullptr || !c->impl) return InvalidArgument("context is NULL");
  return Status::Ok();
}

}  // namespace capi
}  // namespace kvarn
