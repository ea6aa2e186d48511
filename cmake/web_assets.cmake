# The web pages' assets: the status page (src/loco/runtime/status/web) and uPlot (MIT), the charting
# library of the page and of `loco report`'s HTML. uPlot comes from npm at configure time, like the
# corpora: pinned by version and by the SHA-512 that npm's registry publishes for it, cached in
# $LOCO_CACHE or ~/.cache/loco so that a fresh clone needs no network, or taken from -DLOCO_UPLOT_TGZ
# (an `npm pack uplot@VERSION` tarball) on a machine without npm's registry. Everything is compiled
# into the binary: the pages load nothing from the internet.
set(LOCO_UPLOT_VERSION 1.6.32)
set(LOCO_UPLOT_SHA512 2883159c6ebccefbb95d751b0b82d010f9e1c0ec41b8bc96d401eda66e882935c89a46cb824332fa369b8cb8122cc6ac36e186cd09bf7a9ded3a4c93c6989023)
set(LOCO_UPLOT_TGZ "" CACHE FILEPATH "uplot-${LOCO_UPLOT_VERSION}.tgz from `npm pack` (default: fetched with npm)")

function(loco_fetch_uplot out_dir)
  set(tgz "${LOCO_UPLOT_TGZ}")
  if(NOT tgz)
    if(DEFINED ENV{LOCO_CACHE})
      set(cache "$ENV{LOCO_CACHE}/npm")
    else()
      set(cache "$ENV{HOME}/.cache/loco/npm")
    endif()
    set(tgz "${cache}/uplot-${LOCO_UPLOT_VERSION}.tgz")
    if(EXISTS "${tgz}")
      file(SHA512 "${tgz}" cached)
      if(NOT cached STREQUAL LOCO_UPLOT_SHA512)
        file(REMOVE "${tgz}")
      endif()
    endif()
    if(NOT EXISTS "${tgz}")
      find_program(NPM_PROGRAM npm)
      if(NOT NPM_PROGRAM)
        message(FATAL_ERROR "loco: npm is needed once to fetch uPlot ${LOCO_UPLOT_VERSION} for the status page "
                            "(scripts/setup.sh installs it), or pass -DLOCO_UPLOT_TGZ=/path/to/uplot-${LOCO_UPLOT_VERSION}.tgz")
      endif()
      file(MAKE_DIRECTORY "${cache}")
      execute_process(COMMAND "${NPM_PROGRAM}" pack "uplot@${LOCO_UPLOT_VERSION}" --silent
                      WORKING_DIRECTORY "${cache}" RESULT_VARIABLE failed OUTPUT_QUIET ERROR_VARIABLE npm_error
                      TIMEOUT 300)
      if(failed OR NOT EXISTS "${tgz}")
        message(FATAL_ERROR "loco: `npm pack uplot@${LOCO_UPLOT_VERSION}` failed: ${npm_error}\n"
                            "hint: pass -DLOCO_UPLOT_TGZ=/path/to/uplot-${LOCO_UPLOT_VERSION}.tgz")
      endif()
    endif()
  endif()
  file(SHA512 "${tgz}" actual)
  if(NOT actual STREQUAL LOCO_UPLOT_SHA512)
    message(FATAL_ERROR "loco: ${tgz} is not uplot ${LOCO_UPLOT_VERSION} as published (SHA-512 ${actual})")
  endif()
  file(ARCHIVE_EXTRACT INPUT "${tgz}" DESTINATION "${out_dir}" PATTERNS package/dist/uPlot.iife.min.js
       package/dist/uPlot.min.css package/LICENSE)
endfunction()

# Compiles `files` (pairs of URL path and file) into a C++ source `out` that defines loco's
# find_web_asset (web_assets.h).
function(loco_embed_web_assets out)
  string(REPLACE ";" "|" files "${ARGN}")
  set(inputs "")
  set(is_file FALSE)
  foreach(item IN LISTS ARGN)
    if(is_file)
      list(APPEND inputs "${item}")
      set(is_file FALSE)
    else()
      set(is_file TRUE)
    endif()
  endforeach()
  add_custom_command(OUTPUT "${out}"
    COMMAND ${CMAKE_COMMAND} -DOUT=${out} "-DFILES=${files}" -P "${PROJECT_SOURCE_DIR}/cmake/embed_assets.cmake"
    DEPENDS "${PROJECT_SOURCE_DIR}/cmake/embed_assets.cmake" ${inputs}
    COMMENT "Embedding the status page's assets" VERBATIM)
endfunction()
