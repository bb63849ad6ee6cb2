// SPDX-License-Identifier: Apache-2.0
// Forwarding header: ckpt/io/reader.hpp moved to ckpt/read/reader.hpp when io/ was split into modules
// (docs/architecture.md); open_latest(fs, root), which opens any kind of root, is ckpt/store/store.hpp's.
// Include the new paths; this one goes in the next minor version.
#pragma once

#include "ckpt/read/reader.hpp"
#include "ckpt/store/store.hpp"
