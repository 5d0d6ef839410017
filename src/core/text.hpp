// Small text helpers: the environment, joining, and text a caller gave shown in a message.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
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

// Text a caller gave, as an error message shows it: bytes outside printable ASCII as \xNN (a
// NUL would end the message wherever it is read as a C string), at most `max` bytes of it.
inline std::string printable(std::string_view text, size_t max = 120) {
  std::string out;
  for (size_t i = 0; i < text.size() && i < max; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += char(c);
    } else {
      char buf[5];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (text.size() > max) out += "... (" + std::to_string(text.size()) + " bytes)";
  return out;
}

}  // namespace tile
