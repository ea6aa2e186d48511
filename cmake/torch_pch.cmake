# Precompiled headers for every unit: libtorch's only where torch is used, and no more of it than is
# used; nlohmann-json, fmt and the standard headers loco uses everywhere.
#
# Loading a precompiled header costs every translation unit that gets it, even one that never names
# torch: about 3.6 s (clang) for all of <torch/torch.h>, 0.4 s for its tensors alone (<torch/types.h>
# and <torch/utils.h>; docs/benchmarks.md, "Build"). So the sources are read at configure time, their
# quoted includes followed from file to file, and each gets what it reaches:
#   nothing of torch   the common header (LOCO_COMMON_HEADERS);
#   tensors only       the light one: those and <ATen/...>, <c10/...>, <torch/types.h>, <torch/utils.h>;
#   more               the full one: those and <torch/torch.h> (torch::nn, torch::optim, torch::cuda, ...)
# A target takes the header its sources need most (CMake's REUSE_FROM is per target); a source that
# needs less is given its own by hand (loco_source_pch).
#
# loco_torch_pchs(SUFFIX [OPTION...]) makes the three headers (object libraries loco_torch_pch${SUFFIX},
# loco_torch_light_pch${SUFFIX}, loco_common_pch${SUFFIX}, compiled with OPTIONs, e.g. -O0);
# loco_use_torch(TARGET [PCH SUFFIX]) links TARGET with libtorch, gives its sources the headers of
# SUFFIX and compiles TARGET with the same options; loco_precompile_the_rest gives the targets without
# torch the common header.

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

# What most of loco's units include besides torch: every precompiled header holds these, and a unit
# that uses no torch gets a header of these alone (about 3 s of nlohmann-json and fmt saved per unit;
# docs/benchmarks.md, "Build").
set(LOCO_COMMON_HEADERS <nlohmann/json.hpp> <fmt/format.h> <fmt/ranges.h> <algorithm> <chrono> <filesystem>
    <functional> <map> <memory> <mutex> <optional> <string> <thread> <variant> <vector>)

function(loco_pch_target name options torch)
  add_library(${name} OBJECT ${PROJECT_SOURCE_DIR}/cmake/pch_anchor.cpp)
  target_link_libraries(${name} PUBLIC fmt::fmt nlohmann_json::nlohmann_json)
  if(torch)
    target_link_libraries(${name} PUBLIC ${TORCH_LIBRARIES})
  endif()
  target_compile_options(${name} PRIVATE ${options})
  if(CCACHE_PROGRAM)  # compiled without the cache, its inputs' hash beside it (cmake/ccache_launcher.sh)
    set_target_properties(${name} PROPERTIES CXX_COMPILER_LAUNCHER
      "${PROJECT_SOURCE_DIR}/cmake/ccache_launcher.sh;${PROJECT_SOURCE_DIR};${PROJECT_BINARY_DIR};--pch")
  endif()
  target_precompile_headers(${name} PUBLIC ${ARGN} ${LOCO_COMMON_HEADERS})
endfunction()

# The three headers of one optimization level, by what a source reaches (0, 1, 2).
function(loco_pch_name level suffix out)
  if(level EQUAL 2)
    set(${out} loco_torch_pch${suffix} PARENT_SCOPE)
  elseif(level EQUAL 1)
    set(${out} loco_torch_light_pch${suffix} PARENT_SCOPE)
  else()
    set(${out} loco_common_pch${suffix} PARENT_SCOPE)
  endif()
endfunction()

function(loco_torch_pchs suffix)
  set_property(GLOBAL PROPERTY "loco_pch_options:${suffix}" "${ARGN}")
  # clang in C++20 instantiates std::vector<c10::IValue> in torch/csrc/autograd/function.h, where
  # IValue is not complete yet, unless ivalue.h came first (GCC does not mind).
  loco_pch_target(loco_torch_pch${suffix} "${ARGN}" ON <ATen/core/ivalue.h> <torch/torch.h>)
  loco_pch_target(loco_torch_light_pch${suffix} "${ARGN}" ON <ATen/core/ivalue.h> <torch/types.h> <torch/utils.h>)
  loco_pch_target(loco_common_pch${suffix} "${ARGN}" OFF)
endfunction()

# Gives `source` of `target` the header `pch` in place of the target's: the options CMake itself
# would write for it (clang reads the .pch it names; GCC finds the .gch beside the header it includes).
function(loco_source_pch target source pch)
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

# Gives `source` (reaching torch at `level`) its own header when its target's (`needs`) is more.
function(loco_level_pch target source level needs suffix)
  if(level LESS needs)
    loco_pch_name(${level} "${suffix}" own)
    loco_source_pch(${target} ${source} ${own})
  endif()
endfunction()

# Gives each source of `target` the header of what it reaches, at the optimization level of
# `suffix`: the target takes the one its sources need most, the others get theirs by hand.
function(loco_precompile target suffix)
  set_property(TARGET ${target} PROPERTY LOCO_PRECOMPILED ON)
  get_target_property(sources ${target} SOURCES)
  get_target_property(dir ${target} SOURCE_DIR)
  set(needs 0)
  set(paths "")
  set(levels "")
  foreach(source IN LISTS sources)
    if(NOT source MATCHES "\\.(cpp|cc)$")
      continue()
    endif()
    get_filename_component(path ${source} ABSOLUTE BASE_DIR ${dir})
    loco_reaches_torch(${path} level)
    list(APPEND paths ${path})
    list(APPEND levels ${level})
    if(level GREATER needs)
      set(needs ${level})
    endif()
  endforeach()
  loco_pch_name(${needs} "${suffix}" pch)
  target_precompile_headers(${target} REUSE_FROM ${pch})
  set(batchable_0 "")
  set(batchable_1 "")
  set(batchable_2 "")
  foreach(path level IN ZIP_LISTS paths levels)
    loco_batchable(${target} ${path} batchable)
    if(batchable)
      list(APPEND batchable_${level} ${path})
    else()
      loco_level_pch(${target} ${path} ${level} ${needs} "${suffix}")
    endif()
  endforeach()
  foreach(level 0 1 2)
    loco_unity(${target} ${level} ${needs} "${suffix}" "${batchable_${level}}")
  endforeach()
endfunction()

# Unity batches (LOCO_UNITY, on by default): a target's sources that get the same precompiled header
# are compiled LOCO_UNITY_BATCH at a time, each batch one unit that includes them, which halves the
# build's time (what one unit compiles, another need not: the instantiations of json, fmt and torch's
# templates, the inline functions of the headers; docs/benchmarks.md, "Build"). The batches include
# their sources by paths relative to themselves, so that a second clone's batches are the same bytes
# and hit ccache. A file-local name (an anonymous namespace's, a static one's) must then be unique
# within its target. -DLOCO_UNITY=OFF compiles each source alone (an editor's compile_commands.json).

# Whether `path` of `target` may go into a batch: not when it has options of its own.
function(loco_batchable target path out)
  set(${out} OFF PARENT_SCOPE)
  if(NOT LOCO_UNITY)
    return()
  endif()
  foreach(property COMPILE_OPTIONS COMPILE_DEFINITIONS INCLUDE_DIRECTORIES SKIP_UNITY_BUILD_INCLUSION)
    get_source_file_property(value ${path} TARGET_DIRECTORY ${target} ${property})
    if(value)
      return()
    endif()
  endforeach()
  set(${out} ON PARENT_SCOPE)
endfunction()

# Writes `target`'s batches of `paths` (sources of one level), in the order listed; a lone source
# stays as it is.
function(loco_unity target level needs suffix paths)
  list(LENGTH paths count)
  if(count LESS 2)
    if(count EQUAL 1)
      loco_level_pch(${target} ${paths} ${level} ${needs} "${suffix}")
    endif()
    return()
  endif()
  get_target_property(binary_dir ${target} BINARY_DIR)
  set(unity_dir ${binary_dir}/unity/${target})
  math(EXPR batches "(${count} + ${LOCO_UNITY_BATCH} - 1) / ${LOCO_UNITY_BATCH}")
  math(EXPR size "(${count} + ${batches} - 1) / ${batches}")  # batches of even sizes
  set(index 0)
  set(batch 0)
  set(content "")
  foreach(path IN LISTS paths)
    file(RELATIVE_PATH relative ${unity_dir} ${path})
    string(APPEND content "#include \"${relative}\"\n")
    set_source_files_properties(${path} TARGET_DIRECTORY ${target} PROPERTIES HEADER_FILE_ONLY ON)
    math(EXPR index "${index} + 1")
    math(EXPR placed "${batch} * ${size} + ${index}")
    if(index EQUAL size OR placed EQUAL count)
      set(file ${unity_dir}/${target}_${level}_${batch}.cpp)
      # Rewritten only when it changes (no rebuild at each configure).
      file(CONFIGURE OUTPUT ${file} CONTENT "// A unity batch of ${target} (cmake/torch_pch.cmake).\n${content}" @ONLY)
      target_sources(${target} PRIVATE ${file})
      loco_level_pch(${target} ${file} ${level} ${needs} "${suffix}")
      math(EXPR batch "${batch} + 1")
      set(index 0)
      set(content "")
    endif()
  endforeach()
endfunction()

# Links `target` with libtorch and compiles it with the headers and the options of `PCH suffix`.
function(loco_use_torch target)
  cmake_parse_arguments(USE "" "PCH" "" ${ARGN})
  get_property(pch_options GLOBAL PROPERTY "loco_pch_options:${USE_PCH}")
  target_compile_options(${target} PRIVATE ${pch_options})
  target_link_libraries(${target} PUBLIC ${TORCH_LIBRARIES})
  loco_precompile(${target} "${USE_PCH}")
endfunction()

# The libraries and programs of `dir` and its subfolders not given headers yet (those without torch)
# get the common one. (The SentencePiece plugin, a module built with options of its own, is not swept.)
function(loco_precompile_the_rest dir)
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  foreach(target IN LISTS targets)
    get_target_property(type ${target} TYPE)
    get_target_property(done ${target} LOCO_PRECOMPILED)
    if(type MATCHES "^(STATIC_LIBRARY|EXECUTABLE)$" AND NOT done)
      loco_precompile(${target} "")
    endif()
  endforeach()
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(sub IN LISTS subdirs)
    loco_precompile_the_rest(${sub})
  endforeach()
endfunction()
