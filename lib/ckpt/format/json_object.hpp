// SPDX-License-Identifier: Apache-2.0
// ckpt::JsonObject: the free-form metadata a checkpoint carries (a rank's data position and
// RNG state, the run's LR schedule and configuration), as a small value type. It holds a JSON
// object; a program sets and reads its members by key, or hands it JSON text (parse) and
// takes JSON text back (dump), and so uses whichever JSON library it likes. Which JSON
// library ckpt itself uses stays inside the library: no ckpt header includes one.
#pragma once

#include "ckpt/core/export.hpp"

#include <concepts>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

CKPT_API_BEGIN
namespace ckpt {

/// A JSON object (an unordered set of unique keys, in insertion order, each with a JSON
/// value). A value type: copies are deep and independent; a default-constructed one is `{}`
/// and allocates nothing. Not thread-safe for writes (as a std::string).
///
/// Doubles may be non-finite: dump() writes each NaN or infinity as the object
/// {"__float__": S} the manifest uses (format/manifest.hpp, tag_non_finite; docs/format.md)
/// and parse() reads each such object back as the double, bit for bit.
class JsonObject {
 public:
  JsonObject() noexcept;
  JsonObject(const JsonObject& other);
  JsonObject(JsonObject&& other) noexcept;
  JsonObject& operator=(const JsonObject& other);
  JsonObject& operator=(JsonObject&& other) noexcept;
  ~JsonObject();

  /// The object `text` spells (RFC 8259 JSON, whose top level is an object). Throws
  /// Errc::invalid_argument naming "JSON text", with the parser's message, for invalid JSON,
  /// and with the kind found ("array", "integer 3", ...) for a value that is not an object.
  static JsonObject parse(std::string_view text);
  /// Compact JSON text of the object (non-finite doubles tagged, above); parse(dump()) == *this.
  std::string dump() const;

  bool empty() const noexcept;
  std::size_t size() const noexcept;
  bool contains(std::string_view key) const noexcept;
  /// The keys, in order.
  std::vector<std::string> keys() const;
  /// Removes `key`; false if it was absent.
  bool erase(std::string_view key);

  /// Sets `key` to a value (replacing any value it had); returns *this, so that calls chain:
  /// `JsonObject().set("kind", "cosine").set("base_lr", 3e-4)`.
  JsonObject& set(std::string_view key, bool value);
  JsonObject& set(std::string_view key, double value);
  JsonObject& set(std::string_view key, std::string_view value);
  JsonObject& set(std::string_view key, const char* value) { return set(key, std::string_view(value)); }
  JsonObject& set(std::string_view key, const std::string& value) { return set(key, std::string_view(value)); }
  JsonObject& set(std::string_view key, const JsonObject& value);
  /// Any integer type: stored as a signed 64-bit integer if it is signed, else unsigned.
  template <std::integral T>
    requires(!std::same_as<T, bool> && !std::same_as<T, char>)
  JsonObject& set(std::string_view key, T value) {
    if constexpr (std::is_signed_v<T>) return set_int(key, static_cast<std::int64_t>(value));
    else return set_uint(key, static_cast<std::uint64_t>(value));
  }
  /// Any float type, as a double.
  JsonObject& set(std::string_view key, float value) { return set(key, static_cast<double>(value)); }
  /// Sets `key` to the JSON value `json_text` spells (any kind: an array, a nested object, a
  /// number, null). Errc::invalid_argument naming the key for invalid JSON.
  JsonObject& set_json(std::string_view key, std::string_view json_text);
  JsonObject& set_int(std::string_view key, std::int64_t value);
  JsonObject& set_uint(std::string_view key, std::uint64_t value);

  /// The value of `key`, nullopt if the key is absent. A value of another kind throws
  /// Errc::invalid_argument naming the key, the kind expected and the value found.
  /// get_int: an integer that fits in int64. get_uint: a non-negative integer.
  /// get_double: any number (integers converted).
  std::optional<bool> get_bool(std::string_view key) const;
  std::optional<std::int64_t> get_int(std::string_view key) const;
  std::optional<std::uint64_t> get_uint(std::string_view key) const;
  std::optional<double> get_double(std::string_view key) const;
  std::optional<std::string> get_string(std::string_view key) const;
  std::optional<JsonObject> get_object(std::string_view key) const;
  /// The value of `key` as compact JSON text, whatever its kind; nullopt if absent.
  std::optional<std::string> get_json(std::string_view key) const;

  /// Same keys with equal values (JSON equality: order of keys does not matter).
  friend bool operator==(const JsonObject& a, const JsonObject& b) noexcept;

  struct Impl;  ///< defined inside the library

 private:
  friend struct JsonObjectAccess;
  std::unique_ptr<Impl> impl_;  // null: {}
};

}  // namespace ckpt
CKPT_API_END
