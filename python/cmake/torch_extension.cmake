# tile._torch_C, the optional C++ entry of the operators for torch tensors
# (python/src/torch_ext.cpp; docs/source/python.md, "The torch extension"). Built against the
# libtorch of the torch that ${Python_EXECUTABLE} imports, found through
# torch.utils.cmake_prefix_path and find_package(Torch). TILE_TORCH_EXTENSION: OFF (the
# default: the presets, CI and the wheel build without torch), ON (torch must be importable),
# AUTO (built where that Python imports torch). Included at the end of python/CMakeLists.txt;
# the package works the same without it, only its eager calls cost more host time.
set(TILE_TORCH_EXTENSION OFF CACHE STRING
    "Build tile._torch_C against the libtorch of the build's Python: ON, OFF or AUTO (where that Python imports torch)")
set_property(CACHE TILE_TORCH_EXTENSION PROPERTY STRINGS ON OFF AUTO)

# A function, so that what find_package(Torch) sets stays in its scope (its cache entries and
# imported targets do not).
function(tile_add_torch_extension)
  # A module an earlier configuration built would still be imported: gone unless built again.
  file(GLOB stale "${tile_package_dir}/tile/_torch_C*")
  if(stale)
    file(REMOVE ${stale})
  endif()
  string(TOUPPER "${TILE_TORCH_EXTENSION}" mode)
  if(NOT mode STREQUAL "AUTO" AND NOT TILE_TORCH_EXTENSION)
    return()
  endif()
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
            "import torch, torch.utils; print(torch.utils.cmake_prefix_path); print(torch.__version__); print(int(torch._C._GLIBCXX_USE_CXX11_ABI))"
    OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE result OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT result EQUAL 0)
    string(REGEX REPLACE ".*\n([^\n]+)\n?$" "\\1" last_line "${err}")
    set(why "TILE_TORCH_EXTENSION=${TILE_TORCH_EXTENSION}: ${Python_EXECUTABLE} cannot import torch (${last_line})")
    if(mode STREQUAL "AUTO")
      message(STATUS "tile._torch_C is not built: ${why}")
      return()
    endif()
    message(FATAL_ERROR "${why}; set TILE_TORCH_EXTENSION=OFF, or Python_EXECUTABLE to a Python with torch")
  endif()
  string(REPLACE "\n" ";" out "${out}")
  list(GET out 0 prefix)
  list(GET out 1 torch_version)
  list(GET out 2 cxx11_abi)
  if(NOT cxx11_abi)
    # libtile.so's API passes std::string: both sides must use the same library ABI.
    message(FATAL_ERROR "TILE_TORCH_EXTENSION: torch ${torch_version} was built with the pre-C++11 libstdc++ ABI "
                        "(_GLIBCXX_USE_CXX11_ABI=0), libtile.so with the C++11 one; use a torch built with the C++11 ABI")
  endif()
  # No CUDA code is compiled here: a fixed architecture list spares a CUDA torch's config its GPU
  # probe, a try_run that fails under this project's C++20 (CMake knows no CUDA20 for nvcc).
  if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
    set(TORCH_CUDA_ARCH_LIST "9.0")
  endif()
  find_package(Torch REQUIRED CONFIG PATHS "${prefix}" NO_DEFAULT_PATH)
  # Only the libraries the entry points call: no CUDA library is linked (libtile.so loads the
  # driver and NVRTC itself; torch's CUDA device guard and streams are reached through c10).
  set(torch_libs "")
  foreach(lib c10 torch_cpu torch_python)
    find_library(tile_torch_${lib} ${lib} PATHS "${TORCH_INSTALL_PREFIX}/lib" NO_DEFAULT_PATH NO_CACHE)
    if(NOT tile_torch_${lib})
      message(FATAL_ERROR "TILE_TORCH_EXTENSION: no lib${lib}.so in ${TORCH_INSTALL_PREFIX}/lib (torch ${torch_version})")
    endif()
    list(APPEND torch_libs "${tile_torch_${lib}}")
  endforeach()

  # NOMINSIZE: -O3 rather than nanobind's default -Os; this module exists for its speed per call.
  # NB_DOMAIN: nanobind's exception translators are shared within a domain; this module's (for
  # torch's errors) stays out of the calls of other nanobind modules, tile._tile's included.
  nanobind_add_module(_torch_C NOMINSIZE NB_DOMAIN tile_torch src/torch_ext.cpp)
  target_include_directories(_torch_C PRIVATE "${TILE_ROOT}/src")
  target_include_directories(_torch_C SYSTEM PRIVATE ${TORCH_INCLUDE_DIRS})
  target_link_libraries(_torch_C PRIVATE ${tile_target} ${torch_libs})
  target_compile_definitions(_torch_C PRIVATE TILE_TORCH_VERSION="${torch_version}")
  target_compile_options(_torch_C PRIVATE -Wall -Wextra ${TORCH_CXX_FLAGS})
  target_link_options(_torch_C PRIVATE -Wl,--exclude-libs,ALL)
  set_target_properties(_torch_C PROPERTIES
    LIBRARY_OUTPUT_DIRECTORY "${tile_package_dir}/tile"
    BUILD_RPATH "${tile_library_dir};${TORCH_INSTALL_PREFIX}/lib")
  add_dependencies(_torch_C tile_python_files)
  if(SKBUILD)
    # The wheel: libtile.so from beside the module; torch's libraries are loaded by `import
    # torch` before the package loads this module, else found in a sibling torch/lib.
    set_target_properties(_torch_C PROPERTIES INSTALL_RPATH "$ORIGIN;$ORIGIN/../torch/lib")
    install(TARGETS _torch_C LIBRARY DESTINATION tile)
  endif()
  message(STATUS "tile._torch_C: built against torch ${torch_version} (${TORCH_INSTALL_PREFIX})")
endfunction()
tile_add_torch_extension()
