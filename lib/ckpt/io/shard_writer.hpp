// SPDX-License-Identifier: Apache-2.0
// Forwarding header: ckpt/io/shard_writer.hpp moved to ckpt/shard/shard_writer.hpp when io/ was split into modules
// (docs/architecture.md). Include the new path; this one goes in the next minor version.
#pragma once

#include "ckpt/shard/shard_writer.hpp"
