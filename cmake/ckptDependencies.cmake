# SPDX-License-Identifier: Apache-2.0
# The design card's dependencies, all from Debian 12 packages (scripts/setup installs them).
# Shared by the build tree and by ckptConfig.cmake, so a consumer finds exactly what ckpt used.
find_package(Threads REQUIRED)
# CONFIG: Boost's own BoostConfig.cmake (libboost-dev ships it), not CMake's FindBoost module,
# which CMake 3.30 deprecated (policy CMP0167; Debian 13's CMake 3.31 warns on every configure).
find_package(Boost 1.81 REQUIRED CONFIG COMPONENTS json)
find_package(OpenSSL 3 REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(LIBURING REQUIRED IMPORTED_TARGET liburing)
# Reed-Solomon erasure coding of checkpoints across nodes (store/nodes/erasure.hpp): ISA-L, libisal-dev.
pkg_check_modules(LIBISAL REQUIRED IMPORTED_TARGET libisal)
# The S3 object-store client, ckpt::s3 (option CKPT_S3): libcurl (objstore/s3.cpp, SigV4
# through CURLOPT_AWS_SIGV4; libcurl4-openssl-dev) and expat (the XML of S3 answers,
# objstore/detail/s3_xml.cpp; libexpat1-dev).
set(CKPT_HAVE_S3 OFF)
if(CKPT_S3 STREQUAL "ON")
  pkg_check_modules(LIBCURL REQUIRED IMPORTED_TARGET libcurl>=7.75)
  pkg_check_modules(EXPAT REQUIRED IMPORTED_TARGET expat)
  set(CKPT_HAVE_S3 ON)
elseif(CKPT_S3 STREQUAL "AUTO")
  pkg_check_modules(LIBCURL QUIET IMPORTED_TARGET libcurl>=7.75)
  pkg_check_modules(EXPAT QUIET IMPORTED_TARGET expat)
  if(TARGET PkgConfig::LIBCURL AND TARGET PkgConfig::EXPAT)
    set(CKPT_HAVE_S3 ON)
  else()
    message(STATUS "ckpt: libcurl or expat not found (install libcurl4-openssl-dev and libexpat1-dev): the S3 client (ckpt::s3) and its tests are not built")
  endif()
elseif(NOT CKPT_S3 STREQUAL "OFF")
  message(FATAL_ERROR "CKPT_S3 must be AUTO, ON or OFF")
endif()
find_path(XXHASH_INCLUDE_DIR xxhash.h REQUIRED)
# The command-line programs (apps/, examples/) parse with CLI11, header-only (libcli11-dev).
# Only they need it: a consumer of the installed library never does.
if(CKPT_BUILD_APPS)
  find_path(CLI11_INCLUDE_DIR CLI/CLI.hpp)
  if(NOT CLI11_INCLUDE_DIR)
    message(FATAL_ERROR "ckpt: CLI11 not found (no CLI/CLI.hpp): install libcli11-dev (scripts/setup does), "
                        "or configure with -DCKPT_BUILD_APPS=OFF to build the library alone")
  endif()
endif()
