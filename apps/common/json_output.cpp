// SPDX-License-Identifier: Apache-2.0
#include "json_output.hpp"

namespace ckpt::cli {

std::string schema_id(std::string_view name, int version) { return std::string(name) + "/" + std::to_string(version); }

boost::json::object with_schema(std::string_view name, int version, const boost::json::object& body) {
  boost::json::object out;
  out.reserve(body.size() + 1);
  out[kSchemaField] = schema_id(name, version);
  for (const auto& [key, value] : body)
    if (key != kSchemaField) out[key] = value;
  return out;
}

}  // namespace ckpt::cli
