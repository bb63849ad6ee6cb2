// SPDX-License-Identifier: Apache-2.0
#define CKPT_XXH3_VARIANT xxh3_kernels_sse2
#define CKPT_XXH3_NAME "sse2"
#include "ckpt/hash/detail/xxh3_kernels.inc"
