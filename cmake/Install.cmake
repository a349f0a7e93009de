# What `cmake --install <build> --prefix <P>` puts under P, for programs that
# embed the engine (examples/ is one):
#
#   bin/zinf                              the command
#   include/zinf/*.h                      the public face, and nothing else
#   <libdir>/libzinf_<layer>.a            the engine's layers, core .. zero3
#   <libdir>/cmake/zinf/                  find_package(zinf): the target zinf::zinf
#   <libdir>/pkgconfig/zinf.pc            pkg-config --cflags --libs zinf
#
# The layers stay one static library each (the arrows hold in the installed
# tree too); zinf::zinf links them all and carries the include directory.
# Installed are the layers below and including zero3, which include/zinf/
# describes: kernels and model (the reference GPT) have no public headers, so
# an embedder could not call them.
#
# Also here: zinf_header_check, part of `all`, compiles each public header
# alone with include/ as the only include directory of ours, so a public
# header that needs a private one (or forgets a standard header) fails the
# build, not an embedder's.

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(ZINF_ENGINE_LAYERS zinf_core zinf_device zinf_aio zinf_optim zinf_comm zinf_swap zinf_zero3)

add_library(zinf_lib INTERFACE)
add_library(zinf::zinf ALIAS zinf_lib)
set_target_properties(zinf_lib PROPERTIES EXPORT_NAME zinf)
target_link_libraries(zinf_lib INTERFACE ${ZINF_ENGINE_LAYERS})
# Installed, every exported target carries the include directory (INCLUDES
# DESTINATION below).
target_include_directories(zinf_lib INTERFACE $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>)
# The public headers are C++17 (zinf_header_check compiles them so).
target_compile_features(zinf_lib INTERFACE cxx_std_17)

# The layers link zinf_warnings (compile options only) and, with NCCL,
# zinf_nccl privately; a static library's private links are exported as
# link-only dependencies, so both go into the export set. zinf_warnings adds
# nothing to an embedder's link line.
set(ZINF_EXPORTED ${ZINF_ENGINE_LAYERS} zinf_lib zinf_warnings)
if(TARGET zinf_nccl)
  list(APPEND ZINF_EXPORTED zinf_nccl)
endif()
install(TARGETS ${ZINF_EXPORTED} EXPORT zinfTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS zinf RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/zinf DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")

# --- find_package(zinf) -----------------------------------------------------
set(ZINF_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/zinf)
install(EXPORT zinfTargets NAMESPACE zinf:: DESTINATION ${ZINF_CMAKE_DIR})
# What the installed build was built with, for the config's find_dependency calls.
set(ZINF_CONFIG_CUDA_ROOT "")
if(ZINF_HAVE_CUDA)
  get_filename_component(ZINF_CONFIG_CUDA_ROOT "${CUDAToolkit_BIN_DIR}" DIRECTORY)
endif()
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/zinfConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/zinfConfig.cmake INSTALL_DESTINATION ${ZINF_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/zinfConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/zinfConfig.cmake ${PROJECT_BINARY_DIR}/zinfConfigVersion.cmake
        DESTINATION ${ZINF_CMAKE_DIR})

# --- zinf.pc ----------------------------------------------------------------
# The prefix is found from the file's own place (${pcfiledir}), so the file
# is right for whatever --prefix the install is given.
file(RELATIVE_PATH ZINF_PC_TO_PREFIX /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
string(REGEX REPLACE "/$" "" ZINF_PC_TO_PREFIX "${ZINF_PC_TO_PREFIX}")
set(ZINF_PC_REQUIRES "liburing hwloc libisal spdlog")
if(ZINF_HAVE_MPI)
  string(APPEND ZINF_PC_REQUIRES " mpi-cxx")
endif()
set(ZINF_PC_LIBS "")
foreach(layer ${ZINF_ENGINE_LAYERS})
  # Each layer before the layers it uses, as a static link needs.
  string(PREPEND ZINF_PC_LIBS "-l${layer} ")
endforeach()
string(APPEND ZINF_PC_LIBS "-pthread")
if(ZINF_HAVE_CUDA)
  string(APPEND ZINF_PC_LIBS " -L${CUDAToolkit_LIBRARY_DIR} -lcudart_static -ldl -lrt")
  if(ZINF_HAVE_NCCL)
    string(APPEND ZINF_PC_LIBS " ${ZINF_NCCL_LIBRARY}")
  endif()
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/zinf.pc.in ${PROJECT_BINARY_DIR}/zinf.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/zinf.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# --- each public header compiles alone ---------------------------------------
file(GLOB ZINF_PUBLIC_HEADER_FILES RELATIVE ${PROJECT_SOURCE_DIR}/include/zinf CONFIGURE_DEPENDS
     ${PROJECT_SOURCE_DIR}/include/zinf/*.h)
set(ZINF_HEADER_CHECK_SOURCES "")
foreach(header ${ZINF_PUBLIC_HEADER_FILES})
  set(source ${PROJECT_BINARY_DIR}/header_check/${header}.cc)
  # Twice: the second include must be a no-op (#pragma once).
  file(CONFIGURE OUTPUT ${source} CONTENT "#include \"zinf/${header}\"\n#include \"zinf/${header}\"\n")
  list(APPEND ZINF_HEADER_CHECK_SOURCES ${source})
endforeach()
add_library(zinf_header_check OBJECT ${ZINF_HEADER_CHECK_SOURCES})
target_include_directories(zinf_header_check PRIVATE ${PROJECT_SOURCE_DIR}/include)
target_link_libraries(zinf_header_check PRIVATE zinf_warnings)
set_target_properties(zinf_header_check PROPERTIES CXX_STANDARD 17)
