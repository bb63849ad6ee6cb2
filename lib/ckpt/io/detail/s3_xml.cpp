#include "ckpt/io/detail/s3_xml.hpp"

#include <charconv>

namespace ckpt::detail {

namespace {

[[noreturn]] void malformed(std::string_view file, std::string_view what, std::string_view why) {
  throw Error(Errc::io_error, std::string(file), "malformed XML in " + std::string(what) + ": " + std::string(why));
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

// Appends the UTF-8 encoding of `cp` (a character reference) to `out`.
void append_utf8(std::string& out, unsigned long cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Decodes the character data `raw` (the five predefined entities and character references).
void append_text(std::string& out, std::string_view raw, std::string_view file, std::string_view what) {
  for (std::size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] != '&') {
      out += raw[i];
      continue;
    }
    const auto semi = raw.find(';', i);
    if (semi == std::string_view::npos || semi - i > 12) malformed(file, what, "unterminated entity");
    const std::string_view ent = raw.substr(i + 1, semi - i - 1);
    if (ent == "amp") out += '&';
    else if (ent == "lt") out += '<';
    else if (ent == "gt") out += '>';
    else if (ent == "quot") out += '"';
    else if (ent == "apos") out += '\'';
    else if (ent.size() > 1 && ent[0] == '#') {
      const bool hex = ent[1] == 'x' || ent[1] == 'X';
      const std::string_view digits = ent.substr(hex ? 2 : 1);
      unsigned long cp = 0;
      const auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), cp, hex ? 16 : 10);
      if (ec != std::errc() || p != digits.data() + digits.size() || digits.empty() || cp == 0 || cp > 0x10FFFF)
        malformed(file, what, "bad character reference &" + std::string(ent) + ";");
      append_utf8(out, cp);
    } else {
      malformed(file, what, "unknown entity &" + std::string(ent) + ";");
    }
    i = semi;
  }
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
                "a key under \"" + wanted + "\"", full.substr(0, 256));
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
  XmlElement doc;
  std::vector<XmlElement*> open{&doc};
  std::size_t elements = 0;
  bool have_root = false;
  std::size_t i = 0;
  while (i < xml.size()) {
    if (xml[i] != '<') {
      const auto lt = xml.find('<', i);
      const std::string_view raw = xml.substr(i, lt == std::string_view::npos ? std::string_view::npos : lt - i);
      if (open.size() > 1) {
        append_text(open.back()->text, raw, file, what);
      } else {
        for (char c : raw)
          if (!is_space(c)) malformed(file, what, "text outside the root element");
      }
      i = lt == std::string_view::npos ? xml.size() : lt;
      continue;
    }
    const std::string_view rest = xml.substr(i);
    if (rest.starts_with("<?")) {
      const auto end = xml.find("?>", i);
      if (end == std::string_view::npos) malformed(file, what, "unterminated processing instruction");
      i = end + 2;
    } else if (rest.starts_with("<!--")) {
      const auto end = xml.find("-->", i);
      if (end == std::string_view::npos) malformed(file, what, "unterminated comment");
      i = end + 3;
    } else if (rest.starts_with("<![CDATA[")) {
      const auto end = xml.find("]]>", i);
      if (end == std::string_view::npos || open.size() == 1) malformed(file, what, "stray or unterminated CDATA");
      open.back()->text.append(xml.substr(i + 9, end - i - 9));
      i = end + 3;
    } else if (rest.starts_with("<!")) {
      malformed(file, what, "a DTD or declaration (not accepted)");
    } else if (rest.starts_with("</")) {
      const auto gt = xml.find('>', i);
      if (gt == std::string_view::npos) malformed(file, what, "unterminated end tag");
      std::string_view name = xml.substr(i + 2, gt - i - 2);
      while (!name.empty() && is_space(name.back())) name.remove_suffix(1);
      if (const auto colon = name.find(':'); colon != std::string_view::npos) name.remove_prefix(colon + 1);
      if (open.size() == 1 || open.back()->name != name)
        malformed(file, what, "end tag </" + std::string(name.substr(0, 64)) + "> does not match");
      open.pop_back();
      i = gt + 1;
    } else {
      std::size_t j = i + 1;
      while (j < xml.size() && !is_space(xml[j]) && xml[j] != '>' && xml[j] != '/') ++j;
      std::string_view name = xml.substr(i + 1, j - i - 1);
      if (name.empty()) malformed(file, what, "empty tag name");
      if (const auto colon = name.find(':'); colon != std::string_view::npos) name.remove_prefix(colon + 1);
      // Skip the attributes (quoted values may hold '>').
      char quote = 0;
      while (j < xml.size() && (quote || xml[j] != '>')) {
        if (quote) {
          if (xml[j] == quote) quote = 0;
        } else if (xml[j] == '"' || xml[j] == '\'') {
          quote = xml[j];
        }
        ++j;
      }
      if (j >= xml.size()) malformed(file, what, "unterminated start tag");
      const bool self_closing = xml[j - 1] == '/';
      if (open.size() == 1 && have_root) malformed(file, what, "more than one root element");
      if (++elements > kMaxXmlElements) malformed(file, what, "more than " + std::to_string(kMaxXmlElements) + " elements");
      if (open.size() > kMaxXmlDepth) malformed(file, what, "nested deeper than " + std::to_string(kMaxXmlDepth));
      have_root = true;
      // Pointers to the open elements stay valid: only the innermost open element's children grow.
      XmlElement& el = open.back()->children.emplace_back();
      el.name = std::string(name);
      if (!self_closing) open.push_back(&el);
      i = j + 1;
    }
  }
  if (open.size() != 1) malformed(file, what, "unterminated element <" + open.back()->name + ">");
  if (doc.children.empty()) malformed(file, what, "no root element");
  return std::move(doc.children.front());
}

void check_object_key(std::string_view key, std::string_view file) {
  auto refuse = [&](const char* why) {
    throw Error(Errc::unsafe_path, std::string(file), std::string("object key ") + why, "a safe relative key",
                "\"" + std::string(key.substr(0, 256)) + (key.size() > 256 ? "...\"" : "\""));
  };
  if (key.empty()) refuse("is empty");
  if (key.size() > 1024) refuse("is longer than 1024 bytes");
  if (key.front() == '/') refuse("starts with '/'");
  for (unsigned char c : key)
    if (c < 0x20 || c == 0x7F) refuse("holds a control character");
  std::size_t start = 0;
  while (start <= key.size()) {
    const auto slash = key.find('/', start);
    const std::string_view seg = key.substr(start, slash == std::string_view::npos ? std::string_view::npos : slash - start);
    if (seg.empty()) refuse("has an empty segment");
    if (seg == "." || seg == "..") refuse("has a '.' or '..' segment");
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
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
                            c.child_text("LastModified").substr(0, 64)});
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
    out.push_back({relative_key(c.child_text("Key"), root_prefix, prefix, file), id, c.child_text("Initiated").substr(0, 64)});
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
    return {root.child_text("Code").substr(0, 128), root.child_text("Message").substr(0, 512)};
  } catch (...) {
    return {};
  }
}

std::string unquote_etag(std::string_view etag) {
  if (etag.size() >= 2 && etag.front() == '"' && etag.back() == '"') etag = etag.substr(1, etag.size() - 2);
  return std::string(etag);
}

}  // namespace ckpt::detail
