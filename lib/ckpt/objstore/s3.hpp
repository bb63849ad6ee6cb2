// SPDX-License-Identifier: Apache-2.0
// The S3 implementation of ObjectStore, over libcurl (kept out of this header) with AWS
// Signature V4 (CURLOPT_AWS_SIGV4), path-style URLs (`ENDPOINT/bucket/key`), for AWS S3 and
// compatible servers (tested against a Ceph RADOS Gateway, docs/object-store.md).
//
// Configuration, the way S3 users expect it: a root `s3://bucket/prefix` and the endpoint
// and region from AWS_ENDPOINT_URL and AWS_REGION, each overridable by the options below.
//
// Credentials, found in the order the AWS SDKs look (the first that is configured wins, and
// a source that is configured but broken is an error, never skipped):
//   1. S3Options::credentials (your own source), else S3Options::access_key/secret_key
//      (with session_token);
//   2. the environment: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN (not
//      read when S3Options::profile names a profile: one named in code is meant);
//   3. the profile (S3Options::profile, else AWS_PROFILE, else "default") of the shared
//      credentials file (AWS_SHARED_CREDENTIALS_FILE, else ~/.aws/credentials; `[NAME]`) and
//      config file (AWS_CONFIG_FILE, else ~/.aws/config; `[profile NAME]`, `[default]`):
//      the credentials file's keys, else the profile's credential_process, else the config
//      file's keys;
//   4. the container endpoint: AWS_CONTAINER_CREDENTIALS_FULL_URI (https, or http to a
//      loopback or the ECS/EKS agent's address) or AWS_CONTAINER_CREDENTIALS_RELATIVE_URI,
//      with AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE or AWS_CONTAINER_AUTHORIZATION_TOKEN as
//      its Authorization header.
// Credentials with an Expiration (a process's, the endpoint's, your source's) are fetched
// again credentials_refresh_margin before it, by one thread while the others wait; a request
// is never signed with expired ones. The secret key and the token never appear in an error
// message or a log line.
//
// What the client does on every request, because the server needs it (measured with curl
// 7.88 against the RGW): it sends `x-amz-content-sha256` (the SHA-256 of the payload) itself,
// and writes the query string sorted and with `=` on every parameter (`?uploads=`), or the
// signature does not match (403). Every put and part carries Content-MD5, so the server
// refuses bytes damaged on the way (400 BadDigest) instead of storing them.
#pragma once

#include "ckpt/core/export.hpp"

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/objstore/credentials.hpp"
#include "ckpt/objstore/object_store.hpp"

CKPT_API_BEGIN
namespace ckpt {

/// Where an `s3://bucket/prefix` root points.
struct S3Root {
  std::string bucket;
  std::string prefix;  ///< without leading or trailing '/'; may be empty
};

/// Parses `s3://bucket[/prefix]`. Throws Errc::invalid_argument naming `root` for anything
/// else (another scheme, no bucket, a bucket that is not 3..63 of [a-z0-9.-], a prefix that
/// is not a safe key).
S3Root parse_s3_root(std::string_view root);

/// True if `root` starts with "s3://" (so a caller picks the object-store tier).
bool is_s3_root(std::string_view root) noexcept;

struct S3Options {
  std::string root;        ///< "s3://bucket/prefix" (required)
  std::string endpoint;    ///< e.g. "http://127.0.0.1:7480"; empty: $AWS_ENDPOINT_URL, else https://s3.<region>.amazonaws.com
  std::string access_key;  ///< empty: the credential chain above (set it with secret_key)
  std::string secret_key;
  std::string session_token;  ///< with access_key: the token of temporary keys (empty: none)
  std::string profile;     ///< the shared files' profile, over the environment's keys; empty: $AWS_PROFILE, else "default"
  /// Your own source of credentials, in place of the chain: called when the client is made
  /// and again whenever the credentials it returned are within credentials_refresh_margin of
  /// their expiration; never by two threads at once. What it throws reaches the call that
  /// needed the credentials.
  std::function<AwsCredentials()> credentials;
  /// How long before their Expiration credentials are fetched again (the SDKs use 5 to 15
  /// minutes). Credentials that expire sooner than this after their fetch are fetched again
  /// on every request.
  std::chrono::seconds credentials_refresh_margin{300};
  std::string region;      ///< empty: $AWS_REGION, else $AWS_DEFAULT_REGION, else "us-east-1"
  std::chrono::milliseconds connect_timeout{5000};
  /// A request fails with "no response" (ETIMEDOUT) if it moves fewer than 1 byte per second
  /// for this long, or takes longer than `request_timeout` in all.
  std::chrono::milliseconds stall_timeout{30000};
  std::chrono::milliseconds request_timeout{600000};
  /// The largest listing or error response read (a larger one is Errc::io_error).
  std::size_t max_response_bytes = 8u << 20;
  /// How open_s3() retries (make_s3_object_store() does not).
  RetryPolicy retry;
  /// Called with each request's extra headers ("Name: value") just before it is signed and
  /// sent. For tests: a damaged Content-MD5, to see the server refuse it. Empty: none.
  std::function<void(std::vector<std::string>& headers)> before_send;
};

/// The S3 client alone: each call is one HTTP request, no retry. Throws
/// Errc::invalid_argument for a bad root, missing credentials (naming what was looked at) or
/// a broken credential source (a missing profile, a malformed file naming its line, a bad
/// endpoint URI), Errc::io_error when the first credentials cannot be fetched (a
/// credential_process failing, an endpoint unreachable or answering garbage, an Expiration
/// in the past); each names the file, command or URI, and expected and actual.
/// The object is thread-safe and reuses connections across calls.
std::unique_ptr<ObjectStore> make_s3_object_store(const S3Options& options);

/// The S3 client behind a RetryingObjectStore with `options.retry`: what a caller uses.
std::unique_ptr<ObjectStore> open_s3(const S3Options& options);

}  // namespace ckpt
CKPT_API_END
