// Forwarding header: ckpt/io/erasure.hpp moved to ckpt/store/nodes/erasure.hpp when io/ was split into modules
// (docs/architecture.md). Include the new path; this one goes in the next minor version.
#pragma once

#include "ckpt/store/nodes/erasure.hpp"
