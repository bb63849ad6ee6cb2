// SPDX-License-Identifier: Apache-2.0
// Forwarding header: ckpt/io/load_into.hpp moved to ckpt/read/load_into.hpp when io/ was split into modules
// (docs/architecture.md). Include the new path; this one goes in the next minor version.
#pragma once

#include "ckpt/read/load_into.hpp"
