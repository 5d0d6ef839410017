#include "backend/cuda/jit_module.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>
#include <unordered_map>

#include "backend/cuda/driver.hpp"
#include "backend/cuda/nvrtc.hpp"
#include "core/sha256.hpp"
#include "core/text.hpp"

namespace tile::cuda {
namespace fs = std::filesystem;

namespace {

// Disk entry: one text header line "tile-cubin v1 <key> <payload bytes> <payload sha256>\n",
// then the CUBIN. Bump kFormatVersion when the layout changes; old entries then fail to verify.
constexpr const char* kMagic = "tile-cubin";
constexpr const char* kFormatVersion = "v1";
constexpr const char* kProgramName = "tile_kernel.cu";

std::string numbered(const std::string& source) {
  std::ostringstream os;
  std::istringstream in(source);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    char prefix[16];
    std::snprintf(prefix, sizeof(prefix), "%5d | ", n);
    os << prefix << line << '\n';
  }
  return os.str();
}

// Fills cubin, log and compile_ms; throws CompileError when NVRTC rejects the source.
void run_nvrtc(const std::string& source, CompileResult& r) {
  const auto start = std::chrono::steady_clock::now();
  nvrtcProgram prog = nullptr;
  TILE_NVRTC_CHECK(nvrtc().nvrtcCreateProgram(&prog, source.c_str(), kProgramName, 0, nullptr, nullptr));
  struct Destroy {
    nvrtcProgram* p;
    ~Destroy() { nvrtc().nvrtcDestroyProgram(p); }
  } destroy{&prog};

  std::vector<const char*> argv;
  for (const std::string& o : r.options) argv.push_back(o.c_str());
  const nvrtcResult compiled =
      nvrtc().nvrtcCompileProgram(prog, static_cast<int>(argv.size()), argv.data());

  size_t log_size = 0;
  TILE_NVRTC_CHECK(nvrtc().nvrtcGetProgramLogSize(prog, &log_size));
  std::string log(log_size, '\0');
  if (log_size > 0) TILE_NVRTC_CHECK(nvrtc().nvrtcGetProgramLog(prog, log.data()));
  while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();

  if (compiled != NVRTC_SUCCESS) {
    std::string msg = std::string("NVRTC compilation failed (") + nvrtc().nvrtcGetErrorString(compiled) +
                      ") for " + r.arch + ", source sha256 " + r.source_sha256 +
                      "\noptions: " + join(r.options, " ") + "\nlog:\n" + log;
    if (getenv_str("TILE_SHOW_SOURCE") == "1")
      msg += "\nsource:\n" + numbered(source);
    else
      msg += "\n(set TILE_SHOW_SOURCE=1 to print the numbered source)";
    throw CompileError(msg, log, r.options);
  }

  size_t cubin_size = 0;
  TILE_NVRTC_CHECK(nvrtc().nvrtcGetCUBINSize(prog, &cubin_size));
  r.cubin.assign(cubin_size, '\0');
  TILE_NVRTC_CHECK(nvrtc().nvrtcGetCUBIN(prog, r.cubin.data()));
  r.log = std::move(log);
  r.cubin_sha256 = sha256_hex(r.cubin);
  r.compile_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

// ---- disk cache ---------------------------------------------------------------------------

bool looks_like_entry(const std::string& name) {
  // "<64 hex>.cubin" or a leftover "<64 hex>.cubin.tmp.<pid>.<n>" from an interrupted write.
  if (name.size() < 70 || name.compare(64, 6, ".cubin") != 0) return false;
  for (size_t i = 0; i < 64; ++i)
    if (!std::isxdigit(static_cast<unsigned char>(name[i])) ||
        std::isupper(static_cast<unsigned char>(name[i])))
      return false;
  return name.size() == 70 || name.compare(70, 5, ".tmp.") == 0;
}

// Entries are read and written only up to this size: a generated kernel's CUBIN is tens of
// KiB, and the bound keeps a damaged or hostile file (huge, sparse) out of memory.
constexpr uint64_t kMaxEntryBytes = uint64_t(64) << 20;
constexpr size_t kMaxHeaderBytes = 256;

std::string errno_text(int error) { return std::strerror(error); }

// Every disk-cache problem only costs a compile; the first one in a process is reported.
void warn_once(const fs::path& where, const std::string& why) {
  static std::once_flag once;
  std::call_once(once, [&] {
    std::fprintf(stderr,
                 "tile: warning: kernel disk cache: %s: %s; the kernel is compiled and the disk cache "
                 "skipped (later cache problems in this process are not reported)\n",
                 where.c_str(), why.c_str());
  });
}

struct FileDescriptor {
  int fd = -1;
  ~FileDescriptor() {
    if (fd >= 0) ::close(fd);
  }
};

// False on an error or an early end of file.
bool read_fully(int fd, char* data, size_t n) {
  while (n > 0) {
    const ssize_t got = ::read(fd, data, n);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    data += got, n -= size_t(got);
  }
  return true;
}

bool write_fully(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t put = ::write(fd, data, n);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) return false;
    data += put, n -= size_t(put);
  }
  return true;
}

enum class EntryRead { hit, missing, unusable };

// Accepts only a regular file (no link followed) of at most kMaxEntryBytes whose header names
// `key`, whose length is the file's size and whose SHA-256 matches; on a hit fills cubin and
// cubin_sha256. Never blocks (a FIFO or device is refused before it is opened) and never
// throws; `why` says what was wrong with an unusable entry.
EntryRead read_entry(const fs::path& path, const std::string& key, CompileResult& r, std::string& why) {
  // Only a regular file is opened at all; the flags and fstat() cover one swapped in meanwhile.
  struct stat st{};
  if (::lstat(path.c_str(), &st) != 0) {
    const int error = errno;
    if (error == ENOENT || error == ENOTDIR) return EntryRead::missing;  // a missing folder is reported on write
    return why = "cannot stat: " + errno_text(error), EntryRead::unusable;
  }
  if (S_ISLNK(st.st_mode)) return why = "a symbolic link, not a cache entry", EntryRead::unusable;
  if (!S_ISREG(st.st_mode)) return why = "not a regular file", EntryRead::unusable;
  FileDescriptor file{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW)};
  if (file.fd < 0) {
    const int error = errno;
    if (error == ENOENT) return EntryRead::missing;  // removed since lstat(), e.g. by clear_disk_cache()
    return why = "cannot open: " + errno_text(error), EntryRead::unusable;
  }
  if (::fstat(file.fd, &st) != 0) return why = "cannot stat: " + errno_text(errno), EntryRead::unusable;
  if (!S_ISREG(st.st_mode)) return why = "not a regular file", EntryRead::unusable;
  const uint64_t size = uint64_t(st.st_size);
  if (size > kMaxEntryBytes)
    return why = std::to_string(size) + " bytes, over the " + std::to_string(kMaxEntryBytes) + "-byte cap",
           EntryRead::unusable;

  // The header first: its key and length are checked before the payload is read.
  std::string bytes(std::min<uint64_t>(size, kMaxHeaderBytes + 1), '\0');
  if (!read_fully(file.fd, bytes.data(), bytes.size())) return why = "read failed", EntryRead::unusable;
  const size_t nl = bytes.find('\n');
  if (nl == std::string::npos) return why = "no header line", EntryRead::unusable;
  std::istringstream header(bytes.substr(0, nl));
  std::string magic, version, entry_key, sha, extra;
  unsigned long long length = 0;
  if (!(header >> magic >> version >> entry_key >> length >> sha) || (header >> extra) || magic != kMagic ||
      version != kFormatVersion)
    return why = "not a " + std::string(kMagic) + " " + kFormatVersion + " header", EntryRead::unusable;
  if (entry_key != key) return why = "the header names another key", EntryRead::unusable;
  if (length != size - nl - 1)
    return why = "the header's length " + std::to_string(length) + " does not match the file's " +
                 std::to_string(size - nl - 1) + " payload bytes",
           EntryRead::unusable;

  const size_t have = bytes.size();
  bytes.resize(size);
  if (!read_fully(file.fd, bytes.data() + have, size - have)) return why = "read failed", EntryRead::unusable;
  bytes.erase(0, nl + 1);
  if (sha256_hex(bytes) != sha) return why = "the payload's SHA-256 does not match", EntryRead::unusable;
  r.cubin = std::move(bytes);
  r.cubin_sha256 = std::move(sha);
  return EntryRead::hit;
}

// Writes a fresh temporary file in the same folder (O_EXCL, no link followed), then renames it
// into place, so readers see either no entry or a whole one. Failures only warn.
void write_entry(const fs::path& dir, const std::string& key, const CompileResult& r) {
  const fs::path final_path = dir / (key + ".cubin");
  const std::string header = std::string(kMagic) + ' ' + kFormatVersion + ' ' + key + ' ' +
                             std::to_string(r.cubin.size()) + ' ' + r.cubin_sha256 + '\n';
  if (header.size() + r.cubin.size() > kMaxEntryBytes)
    return warn_once(final_path, "the entry would exceed the " + std::to_string(kMaxEntryBytes) + "-byte cap");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return warn_once(dir, "cannot create the folder: " + ec.message());

  static std::atomic<unsigned long> sequence{0};
  const fs::path tmp =
      dir / (key + ".cubin.tmp." + std::to_string(::getpid()) + "." + std::to_string(sequence++));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return warn_once(tmp, "cannot create: " + errno_text(errno));
  bool written = write_fully(fd, header.data(), header.size()) && write_fully(fd, r.cubin.data(), r.cubin.size());
  int error = written ? 0 : errno;
  if (::close(fd) != 0 && written) written = false, error = errno;  // e.g. a full disk reported late
  if (!written) {
    ::unlink(tmp.c_str());
    return warn_once(tmp, "write failed: " + errno_text(error));
  }
  if (::rename(tmp.c_str(), final_path.c_str()) != 0) {
    const int error = errno;
    ::unlink(tmp.c_str());
    warn_once(final_path, "cannot rename the new entry into place: " + errno_text(error));
  }
}

// ---- memory cache -------------------------------------------------------------------------

struct MemoryCache {
  std::mutex mutex;
  // Stored with origin memory and compile_ms 0, so hits are returned without a copy.
  std::unordered_map<std::string, std::shared_ptr<const CompileResult>> entries;
};

MemoryCache& memory_cache() {
  static MemoryCache cache;
  return cache;
}

std::string make_key(const std::string& source_sha256, const std::string& arch,
                     const std::vector<std::string>& options) {
  // NUL separators keep ("a","bc") and ("ab","c") apart.
  std::string material = std::string(kMagic) + '\0' + kFormatVersion + '\0' + source_sha256 + '\0' +
                         nvrtc_version() + '\0' + arch;
  for (const std::string& o : options) material += '\0' + o;
  return sha256_hex(material);
}

}  // namespace

std::string nvrtc_version() {
  static const std::string version = [] {
    int major = 0, minor = 0;
    TILE_NVRTC_CHECK(nvrtc().nvrtcVersion(&major, &minor));
    return std::to_string(major) + "." + std::to_string(minor);
  }();
  return version;
}

fs::path cache_dir() {
  if (std::string dir = getenv_str("TILE_CACHE_DIR"); !dir.empty()) return dir;
  if (std::string xdg = getenv_str("XDG_CACHE_HOME"); !xdg.empty())
    return fs::path(xdg) / "tile" / "kernels";
  if (std::string home = getenv_str("HOME"); !home.empty())
    return fs::path(home) / ".cache" / "tile" / "kernels";
  return {};
}

bool disk_cache_enabled() {
  // The usual spellings of "no" keep the cache (TILE_DISABLE_DISK_CACHE=false once disabled it).
  std::string off = getenv_str("TILE_DISABLE_DISK_CACHE");
  for (char& c : off) c = char(std::tolower(static_cast<unsigned char>(c)));
  const bool keep = off.empty() || off == "0" || off == "false" || off == "no" || off == "off";
  return keep && !cache_dir().empty();
}

void clear_memory_cache() {
  MemoryCache& cache = memory_cache();
  std::lock_guard lock(cache.mutex);
  cache.entries.clear();
}

void clear_disk_cache() {
  const fs::path dir = cache_dir();
  std::error_code ec;
  if (dir.empty() || !fs::is_directory(dir, ec)) return;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    if (e.is_regular_file(ec) && looks_like_entry(e.path().filename().string()))
      fs::remove(e.path(), ec);
  }
}

std::shared_ptr<const CompileResult> compile_cubin(const std::string& source,
                                                   const std::string& arch,
                                                   const std::vector<std::string>& extra_options) {
  // NVRTC emits a CUBIN only for real architectures; compute_XX would yield PTX alone.
  if (arch.size() <= 3 || arch.compare(0, 3, "sm_") != 0)
    throw_argument_error("compile_cubin", "arch", "a real architecture such as \"sm_90\"",
                         "\"" + arch + "\"");

  auto result = std::make_shared<CompileResult>();
  CompileResult& r = *result;
  r.arch = arch;
  r.options = {"-arch=" + arch, "-std=c++17", "-lineinfo"};
  r.options.insert(r.options.end(), extra_options.begin(), extra_options.end());
  r.source_sha256 = sha256_hex(source);
  r.key = make_key(r.source_sha256, arch, r.options);

  MemoryCache& cache = memory_cache();
  {
    std::lock_guard lock(cache.mutex);
    if (auto it = cache.entries.find(r.key); it != cache.entries.end()) return it->second;
  }

  // Two threads missing on one key both compile; the first to finish fills the map.
  const fs::path dir = cache_dir();
  const bool use_disk = disk_cache_enabled();
  const auto start = std::chrono::steady_clock::now();
  const fs::path entry = dir / (r.key + ".cubin");
  std::string why;
  if (use_disk && read_entry(entry, r.key, r, why) == EntryRead::hit) {
    r.origin = CompileResult::Origin::disk;
    r.compile_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  } else {
    if (!why.empty()) warn_once(entry, why);
    run_nvrtc(source, r);
    r.origin = CompileResult::Origin::compiled;
    if (use_disk) write_entry(dir, r.key, r);
  }

  auto cached = std::make_shared<CompileResult>(r);
  cached->origin = CompileResult::Origin::memory;
  cached->compile_ms = 0.0;
  std::lock_guard lock(cache.mutex);
  cache.entries.emplace(r.key, std::move(cached));
  return result;
}

CUfunction get_function(const CompileResult& module, const std::string& kernel_name) {
  const Driver& d = driver();
  TILE_CHECK(!module.cubin.empty() && !module.key.empty(), "get_function needs a compiled module");
  // By context id, not handle: a handle may be reused by a later context, an id never is.
  const uint64_t ctx = context_id(ensure_context());

  static std::mutex mutex;
  static std::map<std::pair<uint64_t, std::string>, CUmodule> modules;
  static std::map<std::tuple<uint64_t, std::string, std::string>, CUfunction> functions;
  std::lock_guard lock(mutex);
  auto fkey = std::make_tuple(ctx, module.key, kernel_name);
  if (auto it = functions.find(fkey); it != functions.end()) return it->second;

  auto mkey = std::make_pair(ctx, module.key);
  auto mit = modules.find(mkey);
  if (mit == modules.end()) {
    CUmodule loaded = nullptr;
    if (CUresult res = d.cuModuleLoadData(&loaded, module.cubin.data()); res != CUDA_SUCCESS)
      throw Error("get_function: cannot load the " + module.arch + " module " +
                  module.key.substr(0, 12) + " on device " + std::to_string(current_device()) +
                  ": " + cu_error_string(res));
    mit = modules.emplace(mkey, loaded).first;
  }
  CUfunction fn = nullptr;
  if (CUresult res = d.cuModuleGetFunction(&fn, mit->second, kernel_name.c_str());
      res != CUDA_SUCCESS)
    throw Error("get_function: kernel '" + kernel_name + "' not found in module " +
                module.key.substr(0, 12) + ": " + cu_error_string(res));
  functions.emplace(std::move(fkey), fn);
  return fn;
}

}  // namespace tile::cuda
