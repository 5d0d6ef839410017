// NVRTC compilation of generated kernels to CUBIN, cached in memory and on disk.
//
// compile_cubin() keys a compile by SHA-256 over (source hash, NVRTC version, arch, every
// option) and looks the key up in a process-wide map, then under cache_dir() as
// "<key>.cubin", and only then runs NVRTC. A disk entry is a header line (key, payload length,
// payload SHA-256) and the CUBIN; it is used only when it is a regular file (no symbolic link
// followed, never a FIFO or device), at most 64 MiB, and its header names the key, its length
// equals the file's payload size and its SHA-256 matches, all checked before the payload is
// read. Anything else (unreadable, wrong type, too big, corrupt, a folder in the way, a failed
// write) is recompiled and rewritten where possible, with at most one warning per process:
// the disk cache never throws, blocks or loads what did not verify. get_function() loads a
// CUBIN once per (context, key) and memoises kernels. Everything here is thread-safe.
// Tests: tests/backend/cuda/jit_module_test.cpp.
#pragma once

#include <cuda.h>

#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tile/error.hpp"

namespace tile::cuda {

struct CompileResult {
  enum class Origin { compiled, memory, disk };

  std::string cubin;  // ELF image for `arch`
  std::string key;    // cache key, 64 hex digits
  std::string source_sha256;
  std::string cubin_sha256;
  std::string arch;                  // "sm_90"
  std::vector<std::string> options;  // every NVRTC option, "-arch=..." first
  std::string log;                   // NVRTC log (warnings); empty when loaded from disk
  // NVRTC time if compiled, read-and-verify time if from disk, 0 if from memory.
  double compile_ms = 0.0;
  Origin origin = Origin::compiled;
};

class CompileError : public Error {
 public:
  CompileError(const std::string& message, std::string log, std::vector<std::string> options)
      : Error(message), log_(std::move(log)), options_(std::move(options)) {}
  const std::string& log() const { return log_; }
  const std::vector<std::string>& options() const { return options_; }

 private:
  std::string log_;
  std::vector<std::string> options_;
};

// Compiles `source` for a real architecture ("sm_90") with -arch, -std=c++17, -lineinfo
// and `extra_options`. Throws CompileError when NVRTC rejects the source (message: log,
// options and, with TILE_SHOW_SOURCE=1, the numbered source). Thread-safe.
std::shared_ptr<const CompileResult> compile_cubin(
    const std::string& source, const std::string& arch,
    const std::vector<std::string>& extra_options = {});

// TILE_CACHE_DIR, else $XDG_CACHE_HOME/tile/kernels, else $HOME/.cache/tile/kernels;
// empty when none of these is set. Read from the environment on every call.
std::filesystem::path cache_dir();
// False when TILE_DISABLE_DISK_CACHE is set to anything but "", "0", "false", "no" or "off" (in
// any case), or cache_dir() is empty.
bool disk_cache_enabled();
// Empties compile_cubin()'s process-wide map; results already returned stay valid.
void clear_memory_cache();
// Removes cache entries (and leftover temporary files) from cache_dir(), nothing else.
void clear_disk_cache();
// "13.0"
std::string nvrtc_version();

// Loads `module` into the current context (ensure_context()) on first use and returns the
// kernel; modules stay loaded for the life of the process, keyed by the context's id (never
// reused), so a later context never sees another's handles. Throws NoDriverError without a driver.
CUfunction get_function(const CompileResult& module, const std::string& kernel_name);

}  // namespace tile::cuda
