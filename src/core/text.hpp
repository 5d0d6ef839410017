// Small text helpers shared by the CUDA backend's loader and compiler.
#pragma once

#include <cstdlib>
#include <string>
#include <vector>

namespace tile {

// The environment variable's value, or "" where it is unset.
inline std::string getenv_str(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

inline std::string join(const std::vector<std::string>& parts, const char* sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
  return out;
}

}  // namespace tile
