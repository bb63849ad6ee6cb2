// SPDX-License-Identifier: Apache-2.0
// The S3 client's bounded XML reader and response parsers, on hostile and malformed input no
// real server would send (no server needed), and the root and key checks.
#include <doctest/doctest.h>

#include "ckpt/core/error.hpp"
#include "ckpt/objstore/detail/s3_xml.hpp"
#include "ckpt/objstore/s3.hpp"
#include "support/test_support.hpp"

using namespace ckpt;
using namespace ckpt::detail;

namespace {

std::string listing(const std::vector<std::string>& keys, bool truncated = false, const std::string& token = {}) {
  std::string x = R"(<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">)";
  x += "<Name>b</Name><IsTruncated>" + std::string(truncated ? "true" : "false") + "</IsTruncated>";
  if (!token.empty()) x += "<NextContinuationToken>" + token + "</NextContinuationToken>";
  for (const auto& k : keys) x += "<Contents><Key>" + k + "</Key><Size>3</Size><ETag>&quot;abc&quot;</ETag></Contents>";
  return x + "</ListBucketResult>";
}

}  // namespace

TEST_CASE("a listing is parsed into keys relative to the root, sizes, unquoted ETags and the continuation token") {
  const ObjectPage p = parse_list_objects(listing({"root/step-1/a", "root/step-1/b&amp;c"}, true, "tok+/="), "root/", "step-1/", 10, "s3://b/root");
  REQUIRE(p.objects.size() == 2);
  CHECK(p.objects[0].key == "step-1/a");
  CHECK(p.objects[1].key == "step-1/b&c");
  CHECK(p.objects[0].size == 3);
  CHECK(p.objects[0].etag == "abc");
  CHECK(p.next_token == "tok+/=");
}

TEST_CASE("a listing with a '..' key is refused as unsafe naming the key") {
  const Error e = test::error_of([&] { parse_list_objects(listing({"root/step-1/../../etc/passwd"}), "root/", "", 10, "s3://b/root"); });
  CHECK(e.code() == Errc::unsafe_path);
  CHECK(e.file() == "s3://b/root");
  CHECK(e.actual() == "\"step-1/../../etc/passwd\"");
}

TEST_CASE("a listing with a key outside the requested prefix is refused as unsafe") {
  const Error e = test::error_of([&] { parse_list_objects(listing({"elsewhere/x"}), "root/", "step-1/", 10, "s3://b/root"); });
  CHECK(e.code() == Errc::unsafe_path);
  CHECK(e.expected() == "a key under \"root/step-1/\"");
}

TEST_CASE("a listing with more entries than asked for is refused") {
  std::vector<std::string> keys;
  for (int i = 0; i < 6; ++i) keys.push_back("k" + std::to_string(i));
  const Error e = test::error_of([&] { parse_list_objects(listing(keys), "", "", 5, "s3://b"); });
  CHECK(e.code() == Errc::io_error);
  CHECK(e.expected() == "at most 5");
}

TEST_CASE("a truncated listing without a continuation token is refused instead of ending the listing early") {
  const Error e = test::error_of([&] { parse_list_objects(listing({"k"}, true), "", "", 5, "s3://b"); });
  CHECK(e.code() == Errc::io_error);
  CHECK(e.detail().find("NextContinuationToken") != std::string::npos);
}

TEST_CASE("hostile XML is refused: a DTD, deep nesting, too many elements, mismatched tags, unknown entities") {
  const std::string dtd = R"(<?xml version="1.0"?><!DOCTYPE lol [<!ENTITY a "aaaa">]><ListBucketResult>&a;</ListBucketResult>)";
  CHECK(test::error_of([&] { parse_xml(dtd, "f", "t"); }).detail().find("DTD") != std::string::npos);
  std::string deep;
  for (int i = 0; i < 100; ++i) deep += "<a>";
  CHECK(test::error_of([&] { parse_xml(deep, "f", "t"); }).detail().find("nested deeper") != std::string::npos);
  std::string many = "<r>";
  for (std::size_t i = 0; i <= kMaxXmlElements; ++i) many += "<e/>";
  many += "</r>";
  CHECK(test::error_of([&] { parse_xml(many, "f", "t"); }).detail().find("more than") != std::string::npos);
  CHECK(test::error_of([&] { parse_xml("<a><b></a></b>", "f", "t"); }).code() == Errc::io_error);
  CHECK(test::error_of([&] { parse_xml("<a>&bogus;</a>", "f", "t"); }).code() == Errc::io_error);
  CHECK(test::error_of([&] { parse_xml("<a>", "f", "t"); }).code() == Errc::io_error);
  CHECK(test::error_of([&] { parse_xml("", "f", "t"); }).code() == Errc::io_error);
  CHECK(test::error_of([&] { parse_xml(std::string(kMaxXmlBytes + 1, ' '), "f", "t"); }).detail().find("exceeds") != std::string::npos);
}

TEST_CASE("XML entities, character references, CDATA, attributes and namespace prefixes are read") {
  const XmlElement r = parse_xml(R"(<?xml version="1.0"?><!-- c --><s3:R xmlns:s3="u" a="x>y"><K>&lt;&#65;&#x42;&gt;</K><C><![CDATA[<raw>]]></C><E/></s3:R>)", "f", "t");
  CHECK(r.name == "R");
  CHECK(r.child_text("K") == "<AB>");
  CHECK(r.child_text("C") == "<raw>");
  CHECK(r.child("E") != nullptr);
  CHECK(r.child("missing") == nullptr);
}

// Answers a differential fuzz run of the former hand-written reader against expat found it
// accepting, although no XML reader does: each is refused, naming the file and the response.
TEST_CASE("malformed XML is refused as any XML reader refuses it: unbound prefix, attribute without value, NUL byte, broken declaration") {
  for (const std::string& bad : {std::string("<s3:R><K>k</K></s3:R>"), std::string("<R a><K>k</K></R>"), std::string("<R><K>k\0</K></R>", 17),
                                std::string(R"(<?xml version6"1.0"?><R/>)"), std::string("<R>]]></R>"), std::string("<R>\xff</R>"),
                                std::string("<R>&#xD800;</R>"), std::string("<R><!-- a -- b --></R>")}) {
    CAPTURE(bad);
    const Error e = test::error_of([&] { parse_xml(bad, "s3://b/root", "ListObjectsV2 response"); });
    CHECK(e.code() == Errc::io_error);
    CHECK(e.file() == "s3://b/root");
    CHECK(e.detail().starts_with("malformed XML in ListObjectsV2 response: "));
  }
}

TEST_CASE("CR LF and a lone CR in an answer's text are read as LF, as XML requires") {
  const XmlElement r = parse_xml("<R><K>a\r\nb\rc</K></R>", "f", "t");
  CHECK(r.child_text("K") == "a\nb\nc");
}

TEST_CASE("an empty element tag one level past the depth bound is refused, and the bound itself is read") {
  std::string deep;
  for (std::size_t i = 0; i < kMaxXmlDepth; ++i) deep += "<a>";
  deep += "<b/>";
  for (std::size_t i = 0; i < kMaxXmlDepth; ++i) deep += "</a>";
  CHECK(test::error_of([&] { parse_xml(deep, "f", "t"); }).detail() == "malformed XML in t: nested deeper than 16");
  deep.erase(0, 3);
  deep.erase(deep.size() - 4);
  CHECK(parse_xml(deep, "f", "t").name == "a");
}

// fuzz_s3_xml: corpus/s3_xml/finding_last_modified_cut_inside_a_character. A field cut to its
// bound inside a multi-byte character was no longer UTF-8: the page could not be written back
// as XML, nor an error quoting it cross the coordination wire.
TEST_CASE("fields cut to their bound in a listing or an error body are cut where a character begins and stay UTF-8") {
  const std::string long_time = "2026-12-03T19:15:37.866Z" + std::string(39, 'x') + "\u00e9";  // the 2-byte character at 63..64
  const ObjectPage p = parse_list_objects("<ListBucketResult><Contents><Key>fz/a</Key><Size>1</Size><LastModified>" + long_time +
                                              "</LastModified></Contents></ListBucketResult>",
                                          "fz/", "", 8, "s3://b/fz");
  REQUIRE(p.objects.size() == 1);
  CHECK(p.objects[0].last_modified == long_time.substr(0, 63));
  const S3ErrorBody e = parse_error_body("<Error><Code>" + std::string(127, 'C') + "\u00e9</Code><Message>m</Message></Error>");
  CHECK(e.code == std::string(127, 'C'));
  CHECK(e.message == "m");
}

TEST_CASE("an S3 error body gives its code and message, and anything else gives nothing") {
  const S3ErrorBody e = parse_error_body("<Error><Code>SlowDown</Code><Message>Please reduce</Message></Error>");
  CHECK(e.code == "SlowDown");
  CHECK(e.message == "Please reduce");
  CHECK(parse_error_body("not xml").code.empty());
  CHECK(parse_error_body("").code.empty());
}

TEST_CASE("an s3 root is parsed into bucket and prefix, and a bad one is an invalid argument naming it") {
  CHECK(parse_s3_root("s3://my-bucket").prefix.empty());
  const S3Root r = parse_s3_root("s3://my-bucket/runs/a/");
  CHECK(r.bucket == "my-bucket");
  CHECK(r.prefix == "runs/a");
  for (const char* bad : {"/local/dir", "s3://", "s3://ab", "s3://Upper/x", "s3://bucket/a/../b"}) {
    const Error e = test::error_of([&] { parse_s3_root(bad); });
    CHECK(e.code() == Errc::invalid_argument);
    CHECK(e.file() == bad);
  }
  CHECK(is_s3_root("s3://b/p"));
  CHECK(!is_s3_root("/tmp/s3://"));
}

TEST_CASE("is_transient accepts 5xx, 429 and no-response failures and nothing else") {
  CHECK(is_transient(Error(Errc::io_error, "k", "PUT", "HTTP 2xx", "HTTP 503 SlowDown")));
  CHECK(is_transient(Error(Errc::io_error, "k", "PUT", "HTTP 2xx", "HTTP 500 InternalError")));
  CHECK(is_transient(Error(Errc::io_error, "k", "PUT", "HTTP 2xx", "HTTP 429")));
  CHECK(is_transient(Error(Errc::io_error, "k", "PUT", "a response", "no response", 104)));
  CHECK(!is_transient(Error(Errc::io_error, "k", "PUT", "HTTP 2xx", "HTTP 400 BadDigest")));
  CHECK(!is_transient(Error(Errc::conflict, "k", "PUT", "no object under the key", "HTTP 412 PreconditionFailed")));
  CHECK(!is_transient(Error(Errc::not_found, "k", "HEAD", "HTTP 2xx", "HTTP 404")));
}

TEST_CASE("a client without credentials is refused naming the variables to set") {
  S3Options o;
  o.root = "s3://bucket/p";
  o.endpoint = "http://127.0.0.1:1";
  o.access_key = "";
  ::unsetenv("AWS_ACCESS_KEY_ID");
  ::unsetenv("AWS_SECRET_ACCESS_KEY");
  const Error e = test::error_of([&] { make_s3_object_store(o); });
  CHECK(e.code() == Errc::invalid_argument);
  CHECK(e.detail().find("AWS_ACCESS_KEY_ID") != std::string::npos);
}
