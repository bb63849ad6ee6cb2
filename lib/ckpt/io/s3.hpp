// SPDX-License-Identifier: Apache-2.0
// Forwarding header: ckpt/io/s3.hpp moved to ckpt/objstore/s3.hpp when io/ was split into modules
// (docs/architecture.md). Include the new path; this one goes in the next minor version.
#pragma once

#include "ckpt/objstore/s3.hpp"
