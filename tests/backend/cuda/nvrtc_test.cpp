// Finding NVRTC at run time (Nvrtc.*), a CPU run that never loads it (NvrtcUnused.*, CTest
// backend.cuda.nvrtc_unused) and a process where it cannot be found (NvrtcMissing.*, CTest
// backend.cuda.nvrtc_missing, with TILE_NVRTC_LIBRARY naming a file that does not exist).
#include "backend/cuda/nvrtc.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "backend/cuda/jit_module.hpp"
#include "tile/tile.hpp"

namespace tile::cuda {
namespace {
namespace fs = std::filesystem;

// A scratch folder, removed with everything in it. Each gets a new name: the dynamic loader
// remembers the paths it has opened and would answer a reused one from memory.
struct TempDir {
  fs::path path;
  TempDir() {
    static int count = 0;
    path =
        fs::temp_directory_path() / ("tile-nvrtc-test-" + std::to_string(::getpid()) + "-" + std::to_string(count++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

// The NVRTC this machine has (the process-wide search) and its major version.
struct RealNvrtc {
  fs::path file;
  int major = 0;
};
RealNvrtc real_nvrtc() {
  RealNvrtc r;
  r.file = nvrtc_library();
  int minor = 0;
  EXPECT_EQ(nvrtc().nvrtcVersion(&r.major, &minor), NVRTC_SUCCESS);
  return r;
}

// `dir`/`name` as a symbolic link to the real library.
fs::path link_into(const fs::path& dir, const std::string& name, const fs::path& target) {
  fs::create_directories(dir);
  fs::create_symlink(target, dir / name);
  return dir / name;
}

// A search that looks only where a test puts files.
NvrtcSearch isolated() {
  NvrtcSearch s;
  s.loaded_in_process = false;
  s.default_loader = false;
  return s;
}

std::string soname(int major) { return "libnvrtc.so." + std::to_string(major); }

bool nvrtc_mapped() {
  std::ifstream maps("/proc/self/maps");
  std::string text((std::istreambuf_iterator<char>(maps)), std::istreambuf_iterator<char>());
  return text.find("libnvrtc") != std::string::npos;
}

TEST(Nvrtc, MajorsStartWithTheToolkitTileWasBuiltWith) {
  const std::vector<int> majors = nvrtc_majors();
  ASSERT_FALSE(majors.empty());
  EXPECT_EQ(majors.front(), CUDA_VERSION / 1000);
  for (int m : {12, 13}) EXPECT_EQ(std::count(majors.begin(), majors.end(), m), 1) << m;
}

TEST(Nvrtc, ProcessWideLibraryLoadsAndCompiles) {
  ASSERT_TRUE(nvrtc_available());
  const RealNvrtc real = real_nvrtc();
  EXPECT_TRUE(fs::exists(real.file)) << real.file;
  EXPECT_NE(std::find(nvrtc_majors().begin(), nvrtc_majors().end(), real.major), nvrtc_majors().end());
  // The version string of the loaded library, not of the headers Tile was built with.
  EXPECT_EQ(nvrtc_version().rfind(std::to_string(real.major) + ".", 0), 0u) << nvrtc_version();
  auto r = compile_cubin("extern \"C\" __global__ void k(float* p) { p[threadIdx.x] = 1.0f; }", "sm_90",
                         {"-DTILE_NVRTC_TEST"});
  EXPECT_FALSE(r->cubin.empty());
}

TEST(Nvrtc, ExplicitLibraryIsTheOnlyOneTried) {
  const RealNvrtc real = real_nvrtc();
  NvrtcSearch s = isolated();
  s.library = real.file.string();
  s.system_dirs = {"/nowhere"};
  NvrtcLibrary found = find_nvrtc(s);
  ASSERT_EQ(found.error, "");
  EXPECT_EQ(found.path, real.file.string());
  EXPECT_EQ(found.found_by, "TILE_NVRTC_LIBRARY");
  EXPECT_NE(found.table.nvrtcGetCUBIN, nullptr);

  // A wrong explicit path is an error even though the toolkit's NVRTC is one step further.
  s.library = "/nonexistent/libnvrtc.so.13";
  s.system_dirs = {real.file.parent_path().string()};
  s.default_loader = true;
  found = find_nvrtc(s);
  EXPECT_EQ(found.handle, nullptr);
  EXPECT_EQ(found.error.rfind("no NVRTC found; looked in:\n  TILE_NVRTC_LIBRARY=/nonexistent/libnvrtc.so.13: ", 0), 0u)
      << found.error;
  EXPECT_NE(found.error.find("nothing else was tried"), std::string::npos) << found.error;
  EXPECT_EQ(found.error.find(real.file.parent_path().string()), std::string::npos) << found.error;
}

TEST(Nvrtc, WheelsComeBeforeCondaToolkitAndSystem) {
  const RealNvrtc real = real_nvrtc();
  TempDir tmp;
  const std::string name = soname(real.major);
  const fs::path wheel_dir = real.major >= 13
                                 ? tmp.path / "site" / "nvidia" / ("cu" + std::to_string(real.major)) / "lib"
                                 : tmp.path / "site" / "nvidia" / "cuda_nvrtc" / "lib";
  const fs::path wheel = link_into(wheel_dir, name, real.file);
  const fs::path conda = link_into(tmp.path / "conda" / "lib", name, real.file);
  const fs::path home = link_into(tmp.path / "home" / "lib64", name, real.file);
  const fs::path path = link_into(tmp.path / "path" / "lib", name, real.file);
  const fs::path system = link_into(tmp.path / "system", name, real.file);

  NvrtcSearch s = isolated();
  s.python_dirs = {(tmp.path / "empty-site").string(), (tmp.path / "site").string()};
  s.conda_prefix = (tmp.path / "conda").string();
  s.cuda_home = (tmp.path / "home").string();
  s.cuda_path = (tmp.path / "path").string();
  s.system_dirs = {(tmp.path / "system").string()};
  // Each step wins over the ones after it; taking a step's files away hands over to the next.
  const std::vector<std::pair<fs::path, std::string>> order = {{wheel, "Python package folders"},
                                                               {conda, "$CONDA_PREFIX"},
                                                               {home, "$CUDA_HOME"},
                                                               {path, "$CUDA_PATH"},
                                                               {system, (tmp.path / "system").string()}};
  for (const auto& [file, place] : order) {
    NvrtcLibrary found = find_nvrtc(s);
    ASSERT_EQ(found.error, "");
    EXPECT_EQ(found.path, file.string());
    EXPECT_EQ(found.found_by, place);
    fs::remove(file);
  }
  NvrtcLibrary none = find_nvrtc(s);
  EXPECT_NE(none.error, "");
}

TEST(Nvrtc, AFileThatDoesNotLoadIsSkippedAndReported) {
  const RealNvrtc real = real_nvrtc();
  TempDir tmp;
  const std::string name = soname(real.major);
  fs::create_directories(tmp.path / "home" / "lib64");
  std::ofstream(tmp.path / "home" / "lib64" / name) << "not a library\n";
  link_into(tmp.path / "system", name, real.file);

  NvrtcSearch s = isolated();
  s.cuda_home = (tmp.path / "home").string();
  s.system_dirs = {(tmp.path / "system").string()};
  NvrtcLibrary found = find_nvrtc(s);
  ASSERT_EQ(found.error, "");
  EXPECT_EQ(found.found_by, (tmp.path / "system").string());

  fs::remove(tmp.path / "system" / name);
  found = find_nvrtc(s);
  EXPECT_NE(found.error.find("  $CUDA_HOME: " + (tmp.path / "home" / "lib64" / name).string() + ": "),
            std::string::npos)
      << found.error;
}

TEST(Nvrtc, NothingFoundNamesEveryPlace) {
  TempDir tmp;
  NvrtcSearch s = isolated();
  s.system_dirs = {(tmp.path / "cuda" / "lib64").string()};
  s.python_dirs = {(tmp.path / "site").string()};
  s.cuda_home = (tmp.path / "home").string();
  const NvrtcLibrary found = find_nvrtc(s);
  EXPECT_EQ(found.handle, nullptr);
  const std::string& e = found.error;
  EXPECT_EQ(e.rfind("no NVRTC found; looked in:\n  TILE_NVRTC_LIBRARY: not set\n", 0), 0u) << e;
  for (const std::string& line :
       {"  Python package folders: no " + (tmp.path / "site" / "nvidia").string(),
        std::string("  $CONDA_PREFIX: not set"), "  $CUDA_HOME: no " + (tmp.path / "home" / "lib64").string(),
        std::string("  $CUDA_PATH: not set"), "  " + (tmp.path / "cuda" / "lib64").string() + ": no ",
        std::string("pip install nvidia-cuda-nvrtc")})
    EXPECT_NE(e.find(line), std::string::npos) << line << "\nin\n" << e;
}

TEST(Nvrtc, AnNvrtcAlreadyInTheProcessIsReused) {
  const RealNvrtc real = real_nvrtc();  // loads it process-wide
  NvrtcSearch s = isolated();
  s.loaded_in_process = true;
  const NvrtcLibrary found = find_nvrtc(s);
  ASSERT_EQ(found.error, "");
  EXPECT_EQ(found.found_by, "this process");
  EXPECT_TRUE(fs::equivalent(found.path, real.file)) << found.path << " vs " << real.file;
}

// A CPU run lowers, emits CUDA text and executes, but compiles nothing.
void cpu_softmax_matches_oracle() {
  const int64_t rows = 3, cols = 77;
  std::vector<float> x(rows * cols), y(rows * cols, -1.0f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i % 13) - 6) * 0.37f;
  Call call{.op = Op::softmax,
            .x = matrix(x.data(), DType::f32, rows, cols, cols),
            .y = matrix(y.data(), DType::f32, rows, cols, cols)};
  run(call, {.backend = Backend::cpu});
  const OracleCheck check = check_against_oracle(call);
  EXPECT_TRUE(check.ok) << check.first_mismatch;
}

TEST(NvrtcUnused, CpuRunLoadsNoNvrtc) {
  ASSERT_FALSE(nvrtc_mapped()) << "libnvrtc is mapped before any compile";
  cpu_softmax_matches_oracle();
  EXPECT_FALSE(nvrtc_mapped()) << "a CPU run loaded libnvrtc";
}

TEST(NvrtcMissing, CompilesFailWithEveryPlaceNamedAndTheCpuBackendRuns) {
  ASSERT_NE(std::getenv("TILE_NVRTC_LIBRARY"), nullptr) << "run through CTest backend.cuda.nvrtc_missing";
  EXPECT_FALSE(nvrtc_available());
  try {
    nvrtc();
    FAIL() << "nvrtc() should throw";
  } catch (const NoDriverError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("no NVRTC found; looked in:\n  TILE_NVRTC_LIBRARY=", 0), 0u) << e.what();
  }
  EXPECT_THROW(nvrtc_version(), NoDriverError);
  EXPECT_THROW(nvrtc_library(), NoDriverError);
  EXPECT_THROW(compile_cubin("__global__ void k() {}", "sm_90"), NoDriverError);
  cpu_softmax_matches_oracle();
  EXPECT_FALSE(nvrtc_mapped());
}

}  // namespace
}  // namespace tile::cuda
