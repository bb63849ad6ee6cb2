// SPDX-License-Identifier: Apache-2.0
// The S3 client's answers (objstore/detail/s3_xml.hpp) on arbitrary bytes: what a hostile server or a
// man in the middle can send. Every input goes through parse_xml and the parsers of the
// answers the client reads (ListObjectsV2, ListMultipartUploads, InitiateMultipartUpload, an
// error body). A refusal must be a ckpt::Error naming the store and what was parsed
// (io_error, or unsafe_path for a key); nothing else may escape, and libFuzzer's -timeout and
// -rss_limit_mb catch a hang or an allocation without bound.
//
// What is accepted must read back: the tree parse_xml built, written out as XML, parses to the
// same tree (names, text, children), and a page, upload list or upload id, written as the
// answer S3 would send for it, parses to the same page, list or id. The seeds are real RGW
// answers (tools/capture_s3_answers.py) and answers the tests write.
#include <cstdint>
#include <string>
#include <string_view>

#include "ckpt/objstore/detail/s3_xml.hpp"
#include "fuzz_common.hpp"

using namespace ckpt;
using namespace ckpt::detail;
using fuzz::require;

namespace {
constexpr const char* kFile = "s3://fz-bucket/fz";
constexpr std::string_view kRootPrefix = "fz/";
constexpr std::size_t kMaxKeys = 8;

// Character data as XML writes it: the markup characters as entities, and CR as a character
// reference (a literal CR would be read as LF).
std::string escaped(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '\r': out += "&#13;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string element(std::string_view name, std::string_view text) {
  return "<" + std::string(name) + ">" + escaped(text) + "</" + std::string(name) + ">";
}

std::string to_xml(const XmlElement& e) {
  std::string out = "<" + e.name + ">" + escaped(e.text);
  for (const auto& c : e.children) out += to_xml(c);
  return out + "</" + e.name + ">";
}

bool same_tree(const XmlElement& a, const XmlElement& b) {
  if (a.name != b.name || a.text != b.text || a.children.size() != b.children.size()) return false;
  for (std::size_t i = 0; i < a.children.size(); ++i)
    if (!same_tree(a.children[i], b.children[i])) return false;
  return true;
}

std::size_t depth(const XmlElement& e) {
  std::size_t d = 0;
  for (const auto& c : e.children) d = std::max(d, depth(c));
  return d + 1;
}

void check_refusal(const Error& e, std::string_view what) {
  fuzz::check_refusal(e, {Errc::io_error, Errc::unsafe_path}, kFile);
  require(e.file() == kFile, std::string("error names another file: ") + e.what());
  if (e.detail().starts_with("malformed XML"))
    require(e.detail().starts_with("malformed XML in " + std::string(what)), std::string("error does not name the answer: ") + e.what());
}

void check_key(const std::string& key, std::string_view prefix) {
  require(key.starts_with(prefix), "a key outside the requested prefix: " + key);
  try {
    check_object_key(key, kFile);
  } catch (const Error& e) {
    fuzz::finding(std::string("an unsafe key was accepted: ") + e.what());
  }
}

void list_objects(std::string_view xml, std::string_view prefix) {
  ObjectPage page;
  try {
    page = parse_list_objects(xml, kRootPrefix, prefix, kMaxKeys, kFile);
  } catch (const Error& e) {
    return check_refusal(e, "ListObjectsV2 response");
  }
  require(page.objects.size() <= kMaxKeys, "more entries than asked for");
  std::string again = "<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">";
  again += element("IsTruncated", page.next_token.empty() ? "false" : "true");
  for (const auto& o : page.objects) {
    check_key(o.key, prefix);
    require(o.last_modified.size() <= 64, "LastModified unbounded");
    again += "<Contents>" + element("Key", std::string(kRootPrefix) + o.key) + element("Size", std::to_string(o.size)) +
             element("ETag", "\"" + o.etag + "\"") + element("LastModified", o.last_modified) + "</Contents>";
  }
  if (!page.next_token.empty()) again += element("NextContinuationToken", page.next_token);
  again += "</ListBucketResult>";
  try {
    const ObjectPage back = parse_list_objects(again, kRootPrefix, prefix, kMaxKeys, kFile);
    require(back.next_token == page.next_token && back.objects.size() == page.objects.size(), "page round trip: token or count");
    for (std::size_t i = 0; i < back.objects.size(); ++i) {
      const auto &a = page.objects[i], &b = back.objects[i];
      require(a.key == b.key && a.size == b.size && a.etag == b.etag && a.last_modified == b.last_modified, "page round trip: " + a.key);
    }
  } catch (const Error& e) {
    fuzz::finding(std::string("an accepted page does not read back: ") + e.what());
  }
}

void list_uploads(std::string_view xml, std::string_view prefix) {
  std::vector<MultipartUpload> uploads;
  try {
    uploads = parse_list_uploads(xml, kRootPrefix, prefix, kMaxKeys, kFile);
  } catch (const Error& e) {
    return check_refusal(e, "ListMultipartUploads response");
  }
  require(uploads.size() <= kMaxKeys, "more uploads than asked for");
  std::string again = "<ListMultipartUploadsResult>";
  for (const auto& u : uploads) {
    check_key(u.key, prefix);
    require(!u.upload_id.empty() && u.initiated.size() <= 64, "upload id empty or Initiated unbounded");
    again += "<Upload>" + element("Key", std::string(kRootPrefix) + u.key) + element("UploadId", u.upload_id) +
             element("Initiated", u.initiated) + "</Upload>";
  }
  again += "</ListMultipartUploadsResult>";
  try {
    const auto back = parse_list_uploads(again, kRootPrefix, prefix, kMaxKeys, kFile);
    require(back.size() == uploads.size(), "upload list round trip: count");
    for (std::size_t i = 0; i < back.size(); ++i)
      require(back[i].key == uploads[i].key && back[i].upload_id == uploads[i].upload_id && back[i].initiated == uploads[i].initiated,
              "upload list round trip: " + uploads[i].key);
  } catch (const Error& e) {
    fuzz::finding(std::string("an accepted upload list does not read back: ") + e.what());
  }
}

void upload_id(std::string_view xml) {
  std::string id;
  try {
    id = parse_upload_id(xml, kFile);
  } catch (const Error& e) {
    return check_refusal(e, "InitiateMultipartUpload response");
  }
  require(!id.empty(), "an empty upload id was accepted");
  try {
    require(parse_upload_id("<InitiateMultipartUploadResult>" + element("UploadId", id) + "</InitiateMultipartUploadResult>", kFile) == id,
            "upload id round trip");
  } catch (const Error& e) {
    fuzz::finding(std::string("an accepted upload id does not read back: ") + e.what());
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view xml(reinterpret_cast<const char*>(data), size);
  try {
    const XmlElement root = parse_xml(xml, kFile, "answer");
    require(depth(root) <= kMaxXmlDepth, "nested deeper than the bound");
    const std::string again = to_xml(root);
    try {
      require(same_tree(parse_xml(again, kFile, "answer"), root), "the tree written out reads back differently");
    } catch (const Error& e) {
      fuzz::finding(std::string("an accepted tree does not read back: ") + e.what());
    }
  } catch (const Error& e) {
    check_refusal(e, "answer");
  }
  list_objects(xml, "");
  list_objects(xml, "step-0000000010/");
  list_uploads(xml, "");
  upload_id(xml);
  const S3ErrorBody err = parse_error_body(xml);
  require(err.code.size() <= 128 && err.message.size() <= 512, "error body fields unbounded");
  return 0;
}
