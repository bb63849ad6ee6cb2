// SPDX-License-Identifier: Apache-2.0
// Forwarding header: ckpt/io/layout.hpp moved to ckpt/fs/layout.hpp when io/ was split into modules
// (docs/architecture.md). Include the new path; this one goes in the next minor version.
#pragma once

#include "ckpt/fs/layout.hpp"
