// SPDX-License-Identifier: Apache-2.0
// Forwarding header: ckpt/io/range_reader.hpp moved to ckpt/read/range_reader.hpp when io/ was split into modules
// (docs/architecture.md). Include the new path; this one goes in the next minor version.
#pragma once

#include "ckpt/read/range_reader.hpp"
