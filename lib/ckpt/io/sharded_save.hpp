// SPDX-License-Identifier: Apache-2.0
// Forwarding header: ckpt/io/sharded_save.hpp moved to ckpt/shard/sharded_save.hpp when io/ was split into modules
// (docs/architecture.md). Include the new path; this one goes in the next minor version.
#pragma once

#include "ckpt/shard/sharded_save.hpp"
