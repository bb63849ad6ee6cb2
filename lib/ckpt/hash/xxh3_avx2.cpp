// SPDX-License-Identifier: Apache-2.0
// Built with -mavx2 (lib/CMakeLists.txt); only called when the CPU reports AVX2.
#define CKPT_XXH3_VARIANT xxh3_kernels_avx2
#define CKPT_XXH3_NAME "avx2"
#include "ckpt/hash/detail/xxh3_kernels.inc"
