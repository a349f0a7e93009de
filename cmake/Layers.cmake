# Per-layer include roots: the arrows of ARCHITECTURE.md, enforced by the
# compiler.
#
# Headers are included as "<layer>/name.h". One include path of src/ would
# show every layer to every other; instead each layer's target gets a root of
# its own, ${PROJECT_BINARY_DIR}/layers/<layer>/, holding one symlink
# <layer> -> src/<layer> (plus zinf/<file> -> include/zinf/<file> for the
# public headers the layer owns), as a PUBLIC include directory. Through
# CMake's usage requirements a target then sees its own headers and those of
# the targets it links (transitively through PUBLIC links), and nothing else:
# an include that points up or sideways does not compile. Tests see what they
# link. .ci/check_layers.sh (make check-layers) checks the same arrows from
# the sources, without building, with the rule each include breaks.
# Diagnostics name headers by the path they were found at:
# build/layers/aio/aio/file.h is src/aio/file.h.
#
# zinf_layer_include_root(<target> <layer> [PUBLIC_HEADERS <file>...])
#   <layer>           the folder under src/
#   PUBLIC_HEADERS    files of include/zinf/ this layer owns (and whose
#                     includes must follow its arrows); every file there must
#                     be owned by exactly one layer (checked in src/).
# Write the call on one line: check_layers.sh reads PUBLIC_HEADERS from it.
function(zinf_layer_include_root target layer)
  cmake_parse_arguments(L "" "" "PUBLIC_HEADERS" ${ARGN})
  set(root ${PROJECT_BINARY_DIR}/layers/${layer})
  file(MAKE_DIRECTORY ${root})
  file(CREATE_LINK ${PROJECT_SOURCE_DIR}/src/${layer} ${root}/${layer} SYMBOLIC)
  # Links of public headers the layer no longer owns go (file(REMOVE) removes
  # the link, never what it points to).
  file(GLOB stale ${root}/zinf/*)
  foreach(link ${stale})
    get_filename_component(name ${link} NAME)
    if(NOT name IN_LIST L_PUBLIC_HEADERS)
      file(REMOVE ${link})
    endif()
  endforeach()
  foreach(header ${L_PUBLIC_HEADERS})
    if(NOT EXISTS ${PROJECT_SOURCE_DIR}/include/zinf/${header})
      message(FATAL_ERROR "zinf_layer_include_root(${layer}): include/zinf/${header} does not exist")
    endif()
    get_property(owner GLOBAL PROPERTY ZINF_PUBLIC_HEADER_OWNER_${header})
    if(owner AND NOT owner STREQUAL layer)
      message(FATAL_ERROR "include/zinf/${header} is claimed by layers ${owner} and ${layer}")
    endif()
    set_property(GLOBAL PROPERTY ZINF_PUBLIC_HEADER_OWNER_${header} ${layer})
    file(MAKE_DIRECTORY ${root}/zinf)
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/include/zinf/${header} ${root}/zinf/${header} SYMBOLIC)
  endforeach()
  get_target_property(type ${target} TYPE)
  if(type STREQUAL "EXECUTABLE")
    target_include_directories(${target} PRIVATE ${root})
  else()
    target_include_directories(${target} PUBLIC $<BUILD_INTERFACE:${root}>)
  endif()
endfunction()

# Fails the configuration when a file of include/zinf/ belongs to no layer
# (call after every layer's zinf_layer_include_root).
function(zinf_check_public_headers_owned)
  file(GLOB headers RELATIVE ${PROJECT_SOURCE_DIR}/include/zinf ${PROJECT_SOURCE_DIR}/include/zinf/*)
  foreach(header ${headers})
    get_property(owner GLOBAL PROPERTY ZINF_PUBLIC_HEADER_OWNER_${header})
    if(NOT owner)
      message(FATAL_ERROR "include/zinf/${header} belongs to no layer: name it in PUBLIC_HEADERS of the "
                          "zinf_layer_include_root call of the lowest layer whose types it uses (src/<layer>/CMakeLists.txt)")
    endif()
  endforeach()
endfunction()
