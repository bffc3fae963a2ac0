# abi.install_consumer: install the built project into a temporary prefix, then build and run a
# tiny downstream program against it twice: once through find_package(kvarn) (CMake package) and
# once through pkg-config. Run by CTest as
#
#   cmake -DBUILD_DIR=<top build dir> -DWORK_DIR=<scratch dir> -DCONSUMER_DIR=<tests/abi/consumer>
#         -DGENERATOR=<generator> [-DMAKE_PROGRAM=<ninja>] -DC_COMPILER=<cc> [-DC_FLAGS=<flags>]
#         [-DEXE_LINKER_FLAGS=<flags>] [-DCONFIG=<Release>] -DLIBDIR=<lib> -DINCLUDEDIR=<include>
#         -DEXPECTED_VERSION=<x.y.z> -DEXPECTED_SONAME=<libkvarn.so.N> [-DPKG_CONFIG=<pkg-config>]
#         -P install_consumer.cmake
#
# C_FLAGS / EXE_LINKER_FLAGS carry the sanitizer flags of the asan/tsan presets, so the consumer
# links the same runtime as the instrumented library.
cmake_minimum_required(VERSION 3.25)

foreach(_v IN ITEMS BUILD_DIR WORK_DIR CONSUMER_DIR GENERATOR C_COMPILER LIBDIR INCLUDEDIR
                    EXPECTED_VERSION EXPECTED_SONAME)
  if(NOT DEFINED ${_v} OR "${${_v}}" STREQUAL "")
    message(FATAL_ERROR "install_consumer.cmake: -D${_v}=... is required")
  endif()
endforeach()
if(NOT CONFIG)
  set(CONFIG Release)
endif()
foreach(_dir IN ITEMS LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${${_dir}}")
    message(FATAL_ERROR "CMAKE_INSTALL_${_dir} is absolute (${${_dir}}): the project cannot be "
      "installed into another prefix, so this test cannot run. Configure with a relative one.")
  endif()
endforeach()

set(prefix "${WORK_DIR}/prefix")
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

function(step title)
  message(STATUS "---- ${title}")
endfunction()

# run(<args>...): runs a command, echoing it; any failure ends the test with its output.
function(run)
  execute_process(COMMAND ${ARGN} COMMAND_ECHO STDOUT RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    list(JOIN ARGN " " _cmd)
    message(FATAL_ERROR "command failed (${rc}): ${_cmd}")
  endif()
endfunction()

# ---- 1. install ------------------------------------------------------------------------------
step("install ${BUILD_DIR} into ${prefix}")
run("${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${prefix}" --config "${CONFIG}")

set(_missing "")
foreach(_f IN ITEMS
    "${INCLUDEDIR}/kvarn/kvarn.h"
    "${INCLUDEDIR}/kvarn/kvarn_experimental.h"
    "${LIBDIR}/libkvarn.so"
    "${LIBDIR}/${EXPECTED_SONAME}"
    "${LIBDIR}/cmake/kvarn/kvarnConfig.cmake"
    "${LIBDIR}/cmake/kvarn/kvarnConfigVersion.cmake"
    "${LIBDIR}/cmake/kvarn/kvarnTargets.cmake"
    "${LIBDIR}/pkgconfig/kvarn.pc")
  if(NOT EXISTS "${prefix}/${_f}")
    list(APPEND _missing "${_f}")
  endif()
endforeach()
if(_missing)
  list(JOIN _missing "\n  " _m)
  message(FATAL_ERROR "the install tree lacks:\n  ${_m}")
endif()
if(NOT IS_SYMLINK "${prefix}/${LIBDIR}/libkvarn.so")
  message(FATAL_ERROR "${LIBDIR}/libkvarn.so should be a link to ${EXPECTED_SONAME}")
endif()
file(GLOB_RECURSE _internal "${prefix}/*kvarn_internal*")
if(_internal)
  message(FATAL_ERROR "kvarn_internal must not be installed: ${_internal}")
endif()

# ---- 2. CMake package consumer ---------------------------------------------------------------
step("find_package(kvarn) consumer")
set(_gen_args -G "${GENERATOR}")
if(MAKE_PROGRAM)
  list(APPEND _gen_args "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()
run("${CMAKE_COMMAND}" -S "${CONSUMER_DIR}" -B "${WORK_DIR}/cmake-consumer" ${_gen_args}
  "-DCMAKE_BUILD_TYPE=${CONFIG}"
  "-DCMAKE_C_COMPILER=${C_COMPILER}"
  "-DCMAKE_C_FLAGS=${C_FLAGS}"
  "-DCMAKE_EXE_LINKER_FLAGS=${EXE_LINKER_FLAGS}"
  "-DCMAKE_PREFIX_PATH=${prefix}"
  "-DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF"
  "-DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF"
  "-DKVARN_EXPECTED_PREFIX=${prefix}")
run("${CMAKE_COMMAND}" --build "${WORK_DIR}/cmake-consumer" --config "${CONFIG}")
# CMake puts the imported library's directory in the executable's RPATH: no LD_LIBRARY_PATH.
set(_exe "${WORK_DIR}/cmake-consumer/kvarn_consumer")
if(NOT EXISTS "${_exe}")
  set(_exe "${WORK_DIR}/cmake-consumer/${CONFIG}/kvarn_consumer")
endif()
run("${_exe}")

# ---- 3. pkg-config consumer ------------------------------------------------------------------
if(NOT PKG_CONFIG)
  # CTest reports the test as "Skipped" (SKIP_REGULAR_EXPRESSION), not as a pass.
  message(STATUS "KVARN_TEST_SKIPPED: pkg-config was not found at configure time, so the "
    "pkg-config consumer cannot be checked (install pkg-config and reconfigure)")
  return()
endif()
step("pkg-config consumer")
set(ENV{PKG_CONFIG_PATH} "${prefix}/${LIBDIR}/pkgconfig")
unset(ENV{PKG_CONFIG_LIBDIR})
execute_process(COMMAND "${PKG_CONFIG}" --modversion kvarn
  OUTPUT_VARIABLE _pc_version OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0 OR NOT _pc_version STREQUAL EXPECTED_VERSION)
  message(FATAL_ERROR "pkg-config --modversion kvarn gave '${_pc_version}' (${_rc}), "
    "expected ${EXPECTED_VERSION}")
endif()
execute_process(COMMAND "${PKG_CONFIG}" --cflags --libs kvarn
  OUTPUT_VARIABLE _pc_flags OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _rc)
execute_process(COMMAND "${PKG_CONFIG}" --variable=libdir kvarn
  OUTPUT_VARIABLE _pc_libdir OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "pkg-config --cflags --libs kvarn failed")
endif()
message(STATUS "pkg-config --cflags --libs kvarn: ${_pc_flags}")
get_filename_component(_pc_libdir_real "${_pc_libdir}" REALPATH)
get_filename_component(_libdir_real "${prefix}/${LIBDIR}" REALPATH)
if(NOT _pc_libdir_real STREQUAL _libdir_real)
  message(FATAL_ERROR "kvarn.pc libdir is ${_pc_libdir}, expected ${prefix}/${LIBDIR} "
    "(the .pc file must be relocatable)")
endif()
separate_arguments(_pc_flags UNIX_COMMAND "${_pc_flags}")
separate_arguments(_cflags UNIX_COMMAND "${C_FLAGS}")
separate_arguments(_ldflags UNIX_COMMAND "${EXE_LINKER_FLAGS}")
set(_pc_exe "${WORK_DIR}/pkgconfig-consumer")
run("${C_COMPILER}" -std=c99 -Wall -Wextra -Werror -pedantic ${_cflags}
  "${CONSUMER_DIR}/main.c" ${_pc_flags} ${_ldflags} -o "${_pc_exe}")
set(_ld_path "${_pc_libdir}")
if(NOT "$ENV{LD_LIBRARY_PATH}" STREQUAL "")
  string(APPEND _ld_path ":$ENV{LD_LIBRARY_PATH}")
endif()
run("${CMAKE_COMMAND}" -E env "LD_LIBRARY_PATH=${_ld_path}" "${_pc_exe}")

message(STATUS "OK: the installed libkvarn works through find_package(kvarn) and pkg-config")
