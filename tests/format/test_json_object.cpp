// SPDX-License-Identifier: Apache-2.0
// ckpt::JsonObject, the free-form metadata's value type: what a program sets it reads back,
// kinds are checked with errors naming the key, copies are independent, and its JSON text
// round-trips bit for bit through the manifest's tags for non-finite doubles.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "ckpt/core/error.hpp"
#include "ckpt/format/boost_json.hpp"
#include "ckpt/format/json_object.hpp"
#include "ckpt/format/manifest.hpp"
#include "support/test_support.hpp"

using namespace ckpt;

TEST_CASE("a JsonObject reads back what was set, of every kind, and chains") {
  JsonObject o;
  CHECK(o.empty());
  CHECK(o.dump() == "{}");
  o.set("i", -7).set("u", std::uint64_t{1} << 63).set("d", 0.25).set("f", 1.5f).set("b", true).set("s", "text");
  o.set("nested", JsonObject().set("kind", "cosine").set("base_lr", 3e-4));
  o.set_json("list", "[1, 2, 3]");
  CHECK(o.size() == 8);
  CHECK(o.get_int("i") == -7);
  CHECK(o.get_uint("u") == (std::uint64_t{1} << 63));
  CHECK(o.get_double("d") == 0.25);
  CHECK(o.get_double("f") == 1.5);
  CHECK(o.get_double("i") == -7.0);  // any number reads as a double
  CHECK(o.get_bool("b") == true);
  CHECK(o.get_string("s") == "text");
  const auto nested = o.get_object("nested");
  REQUIRE(nested);
  CHECK(nested->get_string("kind") == "cosine");
  CHECK(nested->get_double("base_lr") == 3e-4);
  CHECK(o.get_json("list") == "[1,2,3]");
  CHECK(o.keys() == std::vector<std::string>{"i", "u", "d", "f", "b", "s", "nested", "list"});
  CHECK_FALSE(o.get_int("absent"));
  CHECK_FALSE(o.get_json("absent"));
  CHECK(o.contains("s"));
  CHECK(o.erase("s"));
  CHECK_FALSE(o.erase("s"));
  CHECK_FALSE(o.contains("s"));
  o.set("i", "replaced");
  CHECK(o.get_string("i") == "replaced");
  o.set("self", o);  // a copy of itself as it was
  CHECK(o.get_object("self")->get_string("i") == "replaced");
  CHECK_FALSE(o.get_object("self")->contains("self"));
}

TEST_CASE("a JsonObject refuses a value of another kind, naming the key, the kind expected and the value found") {
  const JsonObject o = JsonObject().set("n", -1).set("s", "x").set("big", std::uint64_t{1} << 63);
  Error e = test::expect_error([&] { (void)o.get_string("n"); });
  CHECK(e.code() == Errc::invalid_argument);
  CHECK(e.detail() == "JSON member 'n'");
  CHECK(e.expected() == "a string");
  CHECK(e.actual() == "integer -1");
  e = test::expect_error([&] { (void)o.get_uint("n"); });
  CHECK(e.expected() == "a non-negative integer");
  CHECK(e.actual() == "integer -1");
  e = test::expect_error([&] { (void)o.get_int("big"); });
  CHECK(e.expected() == "an integer from -2^63 to 2^63-1");
  CHECK(e.actual() == "integer 9223372036854775808");
  CHECK(test::expect_error([&] { (void)o.get_double("s"); }).actual() == "string");
  CHECK(test::expect_error([&] { (void)o.get_object("s"); }).expected() == "an object");
  CHECK(test::expect_error([&] { (void)o.get_bool("s"); }).expected() == "a boolean");
}

TEST_CASE("JsonObject::parse takes an object and refuses anything else with the parser's reason or the kind found") {
  const JsonObject o = JsonObject::parse(R"({"a": {"b": [1, "two", null]}, "c": 1e3})");
  CHECK(o.get_json("a") == R"({"b":[1,"two",null]})");
  CHECK(o.get_double("c") == 1000.0);
  Error e = test::expect_error([] { (void)JsonObject::parse("[1, 2]"); });
  CHECK(e.code() == Errc::invalid_argument);
  CHECK(e.detail() == "JSON text");
  CHECK(e.expected() == "an object");
  CHECK(e.actual() == "array");
  e = test::expect_error([] { (void)JsonObject::parse(R"({"a": )"); });
  CHECK(e.code() == Errc::invalid_argument);
  CHECK(e.detail().starts_with("JSON text is not valid JSON: "));
  e = test::expect_error([] { (void)JsonObject().set_json("k", "{oops}"); });
  CHECK(e.detail().starts_with("the value of JSON member 'k' is not valid JSON: "));
}

TEST_CASE("JsonObject copies are deep, equality is JSON equality, and a default one is empty") {
  JsonObject a = JsonObject().set("x", 1).set("y", JsonObject().set("z", 2));
  JsonObject b = a;
  CHECK(a == b);
  b.set("x", 2);
  CHECK(a.get_int("x") == 1);
  CHECK(a != b);
  const JsonObject reordered = JsonObject().set("y", JsonObject().set("z", 2)).set("x", 1);
  CHECK(a == reordered);
  JsonObject moved = std::move(b);
  CHECK(moved.get_int("x") == 2);
  CHECK(JsonObject() == JsonObject::parse("{}"));
  a = JsonObject();
  CHECK(a.empty());
}

TEST_CASE("non-finite doubles round-trip through dump and parse bit for bit, spelled as the manifest tags them") {
  const double payload_nan = std::bit_cast<double>(0xfff8000000000123ull);
  JsonObject o;
  o.set("nan", std::numeric_limits<double>::quiet_NaN()).set("inf", std::numeric_limits<double>::infinity()).set("payload", payload_nan);
  const std::string text = o.dump();
  CHECK(text == R"({"nan":{"__float__":"nan"},"inf":{"__float__":"inf"},"payload":{"__float__":"nan:0xfff8000000000123"}})");
  const JsonObject back = JsonObject::parse(text);
  CHECK(std::bit_cast<std::uint64_t>(*back.get_double("nan")) == 0x7ff8000000000000ull);
  CHECK(*back.get_double("inf") == std::numeric_limits<double>::infinity());
  CHECK(std::bit_cast<std::uint64_t>(*back.get_double("payload")) == 0xfff8000000000123ull);
  CHECK(back.get_json("payload") == R"({"__float__":"nan:0xfff8000000000123"})");
}

TEST_CASE("the metadata a manifest carries is the JsonObject that was set, through encode and decode") {
  Manifest m;
  m.world_size = 1;
  m.step = 3;
  ShardRecord s;
  s.path = "shard-00000-of-00001.safetensors";
  s.sha256 = std::string(64, '0');
  s.metadata.set("data_position", 17).set("rng", JsonObject::parse(R"({"s": [1, 2, 3, 4]})"));
  m.shards.push_back(s);
  m.training.set_json("lr_schedule", R"({"kind": "cosine", "base_lr": 0.0003})");
  const Manifest d = decode_manifest(encode_manifest(m), "manifest.json");
  CHECK(d.shards[0].metadata == s.metadata);
  CHECK(d.shards[0].metadata.get_int("data_position") == 17);
  CHECK(d.training.get_object("lr_schedule")->get_double("base_lr") == 0.0003);
  CHECK(json_of(d.training) == json_of(m.training));  // the same object inside the library
}
