// SPDX-License-Identifier: Apache-2.0
// The one shape of the JSON a ckpt program prints or writes for scripts (--json, ckpt-bench's
// --json FILE, the benchmarks' --json FILE): a top-level object whose first field is
//   "schema": "NAME/VERSION"      e.g. "ckpt.ls/1", "ckpt.error/1", "ckpt-bench/1"
// NAME says which output it is (a script that reads several tells them apart by it), VERSION
// the version of that output's format. The version changes when a field is removed or
// changes meaning; adding a field does not change it, so a script written for NAME/1 keeps
// working until NAME/2. Every output and its fields: docs/json-output.md.
//
// "schema" and not "schema_version": the files a checkpoint is made of (manifest.json, the
// tier manifest, the lease) carry an integer schema_version of the on-disk format, and
// `ckpt inspect --json` prints the manifest inside its output; the output's own field has
// another name so that the two never read alike.
#pragma once

#include <boost/json.hpp>
#include <string>
#include <string_view>

namespace ckpt::cli {

/// The name of the field: "schema".
inline constexpr std::string_view kSchemaField = "schema";

/// "NAME/VERSION".
std::string schema_id(std::string_view name, int version);

/// `body` with "schema": schema_id(name, version) as its first field (in place of one it may
/// hold already), the other fields after it in their order.
boost::json::object with_schema(std::string_view name, int version, const boost::json::object& body);

}  // namespace ckpt::cli
