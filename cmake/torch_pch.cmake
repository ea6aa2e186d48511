# libtorch's precompiled headers, only where torch is used, and no more of torch than is used.
#
# Loading a precompiled header costs every translation unit that gets it, even one that never names
# torch: about 3.6 s (clang) for all of <torch/torch.h>, 0.4 s for its tensors alone (<torch/types.h>
# and <torch/utils.h>; docs/benchmarks.md, "Build"). So the sources are read at configure time, their
# quoted includes followed from file to file, and each gets what it reaches:
#   nothing of torch   no precompiled header;
#   tensors only       the light one: <ATen/...>, <c10/...>, <torch/types.h>, <torch/utils.h>, ...;
#   more               the full one: <torch/torch.h>, torch::nn, torch::optim, torch::cuda, ...
# A target takes the header its sources need most (CMake's REUSE_FROM is per target); a source that
# needs less in a target that takes the full one is given the light one by hand (loco_light_pch).
#
# loco_torch_pchs(SUFFIX [OPTION...]) makes both headers (object libraries loco_torch_pch${SUFFIX} and
# loco_torch_light_pch${SUFFIX}, compiled with OPTIONs, e.g. -O0); loco_use_torch(TARGET [PCH SUFFIX])
# links TARGET with libtorch, gives its sources the headers of SUFFIX and compiles TARGET with the
# same options.

# Sets `out` to what `file` reaches: 0 nothing of torch, 1 tensors only, 2 more. Quoted includes are
# looked up beside the including file, then in src/ and tests/ (the include paths loco's targets
# use). Memoized.
function(loco_reaches_torch file out)
  get_property(known GLOBAL PROPERTY "loco_torch:${file}" SET)
  if(known)
    get_property(result GLOBAL PROPERTY "loco_torch:${file}")
    set(${out} ${result} PARENT_SCOPE)
    return()
  endif()
  set_property(GLOBAL PROPERTY "loco_torch:${file}" 0)  # an include cycle ends here
  set(result 0)
  if(EXISTS ${file})
    # Read again at the next build whenever it changes: a source that comes to include torch gets a
    # header (and under clang must: torch.h compiles in C++20 only after ivalue.h, which the headers
    # put first).
    set_property(DIRECTORY ${PROJECT_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${file})
    file(STRINGS ${file} includes REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]")
    get_filename_component(dir ${file} DIRECTORY)
    foreach(line IN LISTS includes)
      set(level 0)
      if(line MATCHES "<(ATen|c10|c10d)/" OR line MATCHES "<torch/(types|utils|version)\\.h>" OR line MATCHES "<torch/csrc/")
        set(level 1)
      elseif(line MATCHES "<torch/")
        set(level 2)
      elseif(line MATCHES "\"([^\"]+)\"")
        set(name ${CMAKE_MATCH_1})
        foreach(base ${dir} ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/tests)
          if(EXISTS ${base}/${name})
            get_filename_component(header ${base}/${name} ABSOLUTE)
            loco_reaches_torch(${header} level)
            break()
          endif()
        endforeach()
      endif()
      if(level GREATER result)
        set(result ${level})
      endif()
      if(result EQUAL 2)
        break()
      endif()
    endforeach()
  endif()
  set_property(GLOBAL PROPERTY "loco_torch:${file}" ${result})
  set(${out} ${result} PARENT_SCOPE)
endfunction()

function(loco_torch_pch name options)
  add_library(${name} OBJECT ${PROJECT_SOURCE_DIR}/cmake/pch_anchor.cpp)
  target_link_libraries(${name} PUBLIC ${TORCH_LIBRARIES})
  target_compile_options(${name} PRIVATE ${options})
  if(CCACHE_PROGRAM)  # compiled without the cache, its inputs' hash beside it (cmake/ccache_launcher.sh)
    set_target_properties(${name} PROPERTIES CXX_COMPILER_LAUNCHER
      "${PROJECT_SOURCE_DIR}/cmake/ccache_launcher.sh;${PROJECT_SOURCE_DIR};${PROJECT_BINARY_DIR};--pch")
  endif()
  # clang in C++20 instantiates std::vector<c10::IValue> in torch/csrc/autograd/function.h, where
  # IValue is not complete yet, unless ivalue.h came first (GCC does not mind).
  target_precompile_headers(${name} PUBLIC <ATen/core/ivalue.h> ${ARGN})
endfunction()

function(loco_torch_pchs suffix)
  set_property(GLOBAL PROPERTY "loco_pch_options:${suffix}" "${ARGN}")
  loco_torch_pch(loco_torch_pch${suffix} "${ARGN}" <torch/torch.h>)
  loco_torch_pch(loco_torch_light_pch${suffix} "${ARGN}" <torch/types.h> <torch/utils.h>)
endfunction()

# Gives `source` of `target` the light header of `suffix` in place of the target's full one: the
# options CMake itself would write for it (clang reads the .pch it names; GCC finds the .gch beside
# the header it includes).
function(loco_light_pch target source suffix)
  set(pch loco_torch_light_pch${suffix})
  set(header ${PROJECT_BINARY_DIR}/CMakeFiles/${pch}.dir/cmake_pch.hxx)
  if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    set(options -Xclang -include-pch -Xclang ${header}.pch -Xclang -include -Xclang ${header})
    set(built ${header}.pch)
  else()
    set(options -include ${header})
    set(built ${header}.gch)
  endif()
  set_source_files_properties(${source} TARGET_DIRECTORY ${target} PROPERTIES SKIP_PRECOMPILE_HEADERS ON
    COMPILE_OPTIONS "-Winvalid-pch;${options}" OBJECT_DEPENDS ${built})
  add_dependencies(${target} ${pch})
endfunction()

function(loco_use_torch target)
  cmake_parse_arguments(USE "" "PCH" "" ${ARGN})
  get_property(pch_options GLOBAL PROPERTY "loco_pch_options:${USE_PCH}")
  target_compile_options(${target} PRIVATE ${pch_options})
  target_link_libraries(${target} PUBLIC ${TORCH_LIBRARIES})
  get_target_property(sources ${target} SOURCES)
  get_target_property(dir ${target} SOURCE_DIR)
  set(needs 0)
  set(light "")
  foreach(source IN LISTS sources)
    get_filename_component(path ${source} ABSOLUTE BASE_DIR ${dir})
    loco_reaches_torch(${path} level)
    if(level EQUAL 0)
      set_source_files_properties(${path} TARGET_DIRECTORY ${target} PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
    elseif(level EQUAL 1)
      list(APPEND light ${path})
    endif()
    if(level GREATER needs)
      set(needs ${level})
    endif()
  endforeach()
  if(needs EQUAL 2)
    target_precompile_headers(${target} REUSE_FROM loco_torch_pch${USE_PCH})
    foreach(path IN LISTS light)
      loco_light_pch(${target} ${path} "${USE_PCH}")
    endforeach()
  elseif(needs EQUAL 1)
    target_precompile_headers(${target} REUSE_FROM loco_torch_light_pch${USE_PCH})
  endif()
endfunction()
