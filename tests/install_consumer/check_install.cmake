# The test Install.Consumer: installs the build into a fresh prefix, checks that the installed CMake
# package refers to nothing in the source or build tree, then configures, builds and runs the
# consumer project (this folder) against it.
# cmake -DBUILD_DIR=... -DWORK_DIR=... -DSOURCE_DIR=... -DGENERATOR=... -DCXX_COMPILER=...
#       -DCUDA_ROOT=... -P check_install.cmake
foreach(_var BUILD_DIR WORK_DIR SOURCE_DIR GENERATOR CXX_COMPILER CUDA_ROOT)
  if(NOT DEFINED ${_var})
    message(FATAL_ERROR "check_install.cmake: expected -D${_var}=...")
  endif()
endforeach()

set(_prefix "${WORK_DIR}/prefix")
file(REMOVE_RECURSE "${WORK_DIR}")
execute_process(COMMAND "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${_prefix}" COMMAND_ERROR_IS_FATAL ANY)

foreach(_file include/flashhop/flashhop.h include/flashhop/flashhop_c.h lib/libflashhop.a
              lib/cmake/flashhop/flashhopConfig.cmake lib/cmake/flashhop/flashhopConfigVersion.cmake
              lib/cmake/flashhop/flashhopTargets.cmake)
  if(NOT EXISTS "${_prefix}/${_file}")
    message(FATAL_ERROR "expected ${_prefix}/${_file} after cmake --install")
  endif()
endforeach()
file(GLOB _package_files "${_prefix}/lib/cmake/flashhop/*.cmake")
foreach(_file IN LISTS _package_files)
  file(READ "${_file}" _text)
  foreach(_tree "${SOURCE_DIR}" "${BUILD_DIR}")
    string(FIND "${_text}" "${_tree}" _at)
    if(NOT _at EQUAL -1)
      message(FATAL_ERROR "${_file} refers to ${_tree}: expected an installed package that needs neither "
                          "the source nor the build tree")
    endif()
  endforeach()
endforeach()

execute_process(
  COMMAND "${CMAKE_COMMAND}" -S "${CMAKE_CURRENT_LIST_DIR}" -B "${WORK_DIR}/build" -G "${GENERATOR}"
          "-DCMAKE_PREFIX_PATH=${_prefix}" "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}" "-DCUDAToolkit_ROOT=${CUDA_ROOT}"
  COMMAND_ERROR_IS_FATAL ANY)
execute_process(COMMAND "${CMAKE_COMMAND}" --build "${WORK_DIR}/build" COMMAND_ERROR_IS_FATAL ANY)
execute_process(COMMAND "${WORK_DIR}/build/flashhop_consumer" COMMAND_ERROR_IS_FATAL ANY)
