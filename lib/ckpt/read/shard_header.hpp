// SPDX-License-Identifier: Apache-2.0
// Private: the shard header check of every read path (format/shard_check.hpp) with the
// error precedence of the verifying reads, shared by CheckpointReader (files) and the
// object-store reads (ranged GETs).
#pragma once

#include "ckpt/core/export.hpp"

#include <string>

#include "ckpt/format/manifest.hpp"
#include "ckpt/format/shard_check.hpp"
#include "ckpt/read/reader.hpp"

CKPT_API_BEGIN
namespace ckpt::detail {

/// Reads the header of shard file `rec` (a record of `manifest`) through `read_at` (read_shard_head, for a file of the manifest's
/// size) and checks it against the manifest index (check_shard_head), naming `file`. With
/// Verify::fast or full, a header refused as Errc::malformed_shard has the chunks holding the
/// bytes it claims checked against their XXH3 first, so that damage the checksums catch is
/// the Errc::checksum_mismatch naming the chunk that verify() reports, not whatever the damaged
/// JSON happens to say; nothing more is read when the header passes.
CheckedShardHeader read_checked_shard_header(const Manifest& manifest, const ShardRecord& rec, const ReadAt& read_at, const std::string& file,
                                             Verify mode);

}  // namespace ckpt::detail
CKPT_API_END
