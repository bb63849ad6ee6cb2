// SPDX-License-Identifier: Apache-2.0
#include "ckpt/version.hpp"

namespace ckpt {

std::string_view version() noexcept { return CKPT_VERSION_STRING; }

}  // namespace ckpt
