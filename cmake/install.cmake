# Install rules for libkvarn (included from the top-level CMakeLists.txt).
#
# Installs, under CMAKE_INSTALL_PREFIX:
#   include/kvarn/kvarn.h                         the public header
#   include/kvarn/kvarn_experimental.h            research-only entry points (no stability promise)
#   <libdir>/libkvarn.so.<version>, .so.<ABI>, .so  (SONAME libkvarn.so.<KVARN_ABI_VERSION>)
#   <libdir>/cmake/kvarn/kvarn{Config,ConfigVersion,Targets*}.cmake
#                                                 find_package(kvarn) -> kvarn::kvarn
#   <libdir>/pkgconfig/kvarn.pc                   pkg-config --cflags --libs kvarn
#
# and writes <build dir>/kvarn-uninstalled.pc, which pkg-config prefers to kvarn.pc: with
# PKG_CONFIG_PATH=<build dir>, `pkg-config --cflags --libs kvarn` gives the source tree's header
# and the build tree's library (with an RPATH to it), no install step needed.
#
# Only `kvarn` is installed from the library side; kvarn_internal is a test-only static twin.
# Components: "Runtime" (the versioned shared object) and "Development" (everything else), so a
# packager can split lib and -dev packages with `cmake --install --component`.

include(CMakePackageConfigHelpers)

set(KVARN_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/kvarn"
    CACHE STRING "Install directory of kvarnConfig.cmake, relative to the prefix")
set(KVARN_INSTALL_PKGCONFIGDIR "${CMAKE_INSTALL_LIBDIR}/pkgconfig"
    CACHE STRING "Install directory of kvarn.pc, relative to the prefix")

install(TARGETS kvarn
  EXPORT kvarnTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
    COMPONENT Runtime
    NAMELINK_COMPONENT Development
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT Development
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT Runtime
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

install(FILES ${PROJECT_SOURCE_DIR}/capi/include/kvarn/kvarn.h
    ${PROJECT_SOURCE_DIR}/capi/include/kvarn/kvarn_experimental.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kvarn
  COMPONENT Development)

# ---- CMake package: find_package(kvarn) ------------------------------------------------------
install(EXPORT kvarnTargets
  NAMESPACE kvarn::
  FILE kvarnTargets.cmake
  DESTINATION ${KVARN_INSTALL_CMAKEDIR}
  COMPONENT Development)

configure_package_config_file(
  ${PROJECT_SOURCE_DIR}/cmake/kvarnConfig.cmake.in
  ${PROJECT_BINARY_DIR}/cmake/kvarnConfig.cmake
  INSTALL_DESTINATION ${KVARN_INSTALL_CMAKEDIR}
  PATH_VARS CMAKE_INSTALL_INCLUDEDIR)

# A consumer asking for kvarn X.Y accepts any installed X.Z with Z >= Y (same major).
write_basic_package_version_file(
  ${PROJECT_BINARY_DIR}/cmake/kvarnConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMajorVersion)

install(FILES
    ${PROJECT_BINARY_DIR}/cmake/kvarnConfig.cmake
    ${PROJECT_BINARY_DIR}/cmake/kvarnConfigVersion.cmake
  DESTINATION ${KVARN_INSTALL_CMAKEDIR}
  COMPONENT Development)

# ---- pkg-config: kvarn.pc ----------------------------------------------------------------------
# The .pc file is relocatable: prefix is computed from ${pcfiledir}, so
# `cmake --install <build> --prefix <anywhere>` gives a working file (the ABI tests rely on it).
if(IS_ABSOLUTE "${KVARN_INSTALL_PKGCONFIGDIR}")
  set(KVARN_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
else()
  file(RELATIVE_PATH _kvarn_pc_up "/kvarn-root/${KVARN_INSTALL_PKGCONFIGDIR}" "/kvarn-root")
  string(REGEX REPLACE "/$" "" _kvarn_pc_up "${_kvarn_pc_up}")
  set(KVARN_PC_PREFIX "\${pcfiledir}/${_kvarn_pc_up}")
endif()
foreach(_dir LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${_dir}}")
    set(KVARN_PC_${_dir} "${CMAKE_INSTALL_${_dir}}")
  else()
    set(KVARN_PC_${_dir} "\${prefix}/${CMAKE_INSTALL_${_dir}}")
  endif()
endforeach()
set(KVARN_PC_LIBS "-L\${libdir} -lkvarn")
# Kept out of the build directory's top level, where kvarn-uninstalled.pc lives.
configure_file(${PROJECT_SOURCE_DIR}/cmake/kvarn.pc.in ${PROJECT_BINARY_DIR}/cmake/kvarn.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/cmake/kvarn.pc
  DESTINATION ${KVARN_INSTALL_PKGCONFIGDIR}
  COMPONENT Development)

# The build tree's twin (pkg-config's "-uninstalled" convention): the library's build directory,
# known at generate time; a multi-config generator writes one file per configuration.
set(KVARN_PC_PREFIX "${PROJECT_BINARY_DIR}")
set(KVARN_PC_LIBDIR "$<TARGET_FILE_DIR:kvarn>")
set(KVARN_PC_INCLUDEDIR "${PROJECT_SOURCE_DIR}/capi/include")
set(KVARN_PC_LIBS "-L\${libdir} -Wl,-rpath,\${libdir} -lkvarn")
configure_file(${PROJECT_SOURCE_DIR}/cmake/kvarn.pc.in
               ${PROJECT_BINARY_DIR}/cmake/kvarn-uninstalled.pc.in @ONLY)
get_property(_kvarn_multi_config GLOBAL PROPERTY GENERATOR_IS_MULTI_CONFIG)
if(_kvarn_multi_config)
  set(_kvarn_pc_out "${PROJECT_BINARY_DIR}/$<CONFIG>/kvarn-uninstalled.pc")
else()
  set(_kvarn_pc_out "${PROJECT_BINARY_DIR}/kvarn-uninstalled.pc")
endif()
file(GENERATE OUTPUT ${_kvarn_pc_out} INPUT ${PROJECT_BINARY_DIR}/cmake/kvarn-uninstalled.pc.in)
