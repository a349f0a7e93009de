# Finds what zinf builds against. Required: Threads, nlohmann_json, spdlog,
# liburing, hwloc, ISA-L (the last three through pkg-config). Optional: CUDA Toolkit
# (+ NCCL), MPI, GoogleTest (tests only).

find_package(Threads REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(spdlog REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(URING REQUIRED IMPORTED_TARGET liburing)
pkg_check_modules(HWLOC REQUIRED IMPORTED_TARGET hwloc)
pkg_check_modules(ISAL REQUIRED IMPORTED_TARGET libisal)

# --- CUDA -------------------------------------------------------------------
set(ZINF_HAVE_CUDA OFF)
set(ZINF_HAVE_NCCL OFF)
if(NOT ZINF_CUDA STREQUAL "OFF")
  if(NOT DEFINED CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    set(ZINF_HAVE_CUDA ON)
    if(NOT CMAKE_CUDA_COMPILER AND EXISTS "${CUDAToolkit_BIN_DIR}/nvcc")
      set(CMAKE_CUDA_COMPILER "${CUDAToolkit_BIN_DIR}/nvcc")
    endif()
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      # H100/H200 first; 80 keeps A100 working. PTX of the newest for the rest.
      set(CMAKE_CUDA_ARCHITECTURES 80-real 90)
    endif()
    enable_language(CUDA)
    set(CMAKE_CUDA_STANDARD 20)
    find_library(ZINF_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
    find_path(ZINF_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
    if(ZINF_NCCL_LIBRARY AND ZINF_NCCL_INCLUDE)
      set(ZINF_HAVE_NCCL ON)
      add_library(zinf_nccl INTERFACE)
      target_link_libraries(zinf_nccl INTERFACE ${ZINF_NCCL_LIBRARY})
      target_include_directories(zinf_nccl INTERFACE ${ZINF_NCCL_INCLUDE})
    endif()
  elseif(ZINF_CUDA STREQUAL "ON")
    message(FATAL_ERROR "ZINF_CUDA=ON but the CUDA Toolkit was not found (set CUDAToolkit_ROOT)")
  endif()
endif()

# --- MPI --------------------------------------------------------------------
set(ZINF_HAVE_MPI OFF)
find_package(MPI QUIET COMPONENTS CXX)
if(MPI_CXX_FOUND)
  set(ZINF_HAVE_MPI ON)
endif()

# --- Tests ------------------------------------------------------------------
if(ZINF_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
