# libtorch's precompiled header, only where torch is used.
#
# loco_torch_pch(NAME [OPTION...]) makes one (an object library compiled with OPTIONs, e.g. -O0);
# loco_use_torch(TARGET [PCH NAME]) links TARGET with libtorch and gives it NAME's (loco_torch_pch by
# default), compiling TARGET with the same options.
#
# Loading the header costs every translation unit that gets it seconds, even one that never names
# torch (docs/benchmarks.md, "Build"), so loco_use_torch(target) gives it only to the sources that
# reach a torch header (<torch/...>, <ATen/...>, <c10/...>) through their quoted includes, followed
# from file to file at configure time. The others compile without it.

# Sets `out` to TRUE when `file` reaches a torch header. Quoted includes are looked up beside the
# including file, then in src/ and tests/ (the include paths loco's targets use). Memoized.
function(loco_reaches_torch file out)
  get_property(known GLOBAL PROPERTY "loco_torch:${file}" SET)
  if(known)
    get_property(result GLOBAL PROPERTY "loco_torch:${file}")
    set(${out} ${result} PARENT_SCOPE)
    return()
  endif()
  set_property(GLOBAL PROPERTY "loco_torch:${file}" FALSE)  # an include cycle ends here
  set(result FALSE)
  if(EXISTS ${file})
    # Read again at the next build whenever it changes: a source that comes to include torch gets the
    # header (and under clang must: torch.h compiles in C++20 only after ivalue.h, which the header
    # puts first).
    set_property(DIRECTORY ${PROJECT_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${file})
    file(STRINGS ${file} includes REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]")
    get_filename_component(dir ${file} DIRECTORY)
    foreach(line IN LISTS includes)
      if(line MATCHES "<(torch|ATen|c10|c10d)/")
        set(result TRUE)
        break()
      endif()
      if(line MATCHES "\"([^\"]+)\"")
        set(name ${CMAKE_MATCH_1})
        foreach(base ${dir} ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/tests)
          if(EXISTS ${base}/${name})
            get_filename_component(header ${base}/${name} ABSOLUTE)
            loco_reaches_torch(${header} reaches)
            if(reaches)
              set(result TRUE)
            endif()
            break()
          endif()
        endforeach()
        if(result)
          break()
        endif()
      endif()
    endforeach()
  endif()
  set_property(GLOBAL PROPERTY "loco_torch:${file}" ${result})
  set(${out} ${result} PARENT_SCOPE)
endfunction()

function(loco_torch_pch name)
  add_library(${name} OBJECT ${PROJECT_SOURCE_DIR}/cmake/pch_anchor.cpp)
  target_link_libraries(${name} PUBLIC ${TORCH_LIBRARIES})
  target_compile_options(${name} PRIVATE ${ARGN})
  set_property(GLOBAL PROPERTY "loco_pch_options:${name}" "${ARGN}")
  if(CCACHE_PROGRAM)  # compiled without the cache, its inputs' hash beside it (cmake/ccache_launcher.sh)
    set_target_properties(${name} PROPERTIES CXX_COMPILER_LAUNCHER
      "${PROJECT_SOURCE_DIR}/cmake/ccache_launcher.sh;${PROJECT_SOURCE_DIR};${PROJECT_BINARY_DIR};--pch")
  endif()
  if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    # clang in C++20 instantiates std::vector<c10::IValue> in torch/csrc/autograd/function.h, where
    # IValue is not complete yet, unless ivalue.h came first (GCC does not mind).
    target_precompile_headers(${name} PUBLIC <ATen/core/ivalue.h>)
  endif()
  target_precompile_headers(${name} PUBLIC <torch/torch.h>)
endfunction()

# Links `target` with libtorch and gives the precompiled header to those of its sources that reach
# torch.
function(loco_use_torch target)
  cmake_parse_arguments(USE "" "PCH" "" ${ARGN})
  if(NOT USE_PCH)
    set(USE_PCH loco_torch_pch)
  endif()
  get_property(pch_options GLOBAL PROPERTY "loco_pch_options:${USE_PCH}")
  target_compile_options(${target} PRIVATE ${pch_options})
  target_link_libraries(${target} PUBLIC ${TORCH_LIBRARIES})
  get_target_property(sources ${target} SOURCES)
  get_target_property(dir ${target} SOURCE_DIR)
  set(with_torch 0)
  foreach(source IN LISTS sources)
    get_filename_component(path ${source} ABSOLUTE BASE_DIR ${dir})
    loco_reaches_torch(${path} reaches)
    if(reaches)
      math(EXPR with_torch "${with_torch} + 1")
    else()
      set_source_files_properties(${path} TARGET_DIRECTORY ${target} PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
    endif()
  endforeach()
  if(with_torch GREATER 0)
    target_precompile_headers(${target} REUSE_FROM ${USE_PCH})
  endif()
endfunction()
