// SPDX-License-Identifier: Apache-2.0
// Forwarding header: ckpt/io/object_store.hpp moved to ckpt/objstore/object_store.hpp when io/ was split into modules
// (docs/architecture.md). Include the new path; this one goes in the next minor version.
#pragma once

#include "ckpt/objstore/object_store.hpp"
