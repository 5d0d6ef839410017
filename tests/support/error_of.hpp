// The message of the tile::Error a callable throws: what tests of error messages compare.
#pragma once

#include <functional>
#include <string>

#include "tile/error.hpp"

namespace tile::testing {

// The message of the tile::Error `f` throws, or "" when it throws none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace tile::testing
