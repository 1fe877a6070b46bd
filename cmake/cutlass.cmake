# Finds the CUTLASS / CuTe 4.2 headers and defines the interface target flashhop::cutlass.
# Order:
#   1. -DCUTLASS_DIR=<dir holding cute/ and cutlass/>;
#   2. a copy installed by an earlier configure into this build tree (step 4);
#   3. the Python package nvidia-cutlass 4.2, importable by Python3_EXECUTABLE: under `pip install .`
#      the build environment's interpreter, which scikit-build-core passes and where
#      pyproject.toml's build requirements put the package; else the python3 on PATH;
#   4. else nvidia-cutlass is installed into this build tree (headers only, --no-deps) with that
#      interpreter's pip.
# pyproject.toml's build requirement and scripts/fetch_cutlass.sh pin the same version.
set(FLASHHOP_CUTLASS_VERSION "4.2.0.0")
set(CUTLASS_DIR "" CACHE PATH "Directory that holds the CUTLASS include tree (cute/, cutlass/)")

function(_flashhop_cutlass_ok dir out)
  if(dir AND EXISTS "${dir}/cute/tensor.hpp" AND EXISTS "${dir}/cutlass/version.h")
    set(${out} TRUE PARENT_SCOPE)
  else()
    set(${out} FALSE PARENT_SCOPE)
  endif()
endfunction()

# "MAJOR.MINOR" of the CUTLASS include tree in `dir`.
function(_flashhop_cutlass_version dir out)
  file(STRINGS "${dir}/cutlass/version.h" _lines REGEX "#define CUTLASS_(MAJOR|MINOR) ")
  string(REGEX REPLACE ".*CUTLASS_MAJOR ([0-9]+).*CUTLASS_MINOR ([0-9]+).*" "\\1.\\2" _version "${_lines}")
  set(${out} "${_version}" PARENT_SCOPE)
endfunction()

string(REGEX MATCH "^[0-9]+\\.[0-9]+" _cutlass_wanted "${FLASHHOP_CUTLASS_VERSION}")
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
    message(FATAL_ERROR "CUTLASS_DIR=${CUTLASS_DIR}: expected a directory holding cute/tensor.hpp and "
                        "cutlass/version.h (or its include/ or cutlass_library/source/include/ holding them)")
  endif()
endif()

set(_cutlass_pkg_dir "${CMAKE_BINARY_DIR}/_deps/nvidia-cutlass")
set(_cutlass_pkg_include "${_cutlass_pkg_dir}/cutlass_library/source/include")
if(NOT _cutlass_include)
  _flashhop_cutlass_ok("${_cutlass_pkg_include}" _ok)
  if(_ok)
    set(_cutlass_include "${_cutlass_pkg_include}")
  endif()
endif()

find_package(Python3 COMPONENTS Interpreter)
if(NOT _cutlass_include AND Python3_FOUND)
  # find_spec locates the package without importing it, so its Python dependencies need not be there.
  execute_process(
    COMMAND "${Python3_EXECUTABLE}" -c
      "import importlib.util, os; print(os.path.join(importlib.util.find_spec('cutlass_library').submodule_search_locations[0], 'source', 'include'))"
    OUTPUT_VARIABLE _py_include OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _py_rc)
  if(_py_rc EQUAL 0)
    _flashhop_cutlass_ok("${_py_include}" _ok)
    if(_ok)
      _flashhop_cutlass_version("${_py_include}" _found)
      if(_found VERSION_EQUAL _cutlass_wanted)
        set(_cutlass_include "${_py_include}")
      else()
        message(STATUS "Not using nvidia-cutlass at ${_py_include}: CUTLASS ${_found}, expected ${_cutlass_wanted}")
      endif()
    endif()
  endif()
endif()

if(NOT _cutlass_include)
  string(CONCAT _expected "expected -DCUTLASS_DIR=<dir holding cute/ and cutlass/> (scripts/fetch_cutlass.sh "
         "makes one), or nvidia-cutlass==${FLASHHOP_CUTLASS_VERSION} importable by the Python interpreter")
  if(NOT Python3_FOUND)
    message(FATAL_ERROR "CUTLASS headers not found and no Python interpreter found to install them; ${_expected}")
  endif()
  execute_process(COMMAND "${Python3_EXECUTABLE}" -m pip --version
                  OUTPUT_QUIET ERROR_QUIET RESULT_VARIABLE _pip_rc)
  if(NOT _pip_rc EQUAL 0)
    message(FATAL_ERROR "CUTLASS headers not found, and ${Python3_EXECUTABLE} has no pip to install "
                        "nvidia-cutlass==${FLASHHOP_CUTLASS_VERSION} with; ${_expected}")
  endif()
  message(STATUS "Installing nvidia-cutlass==${FLASHHOP_CUTLASS_VERSION} headers into ${_cutlass_pkg_dir}")
  execute_process(
    COMMAND "${Python3_EXECUTABLE}" -m pip install --quiet --no-deps --no-compile
            --target "${_cutlass_pkg_dir}" "nvidia-cutlass==${FLASHHOP_CUTLASS_VERSION}"
    RESULT_VARIABLE _pip_rc)
  _flashhop_cutlass_ok("${_cutlass_pkg_include}" _ok)
  if(NOT _pip_rc EQUAL 0 OR NOT _ok)
    message(FATAL_ERROR "Could not install nvidia-cutlass==${FLASHHOP_CUTLASS_VERSION} with "
                        "${Python3_EXECUTABLE} -m pip (exit code ${_pip_rc}); ${_expected}")
  endif()
  set(_cutlass_include "${_cutlass_pkg_include}")
endif()

_flashhop_cutlass_version("${_cutlass_include}" _cutlass_found)
message(STATUS "CUTLASS headers: ${_cutlass_include} (CUTLASS ${_cutlass_found})")
add_library(flashhop_cutlass INTERFACE)
target_include_directories(flashhop_cutlass SYSTEM INTERFACE "${_cutlass_include}")
add_library(flashhop::cutlass ALIAS flashhop_cutlass)
