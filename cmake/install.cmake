# `cmake --install <build> --prefix <P>` installs the C++ package:
#   <P>/include/flashhop/           the public headers (flashhop.h: C++ API, flashhop_c.h: C API)
#   <P>/lib/libflashhop.a           the kernels of this build's FLASHHOP_DTYPES x FLASHHOP_HEAD_DIMS
#   <P>/lib/cmake/flashhop/         the CMake package: find_package(flashhop CONFIG) defines flashhop::flashhop
# The library links the CUDA runtime statically (CUDA::cudart_static) and Threads; the package's
# config finds both in the consuming project. The Python package's shared library is the component
# "python", which only `pip install .` installs.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(FLASHHOP_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/flashhop")

install(TARGETS flashhop EXPORT flashhopTargets
        ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}"
        INCLUDES DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/flashhop" DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}"
        FILES_MATCHING PATTERN "*.h")
install(EXPORT flashhopTargets NAMESPACE flashhop:: DESTINATION "${FLASHHOP_INSTALL_CMAKEDIR}")

configure_package_config_file("${CMAKE_CURRENT_LIST_DIR}/flashhopConfig.cmake.in"
  "${PROJECT_BINARY_DIR}/flashhopConfig.cmake" INSTALL_DESTINATION "${FLASHHOP_INSTALL_CMAKEDIR}")
# Before 1.0 a minor release may change the API, so only the same MAJOR.MINOR is compatible.
write_basic_package_version_file("${PROJECT_BINARY_DIR}/flashhopConfigVersion.cmake"
  COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/flashhopConfig.cmake" "${PROJECT_BINARY_DIR}/flashhopConfigVersion.cmake"
        DESTINATION "${FLASHHOP_INSTALL_CMAKEDIR}")
