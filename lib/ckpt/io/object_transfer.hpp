// Forwarding header: ckpt/io/object_transfer.hpp moved to ckpt/objstore/object_transfer.hpp when io/ was split into modules
// (docs/architecture.md). Include the new path; this one goes in the next minor version.
#pragma once

#include "ckpt/objstore/object_transfer.hpp"
