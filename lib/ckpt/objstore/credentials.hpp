// SPDX-License-Identifier: Apache-2.0
// AWS credentials as the S3 client holds them. Where they come from (S3Options, the
// environment, the shared files, a credential_process, the container endpoint) and when they
// are refreshed is written in s3.hpp and docs/object-store.md ("Credentials").
//
// The secret key and the session token are secrets: ckpt never writes them to a log, an
// error message or any output of its programs; only the access key id may be named.
#pragma once

#include "ckpt/core/export.hpp"

#include <chrono>
#include <optional>
#include <string>

CKPT_API_BEGIN
namespace ckpt {

/// One set of AWS credentials.
struct AwsCredentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  ///< empty: none (long-term keys); else sent as x-amz-security-token, signed
  /// When they stop working; none: they do not expire. The client fetches new ones a margin
  /// before (S3Options::credentials_refresh_margin) and never signs with expired ones.
  std::optional<std::chrono::system_clock::time_point> expiration;
};

}  // namespace ckpt
CKPT_API_END
