# Cross build for 64-bit Arm Linux with Debian's cross toolchain (g++-aarch64-linux-gnu); test
# binaries run through qemu-aarch64 (qemu-user) as CTest's emulator. Used by
# scripts/neon-qemu-test.sh:
#   cmake -S . -B build/neon -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/aarch64-linux-gnu.cmake
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(KVARN_AARCH64_SYSROOT /usr/aarch64-linux-gnu)
# Target libraries and headers only from the cross sysroot and any root given with
# -DCMAKE_FIND_ROOT_PATH=... (the script's cross-built GoogleTest); programs from the host.
list(APPEND CMAKE_FIND_ROOT_PATH ${KVARN_AARCH64_SYSROOT})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64;-L;${KVARN_AARCH64_SYSROOT})
