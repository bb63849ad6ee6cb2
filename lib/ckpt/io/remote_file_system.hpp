// SPDX-License-Identifier: Apache-2.0
// Forwarding header: ckpt/io/remote_file_system.hpp moved to ckpt/fs/remote_file_system.hpp when io/ was split into modules
// (docs/architecture.md). Include the new path; this one goes in the next minor version.
#pragma once

#include "ckpt/fs/remote_file_system.hpp"
