# Finds every dependency the way TOOLCHAIN.md documents, and makes one imported target each.
find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)

# CAF 0.17.6 ships no CMake config and no .pc file.
find_path(CAF_INCLUDE_DIR caf/all.hpp REQUIRED)
find_library(CAF_CORE_LIBRARY caf_core REQUIRED)
find_library(CAF_IO_LIBRARY caf_io REQUIRED)
add_library(CAF::core INTERFACE IMPORTED)
target_include_directories(CAF::core INTERFACE ${CAF_INCLUDE_DIR})
target_link_libraries(CAF::core INTERFACE ${CAF_CORE_LIBRARY} Threads::Threads)
add_library(CAF::io INTERFACE IMPORTED)
target_link_libraries(CAF::io INTERFACE ${CAF_IO_LIBRARY} CAF::core)

find_package(CURL REQUIRED)
find_package(SQLite3 REQUIRED)
find_package(simdjson CONFIG REQUIRED)
# cpp-httplib: pkg-config only; its -DCPPHTTPLIB_* flags are mandatory (ABI).
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
find_package(CLI11 CONFIG REQUIRED)
find_package(nlohmann_json CONFIG REQUIRED)

set(BLA_VENDOR OpenBLAS)
find_package(BLAS REQUIRED)
find_path(OPENBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas-pthread openblas REQUIRED)

if(CEDAR_BUILD_TESTS)
  find_package(GTest CONFIG REQUIRED)
  include(GoogleTest)
endif()

# CUDA: only when nvcc is there. Never `native` architectures: it fails on a machine with no GPU.
set(CEDAR_HAVE_CUDA OFF)
if(CEDAR_CUDA)
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(CMAKE_CUDA_ARCHITECTURES 90)
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(CEDAR_HAVE_CUDA ON)
    message(STATUS "cedar: CUDA backend ON (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, sm_90)")
  else()
    message(STATUS "cedar: no nvcc found, CPU-only build")
  endif()
endif()

# cedar_library(NAME SOURCES... ) — a static library, or an INTERFACE one while a module has
# no sources yet, so that link lines can name every module from the first commit.
function(cedar_library name)
  if(ARGN)
    add_library(${name} STATIC ${ARGN})
    set(${name}_scope PUBLIC PARENT_SCOPE)
  else()
    add_library(${name} INTERFACE)
    set(${name}_scope INTERFACE PARENT_SCOPE)
  endif()
endfunction()
