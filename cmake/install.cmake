# Install rules, included last by the top-level CMakeLists.txt.
#
# As a C++ package (cmake --install <build> --prefix <dir>): lib/libtile.so, include/tile/*.hpp,
# bin/tile and lib/cmake/tile/ (tileConfig.cmake, its version file and the exported tile::tile),
# so that a consumer writes
#   find_package(tile 0.1 REQUIRED)
#   target_link_libraries(app PRIVATE tile::tile)
# with CMAKE_PREFIX_PATH=<dir>; tile_WITH_CUDA says whether the CUDA backend was built. Consumed
# by tests/packaging/consumer/.
#
# In a Python wheel (scikit-build-core sets SKBUILD): libtile.so alone, into tile/ next to the
# extension, which python/CMakeLists.txt installs with an $ORIGIN RPATH.
include(GNUInstallDirs)

if(SKBUILD)
  install(TARGETS tile LIBRARY DESTINATION tile)
  # Internal-error messages name source files relative to the tree, not the build machine's path.
  target_compile_options(tile PRIVATE "-ffile-prefix-map=${PROJECT_SOURCE_DIR}/=")
  return()
endif()

include(CMakePackageConfigHelpers)
if(TILE_WITH_CUDA)
  set(tile_with_cuda ON)
else()
  set(tile_with_cuda OFF)
endif()
set(tile_cmake_dir "${CMAKE_INSTALL_LIBDIR}/cmake/tile")

install(TARGETS tile EXPORT tileTargets
        LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}"
        INCLUDES DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
install(DIRECTORY include/tile DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
# The command finds libtile.so relative to itself wherever the prefix is moved.
set_target_properties(tile_cli PROPERTIES INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
install(TARGETS tile_cli RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}")

install(EXPORT tileTargets NAMESPACE tile:: DESTINATION "${tile_cmake_dir}")
configure_package_config_file(cmake/tileConfig.cmake.in "${CMAKE_CURRENT_BINARY_DIR}/tileConfig.cmake"
                              INSTALL_DESTINATION "${tile_cmake_dir}")
# 0.x: a new minor version may break the interface.
write_basic_package_version_file("${CMAKE_CURRENT_BINARY_DIR}/tileConfigVersion.cmake"
                                 COMPATIBILITY SameMinorVersion)
install(FILES "${CMAKE_CURRENT_BINARY_DIR}/tileConfig.cmake" "${CMAKE_CURRENT_BINARY_DIR}/tileConfigVersion.cmake"
        DESTINATION "${tile_cmake_dir}")
