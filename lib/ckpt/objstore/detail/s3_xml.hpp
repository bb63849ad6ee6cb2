// SPDX-License-Identifier: Apache-2.0
// Private: the S3 client's XML reader (expat, building a small tree) and the parsers of the
// four S3 responses it reads (ListObjectsV2, ListMultipartUploads, InitiateMultipartUpload,
// Error), plus the one check of an object key. An answer is read as any conforming XML reader
// reads it (expat decides what is well-formed: characters, names, attributes, entities,
// namespaces, line ends), and bounded so that a hostile or broken server cannot make the
// client allocate without limit: the input size, the nesting depth and the number of elements
// are capped, and no DTD (hence no entity beyond the five predefined ones) is accepted.
#pragma once

#include "ckpt/core/export.hpp"

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/objstore/object_store.hpp"

CKPT_API_BEGIN
namespace ckpt::detail {

/// The bounds of parse_xml().
inline constexpr std::size_t kMaxXmlBytes = 16u << 20;
inline constexpr std::size_t kMaxXmlDepth = 16;
inline constexpr std::size_t kMaxXmlElements = 200000;

struct XmlElement {
  std::string name;  ///< the local name, without its namespace ("s3:Key" is "Key")
  std::string text;  ///< the character data directly inside (CDATA included), entities decoded, line ends LF
  std::vector<XmlElement> children;

  /// The first child named `n`, or nullptr.
  const XmlElement* child(std::string_view n) const noexcept;
  /// The text of the first child named `n`, or "" if there is none.
  std::string child_text(std::string_view n) const;
};

/// Parses `xml` (as UTF-8, whatever it declares) into its root element. Throws
/// Errc::io_error naming `file`, detail "malformed XML in <what>: ..." (expat's reason with
/// its line and column, or the bound) for text that is not well-formed XML 1.0 with
/// namespaces (an unbound prefix included), nests deeper than kMaxXmlDepth, holds more than
/// kMaxXmlElements elements, is larger than kMaxXmlBytes, or declares a DTD.
XmlElement parse_xml(std::string_view xml, std::string_view file, std::string_view what);

/// At most the first `max` bytes of `s`, cut where a UTF-8 character begins.
std::string utf8_prefix(std::string_view s, std::size_t max);

/// Throws Errc::unsafe_path naming `file` and quoting the key unless `key` is a key the
/// object-store interface accepts (object_store.hpp: 1..1024 bytes, no control characters,
/// no empty, "." or ".." segment, no leading '/').
void check_object_key(std::string_view key, std::string_view file);

/// A ListObjectsV2 result of a request for keys under `root_prefix + prefix` with
/// max-keys `max_keys`, its keys made relative to `root_prefix`, LastModified cut to 64 bytes
/// (at a character boundary: every string read from an answer stays UTF-8). Refuses (Errc::unsafe_path)
/// a key outside the requested prefix or unsafe once relative, and (Errc::io_error) a page of
/// more than `max_keys` entries, an entry without a key or with a bad size, and a truncated
/// page without a continuation token.
ObjectPage parse_list_objects(std::string_view xml, std::string_view root_prefix, std::string_view prefix,
                              std::size_t max_keys, std::string_view file);

/// The uploads of a ListMultipartUploads result, keys relative to `root_prefix`, under the
/// same checks as parse_list_objects().
std::vector<MultipartUpload> parse_list_uploads(std::string_view xml, std::string_view root_prefix,
                                                std::string_view prefix, std::size_t max_uploads,
                                                std::string_view file);

/// The UploadId of an InitiateMultipartUpload result (Errc::io_error if it has none).
std::string parse_upload_id(std::string_view xml, std::string_view file);

/// The Code and Message of an S3 error body (cut to 128 and 512 bytes at a character
/// boundary); both empty if `xml` is not one (never throws).
struct S3ErrorBody {
  std::string code, message;
};
S3ErrorBody parse_error_body(std::string_view xml) noexcept;

/// `etag` without surrounding double quotes (S3 sends them; the interface carries none).
std::string unquote_etag(std::string_view etag);

}  // namespace ckpt::detail
CKPT_API_END
