// Failures inside the core are values: a status code plus a message. The C shims turn
// them into kvarn_status_t and the thread-local last-error text.
#pragma once

#include <string>
#include <utility>

#include "kvarn/kvarn.h"

namespace kvarn {

class Status {
 public:
  Status() = default;
  Status(kvarn_status_t code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return Status(); }

  bool ok() const { return code_ == KVARN_OK; }
  kvarn_status_t code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  kvarn_status_t code_ = KVARN_OK;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return {KVARN_ERR_INVALID_ARGUMENT, std::move(m)}; }
inline Status Unsupported(std::string m) { return {KVARN_ERR_UNSUPPORTED, std::move(m)}; }
inline Status InvalidState(std::string m) { return {KVARN_ERR_INVALID_STATE, std::move(m)}; }

}  // namespace kvarn

#define KVARN_RETURN_IF_ERROR(expr)        \
  do {                                     \
    ::kvarn::Status _kvarn_st = (expr);    \
    if (!_kvarn_st.ok()) return _kvarn_st; \
  } while (0)
