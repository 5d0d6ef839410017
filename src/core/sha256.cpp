#include "core/sha256.hpp"

#include <openssl/evp.h>

#include "tile/error.hpp"

namespace tile {

std::string sha256_hex(std::string_view bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  int ok = EVP_Digest(bytes.data(), bytes.size(), digest, &len, EVP_sha256(), nullptr);
  TILE_CHECK(ok == 1 && len == 32, "EVP_Digest(sha256) failed");
  static const char* hex = "0123456789abcdef";
  std::string out(64, '0');
  for (unsigned i = 0; i < 32; ++i) {
    out[2 * i] = hex[digest[i] >> 4];
    out[2 * i + 1] = hex[digest[i] & 15];
  }
  return out;
}

}  // namespace tile
