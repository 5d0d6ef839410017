#include "backend/cuda/nvrtc.hpp"

#include <cuda.h>  // CUDA_VERSION: the toolkit Tile was built with
#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <utility>

#include "core/text.hpp"

namespace tile::cuda {
namespace {
namespace fs = std::filesystem;

#define TILE_NVRTC_STRINGIFY_(x) #x
#define TILE_NVRTC_STRINGIFY(x) TILE_NVRTC_STRINGIFY_(x)

constexpr int kSupportedMajors[] = {13, 12};

std::string soname(int major) { return "libnvrtc.so." + std::to_string(major); }

// Where NVIDIA's wheels put libnvrtc: one folder per CUDA major from 13 on, cuda_nvrtc/ before.
fs::path wheel_file(int major) {
  const fs::path dir = major >= 13 ? fs::path("nvidia") / ("cu" + std::to_string(major)) / "lib"
                                   : fs::path("nvidia") / "cuda_nvrtc" / "lib";
  return dir / soname(major);
}

std::mutex& python_dirs_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::vector<std::string>& registered_python_dirs() {
  static std::vector<std::string> dirs;
  return dirs;
}

// One search: the places in order, each noted for the error message when it yields nothing.
class Search {
 public:
  explicit Search(NvrtcLibrary& out) : out_(out) {}

  // dlopen()s `name` (a path, or a soname for the loader to resolve) and binds every function.
  bool open(const std::string& name, int flags, std::string& why) {
    dlerror();
    void* raw = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL | flags);
    if (!raw) {
      const char* e = dlerror();
      why = e ? e : "dlopen failed";
      return false;
    }
    std::shared_ptr<void> handle(raw, [](void* h) { dlclose(h); });
    Nvrtc table;
    // An older libnvrtc lacking a function is skipped (and closed), not half used.
#define TILE_NVRTC_LOAD(fn)                                                              \
  table.fn = reinterpret_cast<decltype(table.fn)>(dlsym(raw, TILE_NVRTC_STRINGIFY(fn))); \
  if (!table.fn) {                                                                       \
    why = "lacks " TILE_NVRTC_STRINGIFY(fn);                                             \
    return false;                                                                        \
  }
    TILE_NVRTC_FUNCTIONS(TILE_NVRTC_LOAD)
#undef TILE_NVRTC_LOAD
    out_.table = table;
    out_.handle = std::move(handle);
    return true;
  }

  // Tries the files that exist, in order; `place` names them in the message.
  bool files(const std::string& place, const std::vector<fs::path>& candidates) {
    std::vector<std::string> failed, absent;
    for (const fs::path& file : candidates) {
      std::error_code ec;
      if (!fs::exists(file, ec)) {
        absent.push_back(file.string());
        continue;
      }
      std::string why;
      if (open(file.string(), 0, why)) return found(place, file.string());
      failed.push_back(file.string() + ": " + why);
    }
    if (failed.empty())
      note(place, absent.empty() ? "nothing to look at" : "no " + join(absent, ", "));
    else
      note(place, join(failed, "; "));
    return false;
  }

  bool found(const std::string& place, std::string path) {
    out_.found_by = place;
    out_.path = std::move(path);
    return true;
  }

  // The loaded file's path as the dynamic loader resolved it.
  static std::string path_of(void* handle) {
    link_map* map = nullptr;
    if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name) return map->l_name;
    return {};
  }

  void note(const std::string& place, const std::string& what) { looked_.push_back("  " + place + ": " + what); }
  std::string message() const {
    return "no NVRTC found; looked in:\n" + join(looked_, "\n") +
           "\nInstall it (pip install nvidia-cuda-nvrtc, or the CUDA toolkit) or set "
           "TILE_NVRTC_LIBRARY to the path of libnvrtc.so.";
  }

 private:
  NvrtcLibrary& out_;
  std::vector<std::string> looked_;
};

}  // namespace

std::vector<int> nvrtc_majors() {
  std::vector<int> majors = {CUDA_VERSION / 1000};
  for (int m : kSupportedMajors)
    if (std::find(majors.begin(), majors.end(), m) == majors.end()) majors.push_back(m);
  return majors;
}

void set_python_package_dirs(std::vector<std::string> dirs) {
  std::lock_guard lock(python_dirs_mutex());
  registered_python_dirs() = std::move(dirs);
}

NvrtcSearch NvrtcSearch::from_environment() {
  NvrtcSearch s;
  s.library = getenv_str("TILE_NVRTC_LIBRARY");
  {
    std::lock_guard lock(python_dirs_mutex());
    s.python_dirs = registered_python_dirs();
  }
  s.conda_prefix = getenv_str("CONDA_PREFIX");
  s.cuda_home = getenv_str("CUDA_HOME");
  s.cuda_path = getenv_str("CUDA_PATH");
  s.system_dirs = {"/usr/local/cuda/lib64"};
  return s;
}

NvrtcLibrary find_nvrtc(const NvrtcSearch& s) {
  NvrtcLibrary out;
  Search search(out);
  const std::vector<int> majors = nvrtc_majors();
  std::vector<std::string> sonames;
  for (int m : majors) sonames.push_back(soname(m));
  auto in_dir = [&](const fs::path& dir) {
    std::vector<fs::path> files;
    for (const std::string& name : sonames) files.push_back(dir / name);
    return files;
  };

  // 1. An explicit library is the only one tried: a wrong path is an error, not a fallback.
  if (!s.library.empty()) {
    std::string why;
    if (search.open(s.library, 0, why)) {
      search.found("TILE_NVRTC_LIBRARY", s.library);
      return out;
    }
    search.note("TILE_NVRTC_LIBRARY=" + s.library, why + " (set, so nothing else was tried)");
    out.error = search.message();
    return out;
  }
  search.note("TILE_NVRTC_LIBRARY", "not set");

  // 2. A second NVRTC of the same soname next to one torch loaded would only waste memory.
  if (s.loaded_in_process) {
    for (const std::string& name : sonames) {
      std::string why;
      if (search.open(name, RTLD_NOLOAD, why)) {
        search.found("this process", Search::path_of(out.handle.get()));
        return out;
      }
    }
    search.note("this process", "no " + join(sonames, " or ") + " loaded");
  }

  // 3. NVIDIA's wheels.
  {
    std::vector<fs::path> files;
    for (const std::string& dir : s.python_dirs)
      for (int m : majors) files.push_back(fs::path(dir.empty() ? "." : dir) / wheel_file(m));
    if (s.python_dirs.empty())
      search.note("Python package folders", "none given (Tile was not imported from Python)");
    else if (search.files("Python package folders", files))
      return out;
  }

  // 4. Conda and the toolkit named by the environment.
  for (auto [var, value] :
       {std::pair{"CONDA_PREFIX", &s.conda_prefix}, {"CUDA_HOME", &s.cuda_home}, {"CUDA_PATH", &s.cuda_path}}) {
    const std::string place = std::string("$") + var;
    if (value->empty()) {
      search.note(place, "not set");
      continue;
    }
    std::vector<fs::path> files;
    const bool conda = std::string(var) == "CONDA_PREFIX";
    for (const char* lib : {"lib64", "lib"}) {
      if (conda && std::string(lib) == "lib64") continue;  // conda keeps libraries in lib/
      for (const fs::path& f : in_dir(fs::path(*value) / lib)) files.push_back(f);
    }
    if (search.files(place, files)) return out;
  }

  // 5. The toolkit's usual home.
  for (const std::string& dir : s.system_dirs)
    if (search.files(dir, in_dir(dir))) return out;

  // 6. LD_LIBRARY_PATH, ld.so.cache.
  if (s.default_loader) {
    std::vector<std::string> failed;
    for (const std::string& name : sonames) {
      std::string why;
      if (search.open(name, 0, why)) {
        search.found("the dynamic loader", Search::path_of(out.handle.get()));
        return out;
      }
      failed.push_back(why);
    }
    search.note("the dynamic loader", join(failed, "; "));
  }
  out.error = search.message();
  return out;
}

namespace {

const NvrtcLibrary& loaded() {
  // Never dlclosed: NVRTC stays mapped for the life of the process, like the driver.
  static const NvrtcLibrary* library = new NvrtcLibrary(find_nvrtc(NvrtcSearch::from_environment()));
  return *library;
}

}  // namespace

const Nvrtc& nvrtc() {
  const NvrtcLibrary& lib = loaded();
  if (!lib.error.empty()) throw NoDriverError(lib.error);
  return lib.table;
}

bool nvrtc_available() noexcept {
  try {
    return loaded().error.empty();
  } catch (...) {
    return false;
  }
}

std::string nvrtc_library() {
  nvrtc();
  return loaded().path;
}

}  // namespace tile::cuda
