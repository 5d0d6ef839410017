// NVRTC compile and the two cache levels; host only (NVRTC needs no GPU).
#include "backend/cuda/jit_module.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <iterator>
#include <optional>
#include <thread>
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

// compile_cubin() with a deadline: a compile blocked by a cache entry (a FIFO, say) ends the
// test process with a message instead of hanging it; the stuck thread cannot be joined.
std::shared_ptr<const CompileResult> compile_guarded(const std::string& source,
                                                     const std::vector<std::string>& options = {}) {
  using Result = std::shared_ptr<const CompileResult>;
  auto task = std::make_shared<std::packaged_task<Result()>>([=] { return compile_cubin(source, "sm_90", options); });
  std::future<Result> done = task->get_future();
  std::thread([task] { (*task)(); }).detach();
  if (done.wait_for(std::chrono::seconds(120)) != std::future_status::ready) {
    std::fprintf(stderr, "FAILED: compile_cubin did not return within 120 s (blocked on a cache entry?)\n");
    std::fflush(stderr);
    std::_Exit(1);
  }
  return done.get();
}

// The CUBIN of kKernel compiled without any cache, to compare every cached result with.
const std::string& reference_cubin() {
  static const std::string cubin = [] {
    const char* saved = std::getenv("TILE_DISABLE_DISK_CACHE");
    const std::string restore = saved ? saved : "";
    ::setenv("TILE_DISABLE_DISK_CACHE", "1", 1);
    clear_memory_cache();
    std::string bytes = compile_cubin(kKernel, "sm_90")->cubin;
    clear_memory_cache();
    if (saved)
      ::setenv("TILE_DISABLE_DISK_CACHE", restore.c_str(), 1);
    else
      ::unsetenv("TILE_DISABLE_DISK_CACHE");
    return bytes;
  }();
  return cubin;
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
    std::error_code ignored;
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::add, ignored);  // after a read-only test
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
  // The spellings of "no" keep the cache; any other value turns it off.
  for (const char* keep : {"", "false", "No", "OFF"}) {
    ::setenv("TILE_DISABLE_DISK_CACHE", keep, 1);
    EXPECT_TRUE(disk_cache_enabled()) << "'" << keep << "'";
  }
  for (const char* off : {"true", "yes", "2", " "}) {
    ::setenv("TILE_DISABLE_DISK_CACHE", off, 1);
    EXPECT_FALSE(disk_cache_enabled()) << "'" << off << "'";
  }
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

TEST_F(JitModuleTest, ConcurrentCompilesWhileCachesAreCleared) {
  // Three kernels compiled once each without any cache, then by four threads at once while a
  // fifth empties the memory and disk caches: every result must be its own kernel's CUBIN.
  const std::vector<std::vector<std::string>> options = {{}, {"-DTILE_TEST=1"}, {"-DTILE_TEST=2"}};
  const std::string sources[] = {kKernel, std::string(kKernel) + "// b\n", std::string(kKernel) + "// c\n"};
  ::setenv("TILE_DISABLE_DISK_CACHE", "1", 1);
  std::vector<std::string> expected;
  for (size_t i = 0; i < 3; ++i) expected.push_back(compile_cubin(sources[i], "sm_90", options[i])->cubin);
  ::unsetenv("TILE_DISABLE_DISK_CACHE");
  clear_memory_cache();

  std::atomic<bool> done{false};
  std::atomic<int> clears{0};
  std::thread clearer([&] {
    while (!done.load()) {
      clear_memory_cache();
      if (clears++ % 4 == 3) clear_disk_cache();
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  std::atomic<int> checked{0}, wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int n = 0; n < 12; ++n) {
        const size_t i = size_t(t + n) % 3;
        auto r = compile_cubin(sources[i], "sm_90", options[i]);
        if (r->cubin != expected[i] || r->cubin_sha256 != sha256_hex(expected[i])) ++wrong;
        ++checked;
      }
    });
  for (std::thread& t : threads) t.join();
  done = true;
  clearer.join();
  EXPECT_EQ(checked.load(), 48);
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GT(clears.load(), 0);
}

// ---- hostile or damaged entries: each is recompiled (correct CUBIN), never thrown, never blocks

// Puts something at kKernel's entry path, then expects a compile with the reference CUBIN and,
// when the entry can be replaced, the rewritten entry read back from disk.
class HostileEntryTest : public JitModuleTest {
 protected:
  fs::path kernel_entry() {
    fs::create_directories(dir_);
    return dir_ / (compile_key() + ".cubin");
  }
  // The key kKernel compiles under, found without leaving an entry behind.
  std::string compile_key() {
    ::setenv("TILE_DISABLE_DISK_CACHE", "1", 1);
    const std::string key = compile_cubin(kKernel, "sm_90")->key;
    ::unsetenv("TILE_DISABLE_DISK_CACHE");
    clear_memory_cache();
    return key;
  }
  void expect_recompiled(const fs::path& path, bool replaceable) {
    auto r = compile_guarded(kKernel);
    EXPECT_EQ(r->origin, Origin::compiled);
    EXPECT_EQ(r->cubin, reference_cubin());
    clear_memory_cache();
    auto again = compile_guarded(kKernel);
    EXPECT_EQ(again->cubin, reference_cubin());
    if (replaceable) {
      EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(path))) << path;
      EXPECT_EQ(again->origin, Origin::disk);
    } else {
      EXPECT_EQ(again->origin, Origin::compiled);
    }
  }
};

TEST_F(HostileEntryTest, FifoIsNotOpenedForReading) {
  const fs::path path = kernel_entry();
  ASSERT_EQ(::mkfifo(path.c_str(), 0644), 0);
  expect_recompiled(path, true);
}

TEST_F(HostileEntryTest, SymlinkToDevZeroIsNotFollowed) {
  const fs::path path = kernel_entry();
  fs::create_symlink("/dev/zero", path);
  expect_recompiled(path, true);
}

TEST_F(HostileEntryTest, SymlinkToValidEntryIsNotFollowed) {
  const fs::path path = kernel_entry();
  compile_guarded(kKernel);
  fs::rename(path, dir_ / "elsewhere");
  fs::create_symlink(dir_ / "elsewhere", path);
  clear_memory_cache();
  expect_recompiled(path, true);
}

TEST_F(HostileEntryTest, SparseTenGiBFileWithPlausibleHeaderIsNotRead) {
  // The header names the right key and a length that matches the file: only the size cap
  // refuses it, before any of its 10 GiB is read.
  const fs::path path = kernel_entry();
  const uint64_t size = uint64_t(10) << 30;
  const std::string key = path.stem().string();
  const std::string prefix = "tile-cubin v1 " + key + " ", suffix = " " + std::string(64, '0') + "\n";
  const uint64_t length = size - prefix.size() - suffix.size() - std::to_string(size).size();
  ASSERT_EQ(std::to_string(length).size(), std::to_string(size).size());
  write_bytes(path, prefix + std::to_string(length) + suffix);
  fs::resize_file(path, size);
  ASSERT_EQ(fs::file_size(path), size);
  // With 4 GiB of address space to spare, reading the file whole throws std::bad_alloc at once
  // rather than succeeding slowly on a machine with memory to spare.
  std::ifstream status("/proc/self/status");
  uint64_t vm_kib = 0;
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmSize:", 0) == 0) vm_kib = std::stoull(line.substr(7));
  ASSERT_GT(vm_kib, 0u);
  struct AddressSpaceLimit {
    rlimit saved{};
    explicit AddressSpaceLimit(uint64_t bytes) {
      ::getrlimit(RLIMIT_AS, &saved);
      rlimit limited = saved;
      limited.rlim_cur = std::min<rlim_t>(saved.rlim_max, bytes);
      ::setrlimit(RLIMIT_AS, &limited);
    }
    ~AddressSpaceLimit() { ::setrlimit(RLIMIT_AS, &saved); }
  } limit(vm_kib * 1024 + (uint64_t(4) << 30));
  expect_recompiled(path, true);
}

TEST_F(HostileEntryTest, DirectoryAtEntryPath) {
  const fs::path path = kernel_entry();
  fs::create_directories(path / "inside");
  expect_recompiled(path, false);
  EXPECT_TRUE(fs::is_directory(path / "inside"));  // never removed: not ours
}

TEST_F(HostileEntryTest, TruncatedEntry) {
  const fs::path path = kernel_entry();
  compile_guarded(kKernel);
  std::string bytes = read_bytes(path);
  write_bytes(path, bytes.substr(0, bytes.size() / 2));
  clear_memory_cache();
  expect_recompiled(path, true);
  EXPECT_EQ(read_bytes(path), bytes);
}

TEST_F(HostileEntryTest, EntryWithAnotherKey) {
  // A whole, self-consistent entry of another kernel under this kernel's name.
  const fs::path path = kernel_entry();
  auto other = compile_guarded(kKernel, {"-DTILE_TEST=2"});
  fs::copy_file(dir_ / (other->key + ".cubin"), path, fs::copy_options::overwrite_existing);
  clear_memory_cache();
  expect_recompiled(path, true);
}

TEST_F(HostileEntryTest, HeaderLengthDisagreesWithFileSize) {
  const fs::path path = kernel_entry();
  compile_guarded(kKernel);
  write_bytes(path, read_bytes(path) + "trailing");
  clear_memory_cache();
  expect_recompiled(path, true);
}

TEST_F(HostileEntryTest, PermissionDeniedFolder) {
  // An unreadable entry in a folder nobody may write. Root bypasses permissions, so a root
  // process runs the compile as "nobody" (effective uid only; restored afterwards).
  const fs::path path = kernel_entry();
  write_bytes(path, "unreadable");
  fs::permissions(path, fs::perms::none);
  fs::permissions(dir_, fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read |
                            fs::perms::group_exec | fs::perms::others_read | fs::perms::others_exec);
  reference_cubin();
  struct RunAsNobody {
    bool switched = ::geteuid() == 0 && ::seteuid(65534) == 0;
    ~RunAsNobody() {
      if (switched) {
        EXPECT_EQ(::seteuid(0), 0);
      }
    }
  } nobody;
  ASSERT_NE(::faccessat(AT_FDCWD, path.c_str(), R_OK, AT_EACCESS), 0) << "the entry should be unreadable";
  auto r = compile_guarded(kKernel);
  EXPECT_EQ(r->origin, Origin::compiled);
  EXPECT_EQ(r->cubin, reference_cubin());
  clear_memory_cache();
  EXPECT_EQ(compile_guarded(kKernel)->origin, Origin::compiled);  // still nothing could be written
}

TEST_F(HostileEntryTest, FailedWriteLeavesNoEntry) {
  // A file size limit makes the write fail part way (EFBIG); no partial entry may remain.
  const fs::path path = kernel_entry();
  struct FileSizeLimit {
    rlimit saved{};
    void (*saved_handler)(int) = ::signal(SIGXFSZ, SIG_IGN);
    FileSizeLimit() {
      ::getrlimit(RLIMIT_FSIZE, &saved);
      rlimit limited = saved;
      limited.rlim_cur = 100;
      ::setrlimit(RLIMIT_FSIZE, &limited);
    }
    ~FileSizeLimit() {
      ::setrlimit(RLIMIT_FSIZE, &saved);
      ::signal(SIGXFSZ, saved_handler);
    }
  };
  {
    FileSizeLimit limit;
    auto r = compile_guarded(kKernel);
    EXPECT_EQ(r->origin, Origin::compiled);
    EXPECT_EQ(r->cubin, reference_cubin());
  }
  EXPECT_FALSE(fs::exists(path));
  for (const fs::directory_entry& e : fs::directory_iterator(dir_)) ADD_FAILURE() << "left behind: " << e.path();
  clear_memory_cache();
  expect_recompiled(path, true);  // written once the limit is gone
}

// In a fresh process (the test re-executed), many kinds of bad entries and a failed write
// give exactly one warning, naming a path and what was wrong.
TEST_F(HostileEntryTest, OneWarningPerProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        const fs::path path = kernel_entry();
        ::testing::internal::CaptureStderr();
        bool correct = true;
        ::mkfifo(path.c_str(), 0644);
        correct &= compile_guarded(kKernel)->cubin == reference_cubin();
        fs::remove(path);
        fs::create_symlink("/dev/zero", path);
        clear_memory_cache();
        correct &= compile_guarded(kKernel)->cubin == reference_cubin();
        fs::remove(path);
        fs::create_directories(path / "inside");
        clear_memory_cache();
        correct &= compile_guarded(kKernel)->cubin == reference_cubin();
        clear_memory_cache();
        correct &= compile_guarded(kKernel)->cubin == reference_cubin();
        const std::string err = ::testing::internal::GetCapturedStderr();
        size_t warnings = 0;
        for (size_t at = err.find("tile: warning"); at != std::string::npos; at = err.find("tile: warning", at + 1))
          ++warnings;
        fs::remove_all(dir_);
        std::fprintf(stderr, "warnings: %zu, correct: %d\n%s", warnings, int(correct), err.c_str());
        std::_Exit(warnings == 1 && err.find(path.string()) != std::string::npos && correct ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "warnings: 1, correct: 1");
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
