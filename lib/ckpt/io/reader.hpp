// Forwarding header: ckpt/io/reader.hpp moved to ckpt/read/reader.hpp when io/ was split into modules
// (docs/architecture.md). Include the new path; this one goes in the next minor version.
#pragma once

#include "ckpt/read/reader.hpp"
