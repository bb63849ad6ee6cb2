// SPDX-License-Identifier: Apache-2.0
#include "ckpt/format/json_object.hpp"

#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include "ckpt/core/error.hpp"
#include "ckpt/format/boost_json.hpp"
#include "ckpt/format/json_util.hpp"

namespace ckpt {

namespace json = boost::json;

namespace {

json::value parse_value(std::string_view text, const std::string& what) {
  json::parse_options opt;
  opt.max_depth = 64;
  std::error_code ec;
  json::value v = json::parse(text, ec, {}, opt);
  if (ec) throw Error(Errc::invalid_argument, {}, what + " is not valid JSON: " + ec.message());
  untag_non_finite(v);
  return v;
}

[[noreturn]] void wrong_kind(std::string_view key, std::string_view expected, const json::value& v) {
  throw Error(Errc::invalid_argument, {}, "JSON member '" + std::string(key) + "'", std::string(expected), detail::json_kind(v));
}

}  // namespace

JsonObject::JsonObject() noexcept = default;
JsonObject::JsonObject(const JsonObject& other) : impl_(other.impl_ ? std::make_unique<Impl>(*other.impl_) : nullptr) {}
JsonObject::JsonObject(JsonObject&& other) noexcept = default;
JsonObject& JsonObject::operator=(const JsonObject& other) {
  if (this != &other) impl_ = other.impl_ ? std::make_unique<Impl>(*other.impl_) : nullptr;
  return *this;
}
JsonObject& JsonObject::operator=(JsonObject&& other) noexcept = default;
JsonObject::~JsonObject() = default;

JsonObject JsonObject::parse(std::string_view text) {
  json::value v = parse_value(text, "JSON text");
  if (!v.is_object()) throw Error(Errc::invalid_argument, {}, "JSON text", "an object", detail::json_kind(v));
  return to_json_object(std::move(v.as_object()));
}

std::string JsonObject::dump() const { return json::serialize(tag_non_finite(json_of(*this))); }

bool JsonObject::empty() const noexcept { return json_of(*this).empty(); }
std::size_t JsonObject::size() const noexcept { return json_of(*this).size(); }
bool JsonObject::contains(std::string_view key) const noexcept { return json_of(*this).contains(key); }

std::vector<std::string> JsonObject::keys() const {
  std::vector<std::string> out;
  for (const auto& kv : json_of(*this)) out.emplace_back(kv.key());
  return out;
}

bool JsonObject::erase(std::string_view key) { return impl_ && impl_->o.erase(key) != 0; }

JsonObject& JsonObject::set(std::string_view key, bool value) {
  json_of(*this)[key] = value;
  return *this;
}
JsonObject& JsonObject::set(std::string_view key, double value) {
  json_of(*this)[key] = value;
  return *this;
}
JsonObject& JsonObject::set(std::string_view key, std::string_view value) {
  json_of(*this)[key] = value;
  return *this;
}
JsonObject& JsonObject::set(std::string_view key, const JsonObject& value) {
  json::object copy = json_of(value);  // before the assignment: `value` may be *this
  json_of(*this)[key] = std::move(copy);
  return *this;
}
JsonObject& JsonObject::set_int(std::string_view key, std::int64_t value) {
  json_of(*this)[key] = value;
  return *this;
}
JsonObject& JsonObject::set_uint(std::string_view key, std::uint64_t value) {
  json_of(*this)[key] = value;
  return *this;
}
JsonObject& JsonObject::set_json(std::string_view key, std::string_view json_text) {
  json::value v = parse_value(json_text, "the value of JSON member '" + std::string(key) + "'");
  json_of(*this)[key] = std::move(v);
  return *this;
}

std::optional<bool> JsonObject::get_bool(std::string_view key) const {
  const json::value* v = json_of(*this).if_contains(key);
  if (!v) return std::nullopt;
  if (!v->is_bool()) wrong_kind(key, "a boolean", *v);
  return v->get_bool();
}

std::optional<std::int64_t> JsonObject::get_int(std::string_view key) const {
  const json::value* v = json_of(*this).if_contains(key);
  if (!v) return std::nullopt;
  if (v->is_int64()) return v->get_int64();
  if (v->is_uint64() && v->get_uint64() <= static_cast<std::uint64_t>(INT64_MAX)) return static_cast<std::int64_t>(v->get_uint64());
  wrong_kind(key, "an integer from -2^63 to 2^63-1", *v);
}

std::optional<std::uint64_t> JsonObject::get_uint(std::string_view key) const {
  const json::value* v = json_of(*this).if_contains(key);
  if (!v) return std::nullopt;
  if (v->is_uint64()) return v->get_uint64();
  if (v->is_int64() && v->get_int64() >= 0) return static_cast<std::uint64_t>(v->get_int64());
  wrong_kind(key, "a non-negative integer", *v);
}

std::optional<double> JsonObject::get_double(std::string_view key) const {
  const json::value* v = json_of(*this).if_contains(key);
  if (!v) return std::nullopt;
  if (v->is_double()) return v->get_double();
  if (v->is_int64()) return static_cast<double>(v->get_int64());
  if (v->is_uint64()) return static_cast<double>(v->get_uint64());
  wrong_kind(key, "a number", *v);
}

std::optional<std::string> JsonObject::get_string(std::string_view key) const {
  const json::value* v = json_of(*this).if_contains(key);
  if (!v) return std::nullopt;
  if (!v->is_string()) wrong_kind(key, "a string", *v);
  return std::string(v->get_string());
}

std::optional<JsonObject> JsonObject::get_object(std::string_view key) const {
  const json::value* v = json_of(*this).if_contains(key);
  if (!v) return std::nullopt;
  if (!v->is_object()) wrong_kind(key, "an object", *v);
  return to_json_object(v->get_object());
}

std::optional<std::string> JsonObject::get_json(std::string_view key) const {
  const json::value* v = json_of(*this).if_contains(key);
  if (!v) return std::nullopt;
  return json::serialize(tag_non_finite(*v));
}

bool operator==(const JsonObject& a, const JsonObject& b) noexcept { return json_of(a) == json_of(b); }

}  // namespace ckpt
