// SPDX-License-Identifier: Apache-2.0
// Forwarding header: ckpt/io/node_commit.hpp moved to ckpt/store/nodes/node_commit.hpp when io/ was split into modules
// (docs/architecture.md). Include the new path; this one goes in the next minor version.
#pragma once

#include "ckpt/store/nodes/node_commit.hpp"
