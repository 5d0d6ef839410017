#include "backend/cuda/jit_module.hpp"

#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>
#include <unordered_map>

#include "backend/cuda/driver.hpp"
#include "backend/cuda/nvrtc.hpp"
#include "core/sha256.hpp"

namespace tile::cuda {
namespace fs = std::filesystem;

namespace {

// Disk entry: one text header line "tile-cubin v1 <key> <payload bytes> <payload sha256>\n",
// then the CUBIN. Bump kFormatVersion when the layout changes; old entries then fail to verify.
constexpr const char* kMagic = "tile-cubin";
constexpr const char* kFormatVersion = "v1";
constexpr const char* kProgramName = "tile_kernel.cu";

std::string getenv_str(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string join(const std::vector<std::string>& parts, const char* sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
  return out;
}

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

// True when `path` holds a verified entry for `key`; fills cubin and cubin_sha256.
bool read_entry(const fs::path& path, const std::string& key, CompileResult& r) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t nl = bytes.find('\n');
  if (nl == std::string::npos || nl > 256) return false;
  std::istringstream header(bytes.substr(0, nl));
  std::string magic, version, entry_key, sha, extra;
  unsigned long long length = 0;
  if (!(header >> magic >> version >> entry_key >> length >> sha) || (header >> extra))
    return false;
  if (magic != kMagic || version != kFormatVersion || entry_key != key) return false;
  if (length != bytes.size() - nl - 1) return false;
  std::string payload = bytes.substr(nl + 1);
  if (sha256_hex(payload) != sha) return false;
  r.cubin = std::move(payload);
  r.cubin_sha256 = std::move(sha);
  return true;
}

void warn_write_failed_once(const fs::path& where, const std::string& why) {
  static std::once_flag once;
  std::call_once(once, [&] {
    std::fprintf(stderr,
                 "tile: warning: cannot write the kernel cache (%s: %s); kernels are compiled "
                 "but not cached on disk\n",
                 where.c_str(), why.c_str());
  });
}

// Writes to a unique temporary file in the same directory, then renames it into place, so
// readers see either no entry or a whole one. Failures only warn.
void write_entry(const fs::path& dir, const std::string& key, const CompileResult& r) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return warn_write_failed_once(dir, ec.message());

  static std::atomic<unsigned long> sequence{0};
  const fs::path final_path = dir / (key + ".cubin");
  const fs::path tmp =
      dir / (key + ".cubin.tmp." + std::to_string(::getpid()) + "." + std::to_string(sequence++));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return warn_write_failed_once(tmp, std::strerror(errno));
    out << kMagic << ' ' << kFormatVersion << ' ' << key << ' ' << r.cubin.size() << ' '
        << r.cubin_sha256 << '\n';
    out.write(r.cubin.data(), static_cast<std::streamsize>(r.cubin.size()));
    out.close();
    if (!out) {
      fs::remove(tmp, ec);
      return warn_write_failed_once(tmp, "write failed");
    }
  }
  fs::rename(tmp, final_path, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    warn_write_failed_once(final_path, ec.message());
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
  const std::string off = getenv_str("TILE_DISABLE_DISK_CACHE");
  return (off.empty() || off == "0") && !cache_dir().empty();
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
  if (use_disk && read_entry(dir / (r.key + ".cubin"), r.key, r)) {
    r.origin = CompileResult::Origin::disk;
    r.compile_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  } else {
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
  const CUcontext ctx = ensure_context();

  static std::mutex mutex;
  static std::map<std::pair<CUcontext, std::string>, CUmodule> modules;
  static std::map<std::tuple<CUcontext, std::string, std::string>, CUfunction> functions;
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
