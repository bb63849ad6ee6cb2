// SPDX-License-Identifier: Apache-2.0
#include "ckpt/objstore/detail/s3_xml.hpp"

#include <expat.h>

#include <cerrno>
#include <charconv>
#include <memory>
#include <type_traits>

namespace ckpt::detail {

namespace {

[[noreturn]] void malformed(std::string_view file, std::string_view what, std::string_view why) {
  throw Error(Errc::io_error, std::string(file), "malformed XML in " + std::string(what) + ": " + std::string(why));
}

// parse_xml's tree, built from expat's callbacks. The element being filled is the last of
// `open`; pointers to the open elements stay valid, as only the innermost one's children grow.
struct TreeBuilder {
  XML_Parser parser = nullptr;
  XmlElement doc;
  std::vector<XmlElement*> open{&doc};
  std::size_t elements = 0;
  std::string refused;  // why a handler stopped the parser, if one did

  // Once stopped, expat may still call a handler (the end of an empty element whose start
  // stopped it): every handler does nothing then.
  bool stopped() const noexcept { return !refused.empty(); }
  void stop(std::string why) {
    refused = std::move(why);
    XML_StopParser(parser, XML_FALSE);
  }
};

// Names arrive as "namespace-URI<kNamespaceSeparator>local-name" (or the local name alone, in
// no namespace): a local name cannot hold a space, so the part after the last one is it.
constexpr XML_Char kNamespaceSeparator = ' ';

void on_start(void* user, const XML_Char* name, const XML_Char** /*attributes*/) {
  auto& b = *static_cast<TreeBuilder*>(user);
  if (b.stopped()) return;
  if (++b.elements > kMaxXmlElements) return b.stop("more than " + std::to_string(kMaxXmlElements) + " elements");
  if (b.open.size() > kMaxXmlDepth) return b.stop("nested deeper than " + std::to_string(kMaxXmlDepth));
  std::string_view local(name);
  if (const auto sep = local.rfind(kNamespaceSeparator); sep != std::string_view::npos) local.remove_prefix(sep + 1);
  XmlElement& el = b.open.back()->children.emplace_back();
  el.name = std::string(local);
  b.open.push_back(&el);
}

void on_end(void* user, const XML_Char* /*name*/) {
  auto& b = *static_cast<TreeBuilder*>(user);
  if (!b.stopped()) b.open.pop_back();
}

void on_text(void* user, const XML_Char* text, int len) {
  auto& b = *static_cast<TreeBuilder*>(user);
  if (!b.stopped() && b.open.size() > 1) b.open.back()->text.append(text, static_cast<std::size_t>(len));
}

// A document type declaration is where entities are declared: S3 answers have none, so none
// is accepted, and no entity but the five predefined ones is ever expanded.
void on_doctype(void* user, const XML_Char*, const XML_Char*, const XML_Char*, int) {
  auto& b = *static_cast<TreeBuilder*>(user);
  if (!b.stopped()) b.stop("a DTD (not accepted)");
}

std::uint64_t parse_size(std::string_view text, std::string_view file, std::string_view what) {
  std::uint64_t v = 0;
  const auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || p != text.data() + text.size())
    throw Error(Errc::io_error, std::string(file), std::string(what) + ": bad Size", "a decimal size", std::string(text));
  return v;
}

// The key of a listing entry relative to the root, checked to lie under `root_prefix +
// prefix` and to be safe.
std::string relative_key(const std::string& full, std::string_view root_prefix, std::string_view prefix,
                         std::string_view file) {
  const std::string wanted = std::string(root_prefix) + std::string(prefix);
  if (!full.starts_with(wanted))
    throw Error(Errc::unsafe_path, std::string(file), "listing returned a key outside the requested prefix",
                "a key under \"" + wanted + "\"", utf8_prefix(full, 256));
  std::string rel = full.substr(root_prefix.size());
  check_object_key(rel, file);
  return rel;
}

}  // namespace

const XmlElement* XmlElement::child(std::string_view n) const noexcept {
  for (const auto& c : children)
    if (c.name == n) return &c;
  return nullptr;
}

std::string XmlElement::child_text(std::string_view n) const {
  const XmlElement* c = child(n);
  return c ? c->text : std::string();
}

XmlElement parse_xml(std::string_view xml, std::string_view file, std::string_view what) {
  if (xml.size() > kMaxXmlBytes)
    malformed(file, what, "document of " + std::to_string(xml.size()) + " bytes exceeds " + std::to_string(kMaxXmlBytes));
  TreeBuilder b;
  // UTF-8 whatever the document declares (S3 answers are UTF-8), with namespaces: a prefix
  // must be bound, and a name is matched by its local part.
  const std::unique_ptr<std::remove_pointer_t<XML_Parser>, decltype(&XML_ParserFree)> parser(
      XML_ParserCreateNS("UTF-8", kNamespaceSeparator), &XML_ParserFree);
  if (!parser) throw Error(Errc::io_error, std::string(file), "out of memory (XML_ParserCreateNS) reading " + std::string(what), {}, {}, ENOMEM);
  b.parser = parser.get();
  XML_SetUserData(b.parser, &b);
  XML_SetElementHandler(b.parser, on_start, on_end);
  XML_SetCharacterDataHandler(b.parser, on_text);
  XML_SetStartDoctypeDeclHandler(b.parser, on_doctype);
  if (XML_Parse(b.parser, xml.data(), static_cast<int>(xml.size()), XML_TRUE) != XML_STATUS_OK) {
    if (!b.refused.empty()) malformed(file, what, b.refused);
    const XML_Error code = XML_GetErrorCode(b.parser);
    if (code == XML_ERROR_NO_MEMORY) throw Error(Errc::io_error, std::string(file), "out of memory reading " + std::string(what), {}, {}, ENOMEM);
    malformed(file, what, std::string(XML_ErrorString(code)) + " at line " + std::to_string(XML_GetCurrentLineNumber(b.parser)) +
                              ", column " + std::to_string(XML_GetCurrentColumnNumber(b.parser) + 1));
  }
  if (b.doc.children.empty()) malformed(file, what, "no root element");
  return std::move(b.doc.children.front());
}

ObjectPage parse_list_objects(std::string_view xml, std::string_view root_prefix, std::string_view prefix,
                              std::size_t max_keys, std::string_view file) {
  const XmlElement root = parse_xml(xml, file, "ListObjectsV2 response");
  if (root.name != "ListBucketResult") malformed(file, "ListObjectsV2 response", "root element <" + root.name + ">");
  ObjectPage page;
  for (const auto& c : root.children) {
    if (c.name != "Contents") continue;
    if (page.objects.size() == max_keys)
      throw Error(Errc::io_error, std::string(file), "listing returned more entries than asked for",
                  "at most " + std::to_string(max_keys), "more");
    const XmlElement* key = c.child("Key");
    if (!key) malformed(file, "ListObjectsV2 response", "an entry without a Key");
    page.objects.push_back({relative_key(key->text, root_prefix, prefix, file),
                            parse_size(c.child_text("Size"), file, "listing entry"), unquote_etag(c.child_text("ETag")),
                            utf8_prefix(c.child_text("LastModified"), 64)});
  }
  if (root.child_text("IsTruncated") == "true") {
    page.next_token = root.child_text("NextContinuationToken");
    if (page.next_token.empty())
      malformed(file, "ListObjectsV2 response", "a truncated page without NextContinuationToken");
  }
  return page;
}

std::vector<MultipartUpload> parse_list_uploads(std::string_view xml, std::string_view root_prefix,
                                                std::string_view prefix, std::size_t max_uploads,
                                                std::string_view file) {
  const XmlElement root = parse_xml(xml, file, "ListMultipartUploads response");
  if (root.name != "ListMultipartUploadsResult")
    malformed(file, "ListMultipartUploads response", "root element <" + root.name + ">");
  std::vector<MultipartUpload> out;
  for (const auto& c : root.children) {
    if (c.name != "Upload") continue;
    if (out.size() == max_uploads)
      throw Error(Errc::io_error, std::string(file), "upload listing returned more entries than asked for",
                  "at most " + std::to_string(max_uploads), "more");
    const std::string id = c.child_text("UploadId");
    if (id.empty() || !c.child("Key")) malformed(file, "ListMultipartUploads response", "an upload without Key or UploadId");
    out.push_back({relative_key(c.child_text("Key"), root_prefix, prefix, file), id, utf8_prefix(c.child_text("Initiated"), 64)});
  }
  return out;
}

std::string parse_upload_id(std::string_view xml, std::string_view file) {
  const XmlElement root = parse_xml(xml, file, "InitiateMultipartUpload response");
  std::string id = root.child_text("UploadId");
  if (root.name != "InitiateMultipartUploadResult" || id.empty())
    malformed(file, "InitiateMultipartUpload response", "no UploadId");
  return id;
}

S3ErrorBody parse_error_body(std::string_view xml) noexcept {
  try {
    const XmlElement root = parse_xml(xml, {}, "error");
    if (root.name != "Error") return {};
    return {utf8_prefix(root.child_text("Code"), 128), utf8_prefix(root.child_text("Message"), 512)};
  } catch (...) {
    return {};
  }
}

std::string unquote_etag(std::string_view etag) {
  if (etag.size() >= 2 && etag.front() == '"' && etag.back() == '"') etag = etag.substr(1, etag.size() - 2);
  return std::string(etag);
}

}  // namespace ckpt::detail
