# Checks the dynamic symbols libkvarn.so exports against the golden list capi/symbols.txt.
#
#   cmake -DLIBRARY=<libkvarn.so> -DGOLDEN=<capi/symbols.txt> [-DHEADER=<kvarn.h>]
#         [-DEXPERIMENTAL_HEADER=<kvarn_experimental.h>] [-DNM=<nm>] [-DREADELF=<readelf>]
#         [-DEXPECTED_SONAME=libkvarn.so.0] [-DVERSION_NODE=KVARN_0] -P check_symbols.cmake
#
# Fails (with a diff-like listing) when
#   - the library exports a symbol that is not in the golden list (a leaked internal symbol, a
#     C++ symbol, a data symbol) or misses one that is;
#   - HEADER is given and the KVARN_API declarations of the header (together with those of
#     EXPERIMENTAL_HEADER, when given: its functions are exported too, without the stability
#     promise) differ from the golden list (a function added to kvarn.h or kvarn_experimental.h
#     must be added to symbols.txt, and the other way round);
#   - an exported symbol is not in the version node VERSION_NODE of capi/kvarn.map;
#   - READELF and EXPECTED_SONAME are given and the SONAME differs.
cmake_minimum_required(VERSION 3.25)

foreach(_v IN ITEMS LIBRARY GOLDEN)
  if(NOT DEFINED ${_v})
    message(FATAL_ERROR "check_symbols.cmake: -D${_v}=... is required")
  endif()
endforeach()
if(NOT NM)
  find_program(NM NAMES nm REQUIRED)
endif()
if(NOT DEFINED VERSION_NODE)
  set(VERSION_NODE KVARN_0)
endif()
if(NOT EXISTS "${LIBRARY}")
  message(FATAL_ERROR "library not found: ${LIBRARY}")
endif()

# diff_lists(<title-a> <list-a> <title-b> <list-b>): prints a diff of two sorted sets, returns
# the number of differing lines in DIFF_COUNT and the text in DIFF_TEXT.
function(diff_lists title_a list_a title_b list_b)
  set(only_a ${${list_a}})
  set(only_b ${${list_b}})
  if(only_a AND ${list_b})
    list(REMOVE_ITEM only_a ${${list_b}})
  endif()
  if(only_b AND ${list_a})
    list(REMOVE_ITEM only_b ${${list_a}})
  endif()
  set(text "--- ${title_a}\n+++ ${title_b}\n")
  set(n 0)
  foreach(s IN LISTS only_a)
    string(APPEND text "-${s}\n")
    math(EXPR n "${n} + 1")
  endforeach()
  foreach(s IN LISTS only_b)
    string(APPEND text "+${s}\n")
    math(EXPR n "${n} + 1")
  endforeach()
  set(DIFF_COUNT ${n} PARENT_SCOPE)
  set(DIFF_TEXT "${text}" PARENT_SCOPE)
endfunction()

set(failures "")

# ---- the golden list ----------------------------------------------------------------------
file(STRINGS "${GOLDEN}" _golden_lines)
set(golden "")
foreach(_line IN LISTS _golden_lines)
  string(STRIP "${_line}" _line)
  if(_line STREQUAL "" OR _line MATCHES "^#")
    continue()
  endif()
  list(APPEND golden "${_line}")
endforeach()
set(_sorted ${golden})
list(REMOVE_DUPLICATES _sorted)
list(SORT _sorted)
if(NOT _sorted STREQUAL golden)
  string(APPEND failures "${GOLDEN} is not sorted and unique (keep it `LC_ALL=C sort -u`).\n")
endif()
set(golden ${_sorted})

# ---- what the library exports -------------------------------------------------------------
execute_process(COMMAND "${NM}" -D --defined-only "${LIBRARY}"
  OUTPUT_VARIABLE _nm_out ERROR_VARIABLE _nm_err RESULT_VARIABLE _nm_rc)
if(NOT _nm_rc EQUAL 0)
  message(FATAL_ERROR "${NM} -D --defined-only ${LIBRARY} failed (${_nm_rc}):\n${_nm_err}")
endif()
string(REPLACE "\n" ";" _nm_lines "${_nm_out}")
set(exported "")
set(bad_version "")
foreach(_line IN LISTS _nm_lines)
  if(NOT _line MATCHES "^[0-9a-fA-F]* *([A-Za-z]) ([^ ]+)$")
    continue()
  endif()
  set(_type "${CMAKE_MATCH_1}")
  set(_name "${CMAKE_MATCH_2}")
  set(_ver "")
  if(_name MATCHES "^([^@]+)@+(.*)$")
    set(_name "${CMAKE_MATCH_1}")
    set(_ver "${CMAKE_MATCH_2}")
  endif()
  if(_type STREQUAL "A")
    continue() # the version node itself (KVARN_0), an absolute symbol
  endif()
  if(NOT _type MATCHES "^[TWi]$")
    set(_name "${_name} (nm type ${_type}: not a function)")
  elseif(NOT _ver STREQUAL "" AND NOT _ver STREQUAL VERSION_NODE)
    list(APPEND bad_version "${_name}@${_ver}")
  endif()
  list(APPEND exported "${_name}")
endforeach()
list(REMOVE_DUPLICATES exported)
list(SORT exported)
list(LENGTH exported _n_exported)
list(LENGTH golden _n_golden)

diff_lists("${GOLDEN} (golden)" golden "${LIBRARY} (exported)" exported)
if(DIFF_COUNT GREATER 0)
  string(APPEND failures
    "The exported symbols differ from the golden list (${_n_golden} golden, ${_n_exported} exported):\n"
    "${DIFF_TEXT}"
    "('-' = in symbols.txt but not exported; '+' = exported but not in symbols.txt. Export only\n"
    " KVARN_API functions from capi/src, and update capi/symbols.txt with kvarn.h.)\n")
endif()
if(bad_version)
  list(JOIN bad_version "\n  " _bv)
  string(APPEND failures "Symbols outside the version node ${VERSION_NODE}:\n  ${_bv}\n")
endif()

# ---- what the header declares -------------------------------------------------------------
if(HEADER)
  set(declared "")
  set(_headers "${HEADER}")
  if(EXPERIMENTAL_HEADER)
    list(APPEND _headers "${EXPERIMENTAL_HEADER}")
  endif()
  foreach(_h IN LISTS _headers)
    file(READ "${_h}" _hdr)
    string(REGEX MATCHALL "KVARN_API[^;(#]*\\(" _decls "${_hdr}")
    foreach(_d IN LISTS _decls)
      if(_d MATCHES "([A-Za-z_][A-Za-z_0-9]*)[ \t\r\n]*\\($")
        set(_fn "${CMAKE_MATCH_1}")
        if(_fn MATCHES "^kvarn_")
          list(APPEND declared "${_fn}")
        endif()
      endif()
    endforeach()
  endforeach()
  list(REMOVE_DUPLICATES declared)
  list(SORT declared)
  list(JOIN _headers " + " _headers_text)
  diff_lists("${GOLDEN} (golden)" golden "${_headers_text} (KVARN_API declarations)" declared)
  if(DIFF_COUNT GREATER 0)
    string(APPEND failures "The golden list differs from the header's KVARN_API functions:\n"
      "${DIFF_TEXT}")
  endif()
endif()

# ---- SONAME --------------------------------------------------------------------------------
if(READELF AND EXPECTED_SONAME)
  execute_process(COMMAND "${READELF}" -d "${LIBRARY}" OUTPUT_VARIABLE _dyn RESULT_VARIABLE _rc)
  if(_dyn MATCHES "Library soname: \\[([^]]*)\\]")
    set(_soname "${CMAKE_MATCH_1}")
  else()
    set(_soname "(none)")
  endif()
  if(NOT _soname STREQUAL EXPECTED_SONAME)
    string(APPEND failures "SONAME is ${_soname}, expected ${EXPECTED_SONAME}\n")
  endif()
  set(_soname_msg ", SONAME ${_soname}")
endif()

if(failures)
  # NOTICE prints the text as is (FATAL_ERROR would reflow the diff into paragraphs).
  message(NOTICE "ABI check of ${LIBRARY} failed:\n${failures}")
  message(FATAL_ERROR "abi.exported_symbols: FAILED (see above)")
endif()
message(STATUS "OK: ${LIBRARY} exports exactly the ${_n_golden} symbols of ${GOLDEN}"
  " (version node ${VERSION_NODE}${_soname_msg})")
