// SPDX-License-Identifier: Apache-2.0
// Inside the library (and its programs and tests): a JsonObject is a boost::json::object.
// json_of() is that object, to read or change in place; to_json_object() wraps one. Also the
// manifest's pieces as Boost.JSON objects, and the tagging of non-finite doubles. Not
// installed (as format/json_util.hpp): a consumer of ckpt uses JsonObject's own calls or its
// JSON text, and no installed header includes this one.
#pragma once

#include "ckpt/core/export.hpp"

#include <memory>
#include <utility>

#include <boost/json/object.hpp>
#include <boost/json/value.hpp>
#include <string_view>

#include "ckpt/format/json_object.hpp"
#include "ckpt/format/manifest.hpp"

CKPT_API_BEGIN
namespace ckpt {

struct JsonObject::Impl {
  boost::json::object o;
};

struct JsonObjectAccess {
  static boost::json::object& get(JsonObject& j) {
    if (!j.impl_) j.impl_ = std::make_unique<JsonObject::Impl>();
    return j.impl_->o;
  }
  static const boost::json::object& get(const JsonObject& j) noexcept {
    static const boost::json::object empty;
    return j.impl_ ? j.impl_->o : empty;
  }
};

/// The object `j` holds (created empty on first use of a non-const one).
inline boost::json::object& json_of(JsonObject& j) { return JsonObjectAccess::get(j); }
inline const boost::json::object& json_of(const JsonObject& j) noexcept { return JsonObjectAccess::get(j); }
/// A JsonObject holding `o`.
inline JsonObject to_json_object(boost::json::object o) {
  JsonObject j;
  json_of(j) = std::move(o);
  return j;
}

/// The free-form parts (`training`, each shard's `metadata`) may hold any double, but JSON
/// has no spelling for NaN or the infinities. encode_manifest writes each non-finite double
/// there as the object {"__float__": S}, S one of "inf", "-inf", "nan" (the default quiet
/// NaN, bits 0x7ff8000000000000) or "nan:0x" and the 16 lower-case hex digits of any other
/// NaN's bits (its sign and payload); decode_manifest reads each such object (exactly that
/// one member, one of those spellings) back as the double, bit for bit. Python's
/// float.fromhex reads the first three spellings. (A number literal beyond the double
/// range, 1e400, is still refused on decode: no writer spells a number that way.)
/// tag_non_finite: `v` with every non-finite double so tagged (a copy).
boost::json::value tag_non_finite(const boost::json::value& v);
/// untag_non_finite: every tag in `v` turned back into its double, in place.
void untag_non_finite(boost::json::value& v);
/// False if `v` holds a non-finite double (Boost.JSON reads a literal beyond the double range,
/// 1e400, as infinity, which JSON cannot spell).
bool all_finite(const boost::json::value& v);

/// The JSON objects encode_manifest writes for one shard entry, one tensor index entry and
/// one redundancy block.
/// `stripe`: a parity block's stripe (its members are written out for an independent
/// decoder); null for a replica.
boost::json::object block_to_json(const RedundancyBlock& b, const Stripe* stripe);
/// `parts`: the manifest is schema 3 (the entry carries `part`; a part other than 0 carries
/// no param range or metadata). A tensor entry carries `part` when it is not 0.
boost::json::object shard_to_json(const ShardRecord& s, bool parts = false);
boost::json::object tensor_to_json(const TensorRecord& t);
/// The sharding field of a tensor entry: {"slice": {...}}, {"replicated": {...}} or
/// {"rank_local": true}.
boost::json::object sharding_to_json(const TensorSharding& s);
/// The one sharding field of `entry` (an object as sharding_to_json writes it), checked on
/// its own, as decode_manifest checks it before the checks against its entry and the other
/// entries: Errc::malformed_manifest naming `file` and `where` otherwise.
TensorSharding sharding_from_json(const boost::json::object& entry, std::string_view file, std::string_view where);

}  // namespace ckpt
CKPT_API_END
