// SPDX-License-Identifier: Apache-2.0
// Forwarding header: ckpt/io/reshard.hpp moved to ckpt/ops/reshard.hpp when io/ was split into modules
// (docs/architecture.md). Include the new path; this one goes in the next minor version.
#pragma once

#include "ckpt/ops/reshard.hpp"
