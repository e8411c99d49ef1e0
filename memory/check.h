// Invariant checks in two tiers (after mimalloc's assertion levels).
//
// MEMFIT_CHECK(cond) << "context";   always on, cheap; a failure is a memfit bug.
// MEMFIT_DCHECK(cond) << "context";  compiled in only with MEMFIT_DEBUG_CHECKS.
//
// A failure throws memfit::CheckFailure (not a memfit::Error: callers should not catch it as
// a user error) whose message starts with file:line and the failed condition. Throwing rather
// than aborting lets tests assert on broken invariants and keeps RAII cleanup running.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace memfit {

class CheckFailure : public std::logic_error {
 public:
  explicit CheckFailure(const std::string& what) : std::logic_error(what) {}
};

namespace detail {

// Collects the condition and the streamed context; used only by the macros below.
class CheckMessage {
 public:
  CheckMessage(const char* file, int line, const char* cond) {
    os_ << file << ':' << line << ": check failed: " << cond;
  }
  template <typename T>
  CheckMessage& operator<<(const T& v) {
    if (!has_context_) {
      os_ << ": ";
      has_context_ = true;
    }
    os_ << v;
    return *this;
  }
  std::string str() const { return os_.str(); }

 private:
  std::ostringstream os_;
  bool has_context_ = false;
};

// `CheckThrower() & msg`: & binds looser than <<, so the whole stream is built first.
struct CheckThrower {
  [[noreturn]] void operator&(const CheckMessage& m) const { throw CheckFailure(m.str()); }
};

}  // namespace detail
}  // namespace memfit

#define MEMFIT_CHECK(cond)         \
  if (__builtin_expect(!!(cond), 1)) \
    ;                              \
  else                             \
    ::memfit::detail::CheckThrower() & ::memfit::detail::CheckMessage(__FILE__, __LINE__, #cond)

#ifdef MEMFIT_DEBUG_CHECKS
#define MEMFIT_DCHECK(cond) MEMFIT_CHECK(cond)
#else
#define MEMFIT_DCHECK(cond) \
  if (true)                 \
    ;                       \
  else                      \
    ::memfit::detail::CheckThrower() & ::memfit::detail::CheckMessage(__FILE__, __LINE__, #cond)
#endif
