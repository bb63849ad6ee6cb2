// SPDX-License-Identifier: Apache-2.0
// The S3 client's credential chain (the order in s3.hpp, docs/object-store.md): which source
// gives the credentials, the sources themselves (fixed keys, a credential_process, the
// container endpoint, the user's function), and the cache that fetches them again before
// they expire.
//
// Secrets: no error thrown here quotes a secret key, a session token, an authorization token,
// a line of a credentials file or the output of a process or endpoint (any of which may hold
// one); they name the file, line, command or URI and describe what was wrong.
#pragma once

#include "ckpt/core/export.hpp"

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "ckpt/objstore/credentials.hpp"
#include "ckpt/objstore/s3.hpp"

CKPT_API_BEGIN
namespace ckpt::detail {

/// A lookup of environment variables: the process's (process_environment()) or a test's.
/// Empty values count as unset.
using Environment = std::function<std::optional<std::string>(const std::string& name)>;
Environment process_environment();

/// One setting of a profile and where it was read (for messages).
struct ProfileSetting {
  std::string value;
  std::string file;
  int line = 0;
};
using Profile = std::map<std::string, ProfileSetting>;

/// The profiles of an AWS shared file's text, by profile name. `config`: a config file, whose
/// sections are `[profile NAME]` and `[default]` (others, such as `[sso-session x]`, are not
/// profiles and are left out); else a credentials file, whose sections are `[NAME]`. Keys are
/// lower-cased; indented lines under a key without a value (`s3 =`) are its sub-settings
/// and are skipped. Throws
/// Errc::invalid_argument naming `file` and the line for a line that is none of a section, a
/// `key = value`, a comment or blank, and for a setting before any section (never quoting
/// the line, which may hold a secret).
std::map<std::string, Profile> parse_profile_file(std::string_view text, const std::string& file, bool config);

/// An RFC 3339 time ("2026-12-07T01:02:03Z", fractions and +hh:mm offsets too). Throws
/// Errc::io_error naming `source` for anything else.
std::chrono::system_clock::time_point parse_expiration(std::string_view text, const std::string& source);

/// Credentials from the JSON a credential_process prints (`process`: Version 1,
/// AccessKeyId, SecretAccessKey, SessionToken, Expiration) or a container endpoint answers
/// (AccessKeyId, SecretAccessKey, Token, Expiration). Throws Errc::io_error naming `source`
/// for text that is not such JSON, quoting none of it.
AwsCredentials parse_credentials_json(std::string_view text, const std::string& source, bool process);

/// Where credentials come from. fetch() asks anew (runs the process, calls the endpoint).
class CredentialSource {
 public:
  virtual ~CredentialSource() = default;
  virtual AwsCredentials fetch() = 0;
  /// Names the source for messages ("profile dev of /root/.aws/credentials"); no secret.
  virtual std::string describe() const = 0;
};

/// The first configured source of the chain for `options` (its credentials, access_key,
/// profile), reading the environment through `env` and the shared files from disk. Throws
/// Errc::invalid_argument for no source at all (naming every place looked at) and for a
/// configured one that is broken.
std::unique_ptr<CredentialSource> resolve_credential_source(const S3Options& options, const Environment& env);

/// The credentials of a source, fetched on the first current() and again when they are
/// within `margin` of their expiration. Thread-safe: one thread fetches, the others wait for
/// it. Fetched credentials that have already expired (by `now`) are an Errc::io_error
/// naming the source and the Expiration; so is a failed fetch, which the next call retries.
class CredentialCache {
 public:
  using Clock = std::function<std::chrono::system_clock::time_point()>;
  CredentialCache(std::unique_ptr<CredentialSource> source, std::chrono::seconds margin, Clock now = {});
  AwsCredentials current();
  std::string describe() const { return source_->describe(); }

 private:
  std::unique_ptr<CredentialSource> source_;
  std::chrono::seconds margin_;
  Clock now_;
  std::mutex mu_;
  std::optional<AwsCredentials> cached_;
};

}  // namespace ckpt::detail
CKPT_API_END
