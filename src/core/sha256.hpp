// SHA-256 of bytes, as lowercase hex (OpenSSL's EVP digest).
#pragma once

#include <string>
#include <string_view>

namespace tile {
std::string sha256_hex(std::string_view bytes);
}
