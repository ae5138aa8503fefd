// Error types and checking macros shared by every Stratum component.
// Does not log or exit: callers (the CLI) catch, print one line and choose the exit code.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace stratum {

// A user-facing problem: bad flag, bad file, not enough space. The message is one line that
// names the thing, the expected and actual value, and what to do; it starts with "[component]".
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An internal invariant failed: a bug in Stratum, not in the user's input.
class BugError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <class... Args>
std::string concat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}
}  // namespace detail

}  // namespace stratum

// STRATUM_CHECK(cond, "[io.read] offset must be 4096-aligned, got ", off)
#define STRATUM_CHECK(cond, ...)                                          \
  do {                                                                    \
    if (!(cond)) throw ::stratum::Error(::stratum::detail::concat(__VA_ARGS__)); \
  } while (0)

#define STRATUM_FAIL(...) throw ::stratum::Error(::stratum::detail::concat(__VA_ARGS__))

#define STRATUM_ASSERT(cond)                                                          \
  do {                                                                                \
    if (!(cond))                                                                      \
      throw ::stratum::BugError(::stratum::detail::concat("bug: ", #cond, " failed at ", \
                                                          __FILE__, ":", __LINE__));  \
  } while (0)
