// NVRTC compile and the two cache levels; host only (NVRTC needs no GPU).
#include "backend/cuda/jit_module.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <optional>
#include <utility>

#include "backend/cuda/driver.hpp"
#include "core/sha256.hpp"

namespace tile::cuda {
namespace {
namespace fs = std::filesystem;
using Origin = CompileResult::Origin;

constexpr const char* kKernel =
    R"(extern "C" __global__ void scale(float* out, const float* in, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a * in[i];
}
)";

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
}

// Each test gets its own TILE_CACHE_DIR and an empty memory cache.
class JitModuleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    dir_ = fs::temp_directory_path() / ("tile-jit-test-" + std::to_string(::getpid()) + "-" + name);
    fs::remove_all(dir_);
    ::setenv("TILE_CACHE_DIR", dir_.c_str(), 1);
    ::unsetenv("TILE_DISABLE_DISK_CACHE");
    ::unsetenv("TILE_SHOW_SOURCE");
    clear_memory_cache();
  }
  void TearDown() override {
    clear_memory_cache();
    ::unsetenv("TILE_DISABLE_DISK_CACHE");
    ::unsetenv("TILE_SHOW_SOURCE");
    fs::remove_all(dir_);
  }
  fs::path entry(const CompileResult& r) const { return dir_ / (r.key + ".cubin"); }

  fs::path dir_;
};

TEST_F(JitModuleTest, CompilesElfCubinAndWritesEntry) {
  auto r = compile_cubin(kKernel, "sm_90");
  EXPECT_EQ(r->origin, Origin::compiled);
  ASSERT_GE(r->cubin.size(), 4u);
  EXPECT_EQ(r->cubin.substr(0, 4), "\177ELF");
  EXPECT_EQ(r->arch, "sm_90");
  ASSERT_GE(r->options.size(), 3u);
  EXPECT_EQ(r->options[0], "-arch=sm_90");
  EXPECT_NE(std::find(r->options.begin(), r->options.end(), "-std=c++17"), r->options.end());
  EXPECT_NE(std::find(r->options.begin(), r->options.end(), "-lineinfo"), r->options.end());
  EXPECT_EQ(r->key.size(), 64u);
  EXPECT_EQ(r->source_sha256, sha256_hex(kKernel));
  EXPECT_EQ(r->cubin_sha256, sha256_hex(r->cubin));
  EXPECT_GT(r->compile_ms, 0.0);
  EXPECT_TRUE(fs::is_regular_file(entry(*r)));
}

TEST_F(JitModuleTest, SecondCallHitsMemoryThenDisk) {
  auto first = compile_cubin(kKernel, "sm_90");
  auto second = compile_cubin(kKernel, "sm_90");
  EXPECT_EQ(second->origin, Origin::memory);
  EXPECT_EQ(second->key, first->key);
  EXPECT_EQ(second->cubin, first->cubin);

  clear_memory_cache();
  auto third = compile_cubin(kKernel, "sm_90");
  EXPECT_EQ(third->origin, Origin::disk);
  EXPECT_EQ(third->cubin, first->cubin);
  EXPECT_EQ(third->cubin_sha256, first->cubin_sha256);
  EXPECT_EQ(third->options, first->options);
}

TEST_F(JitModuleTest, KeyCoversSourceArchAndEveryOption) {
  const std::string base = compile_cubin(kKernel, "sm_90")->key;
  EXPECT_EQ(compile_cubin(kKernel, "sm_90", {})->key, base);
  auto with_option = compile_cubin(kKernel, "sm_90", {"-DTILE_TEST=1"});
  EXPECT_EQ(with_option->origin, Origin::compiled);
  EXPECT_NE(with_option->key, base);
  EXPECT_EQ(with_option->options.back(), "-DTILE_TEST=1");
  EXPECT_NE(compile_cubin(kKernel, "sm_80")->key, base);
  EXPECT_NE(compile_cubin(std::string(kKernel) + "// changed\n", "sm_90")->key, base);
}

TEST_F(JitModuleTest, CorruptedPayloadIsRecompiledAndRewritten) {
  auto first = compile_cubin(kKernel, "sm_90");
  std::string bytes = read_bytes(entry(*first));
  bytes[bytes.size() - 1] ^= 0x5a;
  write_bytes(entry(*first), bytes);

  clear_memory_cache();
  auto again = compile_cubin(kKernel, "sm_90");
  EXPECT_EQ(again->origin, Origin::compiled);
  EXPECT_EQ(again->cubin, first->cubin);

  clear_memory_cache();
  EXPECT_EQ(compile_cubin(kKernel, "sm_90")->origin, Origin::disk);
}

TEST_F(JitModuleTest, TruncatedEntryIsRecompiledAndRewritten) {
  auto first = compile_cubin(kKernel, "sm_90");
  const auto size = fs::file_size(entry(*first));
  fs::resize_file(entry(*first), size - 17);

  clear_memory_cache();
  EXPECT_EQ(compile_cubin(kKernel, "sm_90")->origin, Origin::compiled);
  EXPECT_EQ(fs::file_size(entry(*first)), size);

  // A header alone, and an empty file, are not entries either.
  for (const std::string& junk : {std::string(), read_bytes(entry(*first)).substr(0, 150)}) {
    write_bytes(entry(*first), junk);
    clear_memory_cache();
    EXPECT_EQ(compile_cubin(kKernel, "sm_90")->origin, Origin::compiled);
  }
  clear_memory_cache();
  EXPECT_EQ(compile_cubin(kKernel, "sm_90")->origin, Origin::disk);
}

TEST_F(JitModuleTest, EntryForAnotherKeyIsNotTrusted) {
  auto a = compile_cubin(kKernel, "sm_90");
  auto b = compile_cubin(kKernel, "sm_90", {"-DTILE_TEST=1"});
  fs::copy_file(entry(*a), entry(*b), fs::copy_options::overwrite_existing);

  clear_memory_cache();
  auto again = compile_cubin(kKernel, "sm_90", {"-DTILE_TEST=1"});
  EXPECT_EQ(again->origin, Origin::compiled);
  EXPECT_EQ(again->cubin, b->cubin);
}

TEST_F(JitModuleTest, DisabledDiskCacheWritesNothing) {
  ::setenv("TILE_DISABLE_DISK_CACHE", "1", 1);
  EXPECT_FALSE(disk_cache_enabled());
  EXPECT_EQ(compile_cubin(kKernel, "sm_90")->origin, Origin::compiled);
  EXPECT_EQ(compile_cubin(kKernel, "sm_90")->origin, Origin::memory);
  EXPECT_FALSE(fs::exists(dir_));

  clear_memory_cache();
  EXPECT_EQ(compile_cubin(kKernel, "sm_90")->origin, Origin::compiled);

  ::setenv("TILE_DISABLE_DISK_CACHE", "0", 1);
  EXPECT_TRUE(disk_cache_enabled());
}

TEST_F(JitModuleTest, UnwritableCacheDirDoesNotFailCompile) {
  // A regular file where a directory is needed fails even for root, unlike chmod.
  fs::create_directories(dir_);
  write_bytes(dir_ / "file", "x");
  ::setenv("TILE_CACHE_DIR", (dir_ / "file" / "kernels").c_str(), 1);

  EXPECT_EQ(compile_cubin(kKernel, "sm_90")->origin, Origin::compiled);
  clear_memory_cache();
  EXPECT_EQ(compile_cubin(kKernel, "sm_90")->origin, Origin::compiled);
}

TEST_F(JitModuleTest, ClearDiskCacheRemovesOnlyEntries) {
  auto r = compile_cubin(kKernel, "sm_90");
  const fs::path leftover = dir_ / (r->key + ".cubin.tmp.123.0");
  write_bytes(leftover, "partial");
  write_bytes(dir_ / "notes.txt", "keep me");
  write_bytes(dir_ / "ABC.cubin", "keep me");

  clear_disk_cache();
  EXPECT_FALSE(fs::exists(entry(*r)));
  EXPECT_FALSE(fs::exists(leftover));
  EXPECT_TRUE(fs::exists(dir_ / "notes.txt"));
  EXPECT_TRUE(fs::exists(dir_ / "ABC.cubin"));
}

TEST_F(JitModuleTest, SyntaxErrorThrowsCompileErrorWithLogAndOptions) {
  const std::string bad = "extern \"C\" __global__ void k(int* p) {\n  p[0] = 1\n}\n";
  try {
    compile_cubin(bad, "sm_90");
    FAIL() << "expected CompileError";
  } catch (const CompileError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("NVRTC compilation failed"), std::string::npos) << what;
    EXPECT_NE(what.find("-arch=sm_90"), std::string::npos) << what;
    EXPECT_NE(e.log().find("error"), std::string::npos) << e.log();
    EXPECT_NE(what.find(e.log()), std::string::npos) << what;
    EXPECT_NE(what.find("tile_kernel.cu(3): error: expected a \";\""), std::string::npos) << what;
    EXPECT_EQ(what.find("    1 | "), std::string::npos) << what;
    EXPECT_EQ(e.options().front(), "-arch=sm_90");
  }
  EXPECT_FALSE(fs::exists(dir_) && !fs::is_empty(dir_));
}

TEST_F(JitModuleTest, ShowSourceAddsNumberedSource) {
  ::setenv("TILE_SHOW_SOURCE", "1", 1);
  try {
    compile_cubin("extern \"C\" __global__ void k() {\n  undeclared = 1;\n}\n", "sm_90");
    FAIL() << "expected CompileError";
  } catch (const CompileError& e) {
    EXPECT_NE(std::string(e.what()).find("    2 |   undeclared = 1;"), std::string::npos)
        << e.what();
  }
}

TEST_F(JitModuleTest, RejectsVirtualArchitecture) {
  EXPECT_THROW(compile_cubin(kKernel, "compute_90"), Error);
  EXPECT_THROW(compile_cubin(kKernel, "sm_"), Error);
}

TEST_F(JitModuleTest, GetFunctionNeedsDriver) {
  if (driver_available())
    GTEST_SKIP() << "a CUDA driver is present; covered by backend.cuda.driver_gpu";
  auto r = compile_cubin(kKernel, "sm_90");
  EXPECT_THROW(get_function(*r, "scale"), NoDriverError);
}

TEST(JitModuleEnv, CacheDirDefaultsAndVersion) {
  auto saved = [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    return v ? std::optional<std::string>(v) : std::nullopt;
  };
  const auto cache = saved("TILE_CACHE_DIR"), xdg = saved("XDG_CACHE_HOME"), home = saved("HOME");

  ::unsetenv("TILE_CACHE_DIR");
  ::setenv("XDG_CACHE_HOME", "/xdg", 1);
  EXPECT_EQ(cache_dir(), fs::path("/xdg/tile/kernels"));
  ::unsetenv("XDG_CACHE_HOME");
  ::setenv("HOME", "/home/someone", 1);
  EXPECT_EQ(cache_dir(), fs::path("/home/someone/.cache/tile/kernels"));
  ::unsetenv("HOME");
  EXPECT_TRUE(cache_dir().empty());
  EXPECT_FALSE(disk_cache_enabled());
  ::setenv("TILE_CACHE_DIR", "/explicit", 1);
  EXPECT_EQ(cache_dir(), fs::path("/explicit"));

  for (auto [name, value] :
       {std::pair{"TILE_CACHE_DIR", cache}, {"XDG_CACHE_HOME", xdg}, {"HOME", home}}) {
    if (value)
      ::setenv(name, value->c_str(), 1);
    else
      ::unsetenv(name);
  }
}

}  // namespace
}  // namespace tile::cuda
