// SPDX-License-Identifier: Apache-2.0
// Forwarding header: ckpt/io/root_lock.hpp moved to ckpt/store/root_lock.hpp when io/ was split into modules
// (docs/architecture.md). Include the new path; this one goes in the next minor version.
#pragma once

#include "ckpt/store/root_lock.hpp"
