# The design card's dependencies, all from Debian 12 packages (scripts/setup installs them).
# Shared by the build tree and by ckptConfig.cmake, so a consumer finds exactly what ckpt used.
find_package(Threads REQUIRED)
find_package(Boost 1.81 REQUIRED COMPONENTS json)
find_package(OpenSSL 3 REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(LIBURING REQUIRED IMPORTED_TARGET liburing)
find_path(XXHASH_INCLUDE_DIR xxhash.h REQUIRED)
