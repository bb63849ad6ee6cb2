// SPDX-License-Identifier: Apache-2.0
// What the core library knows of S3 without a client: the form of an `s3://bucket/prefix`
// root and of a safe object key. The client itself (objstore/s3.cpp, libcurl and expat) is
// the ckpt::s3 component, built with -DCKPT_S3.
#include "ckpt/objstore/s3.hpp"

#include "ckpt/objstore/detail/s3_xml.hpp"

namespace ckpt {

namespace detail {

// At most the first `max` bytes of `s`, cut where a UTF-8 character begins: the text of an
// answer is UTF-8, and a field cut inside a character would no longer be (nor could the error
// or listing that carries it cross the coordination wire or be written back as XML).
std::string utf8_prefix(std::string_view s, std::size_t max) {
  if (s.size() <= max) return std::string(s);
  while (max > 0 && (static_cast<unsigned char>(s[max]) & 0xC0) == 0x80) --max;
  return std::string(s.substr(0, max));
}

void check_object_key(std::string_view key, std::string_view file) {
  auto refuse = [&](const char* why) {
    throw Error(Errc::unsafe_path, std::string(file), std::string("object key ") + why, "a safe relative key",
                "\"" + utf8_prefix(key, 256) + (key.size() > 256 ? "...\"" : "\""));
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

}  // namespace detail

using detail::check_object_key;

bool is_s3_root(std::string_view root) noexcept { return root.starts_with("s3://"); }

S3Root parse_s3_root(std::string_view root) {
  auto bad = [&](const char* why) {
    throw Error(Errc::invalid_argument, std::string(root), std::string("object-store root: ") + why,
                "s3://bucket[/prefix]", std::string(root));
  };
  if (!is_s3_root(root)) bad("not an s3:// URL");
  std::string_view rest = root.substr(5);
  const auto slash = rest.find('/');
  S3Root out;
  out.bucket = std::string(rest.substr(0, slash));
  if (out.bucket.size() < 3 || out.bucket.size() > 63) bad("the bucket name must have 3..63 characters");
  for (char c : out.bucket)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-'))
      bad("the bucket name may hold only a-z, 0-9, '.' and '-'");
  std::string_view prefix = slash == std::string_view::npos ? std::string_view() : rest.substr(slash + 1);
  while (!prefix.empty() && prefix.back() == '/') prefix.remove_suffix(1);
  if (!prefix.empty()) {
    try {
      check_object_key(prefix, root);
    } catch (const Error&) {
      bad("the prefix is not a safe key (no empty, '.' or '..' segment, no control character)");
    }
  }
  out.prefix = std::string(prefix);
  return out;
}

}  // namespace ckpt
