// SPDX-License-Identifier: Apache-2.0
// Private: the bounded parse of manifest text (manifest_limits.hpp describes the two passes),
// and the hooks the tests read to see what a parse cost.
#pragma once

#include "ckpt/core/export.hpp"

#include <boost/json/value.hpp>
#include <cstdint>
#include <functional>
#include <string_view>

#include "ckpt/format/manifest.hpp"
#include "ckpt/format/manifest_limits.hpp"

CKPT_API_BEGIN
namespace ckpt::detail {

/// What one bounded parse counted and held.
struct ManifestParseStats {
  ManifestCounts counts;
  std::uint64_t size = 0;       ///< bytes of text
  std::uint64_t allowance = 0;  ///< manifest_allowance(counts)
  std::uint64_t budget = 0;     ///< manifest_memory_budget(counts)
  std::uint64_t peak = 0;       ///< most bytes the document and the parser held at once
};

/// Scans `size` bytes of text from `source` (manifest_limits.hpp, pass 1), parses them into a
/// document held by a budgeted memory resource (pass 2) and calls `use` with it (the
/// document and its resource live until `use` returns). Throws Errc::malformed_manifest
/// naming `file` for invalid JSON and every limit crossed, and what `use` throws.
void parse_manifest_json(std::uint64_t size, const ManifestTextSource& source, std::string_view file,
                         const std::function<void(const boost::json::value&)>& use, ManifestParseStats* stats = nullptr);

/// The stats of the last parse_manifest_json that got as far as the document, on this
/// thread (a test hook).
ManifestParseStats last_manifest_parse() noexcept;
/// Manifests decoded by this process so far, from text or from a file (a test hook: the
/// reader's cache is seen to parse a manifest once).
std::uint64_t manifest_decode_count() noexcept;

}  // namespace ckpt::detail
CKPT_API_END
