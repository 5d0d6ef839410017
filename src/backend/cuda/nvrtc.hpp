// NVRTC, loaded at run time.
//
// libnvrtc is never linked: nvrtc() finds and dlopens it on the first compile, so programs
// that only run the CPU backend need no NVRTC at all. The search, first hit wins (the order
// cuda-pathfinder uses, with an explicit override first and the toolkit folders before the
// loader's own search):
//   1. $TILE_NVRTC_LIBRARY, the path of a libnvrtc.so; when set, nothing else is tried;
//   2. an NVRTC this process has already loaded (e.g. through torch);
//   3. NVIDIA's wheels in the Python package folders set_python_package_dirs() was given:
//      nvidia/cu13/lib/ (nvidia-cuda-nvrtc 13) and nvidia/cuda_nvrtc/lib/ (nvidia-cuda-nvrtc-cu12);
//   4. $CONDA_PREFIX/lib, then lib64/ and lib/ of $CUDA_HOME and of $CUDA_PATH;
//   5. /usr/local/cuda/lib64;
//   6. the dynamic loader's search (LD_LIBRARY_PATH, ld.so.cache).
// Each place is asked for libnvrtc.so.<major> of the toolkit Tile was built with, then for the
// other supported majors. Tests: tests/backend/cuda/nvrtc_test.cpp.
#pragma once

#include <nvrtc.h>

#include <memory>
#include <string>
#include <vector>

#include "tile/error.hpp"

// clang-format off
#define TILE_NVRTC_FUNCTIONS(X)                                                         \
  X(nvrtcVersion) X(nvrtcGetErrorString) X(nvrtcCreateProgram) X(nvrtcDestroyProgram)   \
  X(nvrtcCompileProgram) X(nvrtcGetProgramLogSize) X(nvrtcGetProgramLog)                \
  X(nvrtcGetCUBINSize) X(nvrtcGetCUBIN)
// clang-format on

namespace tile::cuda {

struct Nvrtc {
#define TILE_NVRTC_DECLARE_MEMBER(fn) decltype(&::fn) fn = nullptr;
  TILE_NVRTC_FUNCTIONS(TILE_NVRTC_DECLARE_MEMBER)
#undef TILE_NVRTC_DECLARE_MEMBER
};

// Finds and loads NVRTC once (thread-safe). Throws NoDriverError ("no NVRTC found; looked in:
// ...", one line per place searched) when no usable library is found.
const Nvrtc& nvrtc();
// Never throws; true when nvrtc() would succeed.
bool nvrtc_available() noexcept;
// The file nvrtc() loaded; throws like nvrtc().
std::string nvrtc_library();

// The folders Python imports packages from (sys.path), searched for NVIDIA's NVRTC wheels.
// The Python extension sets them when it is imported; later calls do not change a library
// already loaded.
void set_python_package_dirs(std::vector<std::string> dirs);

// One search, uncached: what nvrtc() runs, with every input explicit (tests vary them).
struct NvrtcSearch {
  std::string library;                   // TILE_NVRTC_LIBRARY
  bool loaded_in_process = true;         // step 2
  std::vector<std::string> python_dirs;  // step 3
  std::string conda_prefix, cuda_home, cuda_path;
  std::vector<std::string> system_dirs;  // step 5
  bool default_loader = true;            // step 6

  // The environment and the folders set_python_package_dirs() was given.
  static NvrtcSearch from_environment();
};

struct NvrtcLibrary {
  Nvrtc table;                   // all set when `error` is empty
  std::string path;              // the file loaded
  std::string found_by;          // "TILE_NVRTC_LIBRARY", "this process", "Python package", ...
  std::string error;             // "no NVRTC found; looked in: ..." when nothing usable was found
  std::shared_ptr<void> handle;  // dlclose()s the library when the last copy goes
};

// Major versions of NVRTC Tile can use: the one it was built with first.
std::vector<int> nvrtc_majors();
NvrtcLibrary find_nvrtc(const NvrtcSearch& search);

}  // namespace tile::cuda

// Evaluates an NVRTC call made through nvrtc(); on failure throws tile::Error naming the call
// and NVRTC's message.
#define TILE_NVRTC_CHECK(call)                                                            \
  do {                                                                                    \
    const nvrtcResult tile_nvrtc_result_ = (call);                                        \
    if (tile_nvrtc_result_ != NVRTC_SUCCESS)                                              \
      throw ::tile::Error(std::string("NVRTC call failed: " #call ": ") +                 \
                          ::tile::cuda::nvrtc().nvrtcGetErrorString(tile_nvrtc_result_)); \
  } while (0)
