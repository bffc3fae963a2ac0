# abi.pkgconfig_uninstalled: a downstream program built from the build tree through pkg-config,
# as README.md shows it: PKG_CONFIG_PATH=<build dir> finds kvarn-uninstalled.pc (the source
# tree's header, the build tree's library and an RPATH to it), so the program runs with no install
# step and no LD_LIBRARY_PATH. Run by CTest as
#
#   cmake -DBUILD_DIR=<top build dir> -DWORK_DIR=<scratch dir> -DSOURCE=<main.c>
#         -DC_COMPILER=<cc> [-DC_FLAGS=<flags>] [-DEXE_LINKER_FLAGS=<flags>]
#         -DEXPECTED_VERSION=<x.y.z> -DPKG_CONFIG=<pkg-config> -P uninstalled_consumer.cmake
cmake_minimum_required(VERSION 3.25)

foreach(_v IN ITEMS BUILD_DIR WORK_DIR SOURCE C_COMPILER EXPECTED_VERSION PKG_CONFIG)
  if(NOT DEFINED ${_v} OR "${${_v}}" STREQUAL "")
    message(FATAL_ERROR "uninstalled_consumer.cmake: -D${_v}=... is required")
  endif()
endforeach()
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

set(ENV{PKG_CONFIG_PATH} "${BUILD_DIR}")
unset(ENV{LD_LIBRARY_PATH})
execute_process(COMMAND "${PKG_CONFIG}" --modversion kvarn
  OUTPUT_VARIABLE _version OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0 OR NOT _version STREQUAL EXPECTED_VERSION)
  message(FATAL_ERROR "PKG_CONFIG_PATH=${BUILD_DIR} pkg-config --modversion kvarn gave "
    "'${_version}' (${_rc}), expected ${EXPECTED_VERSION}")
endif()
execute_process(COMMAND "${PKG_CONFIG}" --cflags --libs kvarn
  OUTPUT_VARIABLE _flags OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "pkg-config --cflags --libs kvarn failed")
endif()
message(STATUS "PKG_CONFIG_PATH=${BUILD_DIR} pkg-config --cflags --libs kvarn: ${_flags}")

separate_arguments(_flags UNIX_COMMAND "${_flags}")
separate_arguments(_cflags UNIX_COMMAND "${C_FLAGS}")
separate_arguments(_ldflags UNIX_COMMAND "${EXE_LINKER_FLAGS}")
set(_exe "${WORK_DIR}/consumer")
execute_process(COMMAND "${C_COMPILER}" -std=c99 -Wall -Wextra -Werror -pedantic ${_cflags}
                        "${SOURCE}" ${_flags} ${_ldflags} -o "${_exe}"
  COMMAND_ECHO STDOUT RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "compiling ${SOURCE} with the build tree's pkg-config flags failed")
endif()
execute_process(COMMAND "${_exe}" COMMAND_ECHO STDOUT RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "${_exe} failed (${_rc})")
endif()
message(STATUS "OK: the build tree's libkvarn works through kvarn-uninstalled.pc")
