// User errors and internal checks.
//
// Two channels: a bad argument from the caller throws tile::Error whose message names the
// operator, the argument, what was expected and what was given; a broken invariant inside
// the library throws tile::InternalError with the file and line of the failed check.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace tile {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class InternalError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

// Raised when GPU work is requested on a machine without a usable CUDA driver, or a compile
// without NVRTC ("no NVRTC found; looked in: ...").
class NoDriverError : public Error {
 public:
  using Error::Error;
};

// "<op>: argument '<arg>': expected <expected>, got <given>"
[[noreturn]] void throw_argument_error(const std::string& op, const std::string& arg,
                                       const std::string& expected, const std::string& given);

namespace detail {
[[noreturn]] void internal_check_failed(const char* cond, const char* file, int line,
                                        const std::string& detail);

template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}
}  // namespace detail

}  // namespace tile

#define TILE_CHECK(cond, ...)                                                   \
  do {                                                                          \
    if (!(cond))                                                                \
      ::tile::detail::internal_check_failed(#cond, __FILE__, __LINE__,          \
                                            ::tile::detail::concat(__VA_ARGS__)); \
  } while (0)
