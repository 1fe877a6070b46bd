# Finds the CUTLASS / CuTe 4.2 headers and defines the interface target flashhop::cutlass.
# Order: -DCUTLASS_DIR=<dir holding cute/ and cutlass/>; the Python package nvidia-cutlass of the
# python3 on PATH; else the package is installed (headers only, --no-deps) into the build tree.
set(FLASHHOP_CUTLASS_VERSION "4.2.0.0")
set(CUTLASS_DIR "" CACHE PATH "Directory that holds the CUTLASS include tree (cute/, cutlass/)")

function(_flashhop_cutlass_ok dir out)
  if(dir AND EXISTS "${dir}/cute/tensor.hpp" AND EXISTS "${dir}/cutlass/version.h")
    set(${out} TRUE PARENT_SCOPE)
  else()
    set(${out} FALSE PARENT_SCOPE)
  endif()
endfunction()

set(_cutlass_include "")
if(CUTLASS_DIR)
  foreach(candidate "${CUTLASS_DIR}" "${CUTLASS_DIR}/include" "${CUTLASS_DIR}/cutlass_library/source/include")
    _flashhop_cutlass_ok("${candidate}" _ok)
    if(_ok)
      set(_cutlass_include "${candidate}")
      break()
    endif()
  endforeach()
  if(NOT _cutlass_include)
    message(FATAL_ERROR "CUTLASS_DIR=${CUTLASS_DIR} holds no cute/tensor.hpp and cutlass/version.h")
  endif()
endif()

find_package(Python3 COMPONENTS Interpreter)
set(_cutlass_pkg_dir "${CMAKE_BINARY_DIR}/_deps/nvidia-cutlass")
if(NOT _cutlass_include)
  _flashhop_cutlass_ok("${_cutlass_pkg_dir}/cutlass_library/source/include" _ok)
  if(_ok)
    set(_cutlass_include "${_cutlass_pkg_dir}/cutlass_library/source/include")
  endif()
endif()
if(NOT _cutlass_include AND Python3_FOUND)
  execute_process(
    COMMAND "${Python3_EXECUTABLE}" -c
      "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include'))"
    OUTPUT_VARIABLE _py_include OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _py_rc)
  if(_py_rc EQUAL 0)
    _flashhop_cutlass_ok("${_py_include}" _ok)
    if(_ok)
      set(_cutlass_include "${_py_include}")
    endif()
  endif()
endif()
if(NOT _cutlass_include)
  if(NOT Python3_FOUND)
    message(FATAL_ERROR "CUTLASS headers not found and no python3 to install nvidia-cutlass; pass -DCUTLASS_DIR")
  endif()
  message(STATUS "Installing nvidia-cutlass==${FLASHHOP_CUTLASS_VERSION} headers into ${_cutlass_pkg_dir}")
  execute_process(
    COMMAND "${Python3_EXECUTABLE}" -m pip install --quiet --no-deps --no-compile
            --target "${_cutlass_pkg_dir}" "nvidia-cutlass==${FLASHHOP_CUTLASS_VERSION}"
    RESULT_VARIABLE _pip_rc)
  _flashhop_cutlass_ok("${_cutlass_pkg_dir}/cutlass_library/source/include" _ok)
  if(NOT _pip_rc EQUAL 0 OR NOT _ok)
    message(FATAL_ERROR "Could not install nvidia-cutlass==${FLASHHOP_CUTLASS_VERSION}; pass -DCUTLASS_DIR")
  endif()
  set(_cutlass_include "${_cutlass_pkg_dir}/cutlass_library/source/include")
endif()

file(STRINGS "${_cutlass_include}/cutlass/version.h" _ver REGEX "#define CUTLASS_(MAJOR|MINOR) ")
message(STATUS "CUTLASS headers: ${_cutlass_include} (${_ver})")
add_library(flashhop_cutlass INTERFACE)
target_include_directories(flashhop_cutlass SYSTEM INTERFACE "${_cutlass_include}")
add_library(flashhop::cutlass ALIAS flashhop_cutlass)
