#include "tile/error.hpp"

namespace tile {

void throw_argument_error(const std::string& op, const std::string& arg,
                          const std::string& expected, const std::string& given) {
  throw Error(op + ": argument '" + arg + "': expected " + expected + ", got " + given);
}

namespace detail {
void internal_check_failed(const char* cond, const char* file, int line,
                           const std::string& detail) {
  std::string msg = std::string("tile internal error at ") + file + ":" + std::to_string(line) +
                    ": check '" + cond + "' failed";
  if (!detail.empty()) msg += ": " + detail;
  throw InternalError(msg);
}
}  // namespace detail

}  // namespace tile
