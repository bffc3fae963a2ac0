// Shared pieces of the C shims: the handle types, the last-error slot and the catch-all that
// keeps every C++ exception on this side of the ABI.
#pragma once

#include <exception>
#include <memory>
#include <new>
#include <stdexcept>

#include "core/backend.h"
#include "core/status.h"
#include "kvarn/kvarn.h"

struct kvarn_context {
  std::unique_ptr<kvarn::Context> impl;
};

namespace kvarn {
namespace capi {

// Records `st` as this thread's last error (or clears it) and returns its code.
kvarn_status_t Report(const Status& st) noexcept;
const char* LastErrorText();

// Record a status from inside a catch handler without letting a second exception escape (the
// message may not fit in memory: Report then falls back to the static status string).
inline kvarn_status_t ReportOutOfMemory() noexcept {
  try {
    return Report(Status(KVARN_ERR_OUT_OF_MEMORY, "out of memory"));
  } catch (...) {
    return Report(Status(KVARN_ERR_OUT_OF_MEMORY, std::string()));
  }
}

inline kvarn_status_t ReportInternal(const char* what) noexcept {
  try {
    return Report(Status(KVARN_ERR_INTERNAL, std::string("internal error: ") + what));
  } catch (...) {
    return Report(Status(KVARN_ERR_INTERNAL, std::string()));
  }
}

// Runs fn() -> Status, turning any exception into a status.
template <typename Fn>
kvarn_status_t Guard(Fn&& fn) noexcept {
  try {
    return Report(fn());
  } catch (const std::bad_alloc&) {
    return ReportOutOfMemory();
  } catch (const std::length_error&) {
    return ReportOutOfMemory();  // a container asked for more than its max_size()
  } catch (const std::exception& e) {
    return ReportInternal(e.what());
  } catch (...) {
    return ReportInternal("unknown exception");
  }
}

inline Status NeedContext(const kvarn_context_t* c) {
  if (c == nullptr || !c->impl) return InvalidArgument("context is NULL");
  return Status::Ok();
}

}  // namespace capi
}  // namespace kvarn
