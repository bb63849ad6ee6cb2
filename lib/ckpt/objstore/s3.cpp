// SPDX-License-Identifier: Apache-2.0
// The S3 client: one HTTP request per call over a pooled libcurl easy handle, signed by
// libcurl (CURLOPT_AWS_SIGV4) with the two things libcurl 7.88 leaves to its caller done
// here: the payload's SHA-256 in x-amz-content-sha256 (libcurl cannot hash a body it streams
// from a read callback) and a canonical query string (sorted, `name=value` even for an empty
// value), which libcurl signs as written. libcurl signs every header it is given, so a
// session token sent as x-amz-security-token is signed too. The credentials are the
// CredentialCache's (detail/credentials.hpp), asked for on every request, so a request is
// signed with current ones and refreshed ones take over without a new client.
#include "ckpt/objstore/s3.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <utility>

#include <curl/curl.h>
#include <openssl/evp.h>

#include "ckpt/hash/sha256.hpp"
#include "ckpt/objstore/detail/credentials.hpp"
#include "ckpt/objstore/detail/s3_xml.hpp"

// Designated initialisers that leave fields at their defaults are the intended style (as in
// the tests): a Request names only what it sets.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace ckpt {

namespace {

using detail::check_object_key;

std::string env_or(const char* name, std::string fallback = {}) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : std::move(fallback);
}

// RFC 3986 percent-encoding as SigV4 wants it: unreserved characters kept, every other byte
// as %XX (upper case); '/' kept only in paths.
std::string uri_encode(std::string_view s, bool keep_slash) {
  static constexpr char hex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
        c == '.' || c == '~' || (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

std::string md5_base64(std::span<const std::byte> data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (EVP_Digest(data.data(), data.size(), md, &n, EVP_md5(), nullptr) != 1)
    throw Error(Errc::io_error, {}, "MD5 failed (OpenSSL EVP_Digest)");
  unsigned char b64[64];
  const int len = EVP_EncodeBlock(b64, md, static_cast<int>(n));
  return std::string(reinterpret_cast<char*>(b64), static_cast<std::size_t>(len));
}

std::string sha256_hex(std::span<const std::byte> data) {
  const Sha256Digest d = sha256(data.data(), data.size());
  return to_hex(d);
}

void check_prefix(std::string_view prefix, std::string_view file) {
  if (prefix.empty()) return;
  if (prefix.back() == '/') prefix.remove_suffix(1);
  check_object_key(prefix, file);
}

using Query = std::vector<std::pair<std::string, std::string>>;

struct Request {
  const char* method = "GET";
  std::string key;  // full key (root prefix included); empty: the bucket
  Query query;
  std::span<const std::byte> body;
  bool has_body = false;  // PUT / POST: send `body` (possibly empty) with its digests
  std::vector<std::string> headers;
  std::span<std::byte> sink;  // a 2xx body goes here (ranged GET), else into Response::body
};

struct Response {
  long status = 0;
  std::string body;       // an error body, or a 2xx body without a sink; bounded
  std::string etag;       // unquoted
  std::uint64_t content_length = 0;
  bool have_length = false;
  std::size_t sink_written = 0;
  bool overflow = false;  // the body exceeded the sink or the bound
};

struct Transfer {
  CURL* handle;
  Response* r;
  std::span<std::byte> sink;
  std::size_t max_body;
  std::span<const std::byte> upload;
  std::size_t upload_pos = 0;
  const std::atomic<bool>* aborted = nullptr;  // abort_calls(): the transfer ends at the next progress call
};

// libcurl calls this at least once a second during a transfer, connecting and waiting for an
// answer included: a non-zero return ends the transfer (CURLE_ABORTED_BY_CALLBACK).
int on_progress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  return static_cast<Transfer*>(user)->aborted->load() ? 1 : 0;
}

std::size_t on_body(char* data, std::size_t size, std::size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const std::size_t len = size * n;
  long status = 0;
  curl_easy_getinfo(t->handle, CURLINFO_RESPONSE_CODE, &status);
  if (status >= 200 && status < 300 && !t->sink.empty()) {
    if (t->r->sink_written + len > t->sink.size()) {
      t->r->overflow = true;
      return 0;
    }
    std::memcpy(t->sink.data() + t->r->sink_written, data, len);
    t->r->sink_written += len;
    return len;
  }
  if (t->r->body.size() + len > t->max_body) {
    t->r->overflow = true;
    return 0;
  }
  t->r->body.append(data, len);
  return len;
}

std::size_t on_header(char* data, std::size_t size, std::size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const std::size_t len = size * n;
  std::string_view line(data, len);
  while (!line.empty() && (line.back() == '\r' || line.back() == '\n')) line.remove_suffix(1);
  if (line.starts_with("HTTP/")) {  // a new response (after a 100 Continue): forget the last one's
    t->r->etag.clear();
    t->r->have_length = false;
    return len;
  }
  const auto colon = line.find(':');
  if (colon == std::string_view::npos) return len;
  std::string name(line.substr(0, colon));
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  std::string_view value = line.substr(colon + 1);
  while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  if (name == "etag") {
    t->r->etag = detail::unquote_etag(value);
  } else if (name == "content-length") {
    t->r->content_length = std::strtoull(std::string(value).c_str(), nullptr, 10);
    t->r->have_length = true;
  }
  return len;
}

std::size_t on_read(char* buffer, std::size_t size, std::size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const std::size_t len = std::min(size * n, t->upload.size() - t->upload_pos);
  std::memcpy(buffer, t->upload.data() + t->upload_pos, len);
  t->upload_pos += len;
  return len;
}

struct CurlList {
  curl_slist* list = nullptr;
  ~CurlList() { curl_slist_free_all(list); }
  void add(const std::string& h) {
    curl_slist* next = curl_slist_append(list, h.c_str());
    if (!next) throw Error(Errc::io_error, {}, "out of memory (curl_slist_append)", {}, {}, ENOMEM);
    list = next;
  }
};

// The errno a transport failure stands for, or 0 if the failure is not one a retry may cure.
int transport_errno(CURLcode rc) {
  switch (rc) {
    case CURLE_OPERATION_TIMEDOUT: return ETIMEDOUT;
    case CURLE_COULDNT_CONNECT: return ECONNREFUSED;
    case CURLE_COULDNT_RESOLVE_HOST: return EHOSTUNREACH;
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE: return ECONNRESET;
    default: return 0;
  }
}

class S3ObjectStore final : public ObjectStore {
 public:
  explicit S3ObjectStore(const S3Options& o) : opt_(o) {
    static std::once_flag once;
    std::call_once(once, [] {
      if (curl_global_init(CURL_GLOBAL_DEFAULT) != 0) throw Error(Errc::io_error, {}, "curl_global_init failed");
    });
    if (opt_.root.empty()) throw_invalid("S3Options::root is empty (expected s3://bucket/prefix)");
    root_ = parse_s3_root(opt_.root);
    root_prefix_ = root_.prefix.empty() ? std::string() : root_.prefix + "/";
    if (opt_.region.empty()) opt_.region = env_or("AWS_REGION", env_or("AWS_DEFAULT_REGION", "us-east-1"));
    if (opt_.endpoint.empty()) opt_.endpoint = env_or("AWS_ENDPOINT_URL", "https://s3." + opt_.region + ".amazonaws.com");
    while (!opt_.endpoint.empty() && opt_.endpoint.back() == '/') opt_.endpoint.pop_back();
    if (!opt_.endpoint.starts_with("http://") && !opt_.endpoint.starts_with("https://"))
      throw Error(Errc::invalid_argument, opt_.root, "endpoint (S3Options::endpoint or AWS_ENDPOINT_URL)",
                  "http://host[:port] or https://host[:port]", opt_.endpoint);
    if (opt_.max_response_bytes == 0) throw_invalid("S3Options::max_response_bytes must be positive");
    if (opt_.credentials_refresh_margin.count() < 0) throw_invalid("S3Options::credentials_refresh_margin must not be negative");
    sigv4_ = "aws:amz:" + opt_.region + ":s3";
    credentials_.emplace(detail::resolve_credential_source(opt_, detail::process_environment()), opt_.credentials_refresh_margin);
    // The secrets are the cache's alone from here: no copy of them stays in the options.
    opt_.secret_key.clear();
    opt_.session_token.clear();
    (void)credentials_->current();  // a broken source fails here, before any request
  }

  ~S3ObjectStore() override {
    for (CURL* h : idle_) curl_easy_cleanup(h);
  }

  void abort_calls() noexcept override { aborted_.store(true); }

  std::string put(std::string_view key, std::span<const std::byte> data, const WriteCondition& when) override {
    const std::string file = name_of(key);
    check_object_key(key, file);
    Request req{.method = "PUT", .key = root_prefix_ + std::string(key), .body = data, .has_body = true};
    std::string expected = "HTTP 2xx";
    if (when.kind == WriteCondition::Kind::absent) {
      req.headers.push_back("If-None-Match: *");
      expected = "no object under the key";
    } else if (when.kind == WriteCondition::Kind::matches) {
      if (when.etag.empty()) throw Error(Errc::invalid_argument, file, "If-Match with an empty ETag");
      // Unquoted: the RGW matches If-Match only against the bare ETag (docs/object-store.md).
      req.headers.push_back("If-Match: " + detail::unquote_etag(when.etag));
      expected = "ETag " + detail::unquote_etag(when.etag);
    }
    Response r = perform(req, file, "PUT");
    if (r.status == 412) fail(r, file, "PUT refused: precondition failed", expected);
    if (r.status / 100 != 2) fail(r, file, "PUT");
    return etag_of(r, file, "PUT");
  }

  std::string create_multipart(std::string_view key) override {
    const std::string file = name_of(key);
    check_object_key(key, file);
    Request req{.method = "POST", .key = root_prefix_ + std::string(key), .query = {{"uploads", ""}}, .has_body = true};
    Response r = perform(req, file, "POST (create multipart upload)");
    if (r.status / 100 != 2) fail(r, file, "create multipart upload");
    return detail::parse_upload_id(r.body, file);
  }

  std::string upload_part(std::string_view key, std::string_view upload_id, int part_number,
                          std::span<const std::byte> data) override {
    const std::string file = name_of(key);
    check_object_key(key, file);
    if (part_number < 1 || part_number > 10000)
      throw Error(Errc::invalid_argument, file, "part number", "1..10000", std::to_string(part_number));
    const std::string action = "PUT part " + std::to_string(part_number);
    Request req{.method = "PUT",
                .key = root_prefix_ + std::string(key),
                .query = {{"partNumber", std::to_string(part_number)}, {"uploadId", std::string(upload_id)}},
                .body = data,
                .has_body = true};
    Response r = perform(req, file, action);
    if (r.status / 100 != 2) fail(r, file, action);
    return etag_of(r, file, action);
  }

  std::string complete_multipart(std::string_view key, std::string_view upload_id,
                                 std::span<const CompletedPart> parts) override {
    const std::string file = name_of(key);
    check_object_key(key, file);
    if (parts.empty()) throw Error(Errc::invalid_argument, file, "complete multipart upload with no parts");
    std::string xml = "<CompleteMultipartUpload>";
    for (const auto& p : parts)
      xml += "<Part><PartNumber>" + std::to_string(p.number) + "</PartNumber><ETag>\"" + detail::unquote_etag(p.etag) +
             "\"</ETag></Part>";
    xml += "</CompleteMultipartUpload>";
    Request req{.method = "POST",
                .key = root_prefix_ + std::string(key),
                .query = {{"uploadId", std::string(upload_id)}},
                .body = std::as_bytes(std::span(xml)),
                .has_body = true,
                .headers = {"Content-Type: application/xml"}};
    Response r = perform(req, file, "POST (complete multipart upload)");
    if (r.status / 100 != 2) fail(r, file, "complete multipart upload");
    // S3 may answer 200 and report the failure in the body.
    if (const auto err = detail::parse_error_body(r.body); !err.code.empty())
      throw Error(Errc::io_error, file, "complete multipart upload: " + err.message, "HTTP 2xx",
                  "HTTP " + std::to_string(r.status) + " " + err.code);
    const auto root = detail::parse_xml(r.body, file, "CompleteMultipartUpload response");
    std::string etag = detail::unquote_etag(root.child_text("ETag"));
    // Measured: Ceph 16.2's RGW answers with an empty <ETag></ETag>. Then the ETag header, else
    // the object's own (a HEAD; a writer replacing the object in between would be read instead).
    if (etag.empty()) etag = r.etag;
    if (etag.empty()) etag = head(key).etag;
    return etag;
  }

  void abort_multipart(std::string_view key, std::string_view upload_id) override {
    const std::string file = name_of(key);
    check_object_key(key, file);
    Request req{.method = "DELETE", .key = root_prefix_ + std::string(key), .query = {{"uploadId", std::string(upload_id)}}};
    Response r = perform(req, file, "DELETE (abort multipart upload)");
    if (r.status / 100 != 2) fail(r, file, "abort multipart upload");
  }

  std::vector<MultipartUpload> list_multipart_uploads(std::string_view prefix, std::size_t max_uploads) override {
    const std::string file = name_of(prefix);
    check_prefix(prefix, file);
    if (max_uploads < 1 || max_uploads > 1000)
      throw Error(Errc::invalid_argument, file, "max_uploads", "1..1000", std::to_string(max_uploads));
    Request req{.method = "GET",
                .query = {{"max-uploads", std::to_string(max_uploads)}, {"prefix", root_prefix_ + std::string(prefix)}, {"uploads", ""}}};
    Response r = perform(req, file, "GET (list multipart uploads)");
    if (r.status / 100 != 2) fail(r, file, "list multipart uploads");
    return detail::parse_list_uploads(r.body, root_prefix_, prefix, max_uploads, file);
  }

  void get_range(std::string_view key, std::uint64_t offset, std::span<std::byte> out) override {
    const std::string file = name_of(key);
    check_object_key(key, file);
    if (out.empty()) {
      (void)head(key);  // existence, as the contract promises
      return;
    }
    const std::uint64_t last = offset + out.size() - 1;
    const std::string action = "GET bytes " + std::to_string(offset) + "-" + std::to_string(last);
    Request req{.method = "GET",
                .key = root_prefix_ + std::string(key),
                .headers = {"Range: bytes=" + std::to_string(offset) + "-" + std::to_string(last)},
                .sink = out};
    Response r = perform(req, file, action);
    if (r.status == 416)
      throw Error(Errc::size_mismatch, file, action + ": the object ends before byte " + std::to_string(offset),
                  "at least " + std::to_string(last + 1) + " bytes", "fewer");
    if (r.status / 100 != 2) fail(r, file, action);
    if (r.status == 200 && offset != 0)  // a server that ignored Range would hand us the wrong bytes
      throw Error(Errc::io_error, file, action + ": the server ignored the Range header", "HTTP 206", "HTTP 200");
    if (r.sink_written != out.size())
      throw Error(Errc::size_mismatch, file, action + ": the object ends early",
                  std::to_string(out.size()) + " bytes", std::to_string(r.sink_written) + " bytes");
  }

  ObjectInfo head(std::string_view key) override {
    const std::string file = name_of(key);
    check_object_key(key, file);
    Request req{.method = "HEAD", .key = root_prefix_ + std::string(key)};
    Response r = perform(req, file, "HEAD");
    // A HEAD's 404 has no body to tell NoSuchKey from NoSuchBucket: a missing bucket must not
    // read as a missing key (a typo in the root would look like an empty store).
    if (r.status == 404 && r.body.empty()) check_bucket_exists("HEAD");
    if (r.status / 100 != 2) fail(r, file, "HEAD");
    if (!r.have_length) throw Error(Errc::io_error, file, "HEAD: no Content-Length in the response");
    return {std::string(key), r.content_length, etag_of(r, file, "HEAD")};
  }

  ObjectPage list(std::string_view prefix, std::string_view token, std::size_t max_keys) override {
    const std::string file = name_of(prefix);
    check_prefix(prefix, file);
    if (max_keys < 1 || max_keys > 1000)
      throw Error(Errc::invalid_argument, file, "max_keys", "1..1000", std::to_string(max_keys));
    Request req{.method = "GET"};
    if (!token.empty()) req.query.emplace_back("continuation-token", std::string(token));
    req.query.emplace_back("list-type", "2");
    req.query.emplace_back("max-keys", std::to_string(max_keys));
    req.query.emplace_back("prefix", root_prefix_ + std::string(prefix));
    Response r = perform(req, file, "GET (list objects)");
    if (r.status / 100 != 2) fail(r, file, "list objects");
    return detail::parse_list_objects(r.body, root_prefix_, prefix, max_keys, file);
  }

  void remove(std::string_view key) override {
    const std::string file = name_of(key);
    check_object_key(key, file);
    Request req{.method = "DELETE", .key = root_prefix_ + std::string(key)};
    Response r = perform(req, file, "DELETE");
    if (r.status / 100 != 2 && (r.status != 404 || detail::parse_error_body(r.body).code == "NoSuchBucket")) fail(r, file, "DELETE");
  }

 private:
  std::string name_of(std::string_view key) const override {
    return "s3://" + root_.bucket + "/" + root_prefix_ + std::string(key);
  }

  static std::string etag_of(const Response& r, const std::string& file, std::string_view action) {
    if (r.etag.empty()) throw Error(Errc::io_error, file, std::string(action) + ": no ETag in the response");
    return r.etag;
  }

  // Throws the typed error of a non-2xx response: 404 not_found (of the key or upload; a
  // missing bucket is no_such_bucket's), 412 conflict, else io_error.
  [[noreturn]] void fail(const Response& r, const std::string& file, std::string_view action,
                         std::string expected = "HTTP 2xx") const {
    const auto body = detail::parse_error_body(r.body);
    if (r.status == 404 && body.code == "NoSuchBucket") no_such_bucket(action);
    const Errc code = r.status == 404 ? Errc::not_found : r.status == 412 ? Errc::conflict : Errc::io_error;
    std::string detail(action);
    if (!body.message.empty()) detail += ": " + body.message;
    std::string actual = "HTTP " + std::to_string(r.status);
    if (!body.code.empty()) actual += " " + body.code;
    throw Error(code, file, std::move(detail), std::move(expected), std::move(actual));
  }

  // The bucket of the root does not exist: Errc::invalid_argument naming it, never the
  // not_found that callers read as "no such object".
  [[noreturn]] void no_such_bucket(std::string_view action) const {
    throw Error(Errc::invalid_argument, "s3://" + root_.bucket,
                std::string(action) + ": the bucket of " + opt_.root + " does not exist (a typo in the root, or the bucket was deleted)",
                "an existing bucket", "HTTP 404 NoSuchBucket");
  }

  // After an object's HEAD answered 404: a HEAD of the bucket, and no_such_bucket() if that is
  // 404 too. Any other answer leaves the object's 404 standing.
  void check_bucket_exists(std::string_view action) {
    Request req{.method = "HEAD"};
    const Response r = perform(req, "s3://" + root_.bucket, "HEAD (bucket)");
    if (r.status == 404) no_such_bucket(action);
  }

  CURL* acquire() {
    {
      std::lock_guard lock(mu_);
      if (!idle_.empty()) {
        CURL* h = idle_.back();
        idle_.pop_back();
        curl_easy_reset(h);  // keeps the connection cache
        return h;
      }
    }
    CURL* h = curl_easy_init();
    if (!h) throw Error(Errc::io_error, opt_.root, "curl_easy_init failed");
    return h;
  }
  void release(CURL* h) {
    std::lock_guard lock(mu_);
    idle_.push_back(h);
  }

  Response perform(const Request& req, const std::string& file, std::string_view action) {
    if (aborted_.load()) throw aborted_error(file, action);
    std::string url = opt_.endpoint + "/" + root_.bucket;
    if (!req.key.empty()) url += "/" + uri_encode(req.key, true);
    Query q = req.query;
    std::sort(q.begin(), q.end());
    for (std::size_t i = 0; i < q.size(); ++i)
      url += (i == 0 ? "?" : "&") + uri_encode(q[i].first, false) + "=" + uri_encode(q[i].second, false);

    // Every header given to libcurl is signed, so none may be empty: an "Expect:" (to turn off
    // 100-continue) is signed with its empty value but not sent, and the server answers 403.
    std::vector<std::string> extra{"x-amz-content-sha256: " + sha256_hex(req.body)};
    if (req.has_body) {
      extra.push_back("Content-MD5: " + md5_base64(req.body));
      if (std::none_of(req.headers.begin(), req.headers.end(), [](const std::string& h) { return h.starts_with("Content-Type:"); }))
        extra.push_back("Content-Type: application/octet-stream");
    }
    extra.insert(extra.end(), req.headers.begin(), req.headers.end());
    if (opt_.before_send) opt_.before_send(extra);
    // After before_send: the token is no test's to see. Fetched anew when due (a refresh may
    // throw, naming its source), so no request is signed with expired credentials.
    const AwsCredentials creds = credentials_->current();
    if (!creds.session_token.empty()) extra.push_back("x-amz-security-token: " + creds.session_token);
    const std::string userpwd = creds.access_key_id + ":" + creds.secret_access_key;
    CurlList headers;
    for (const auto& h : extra) headers.add(h);

    Response r;
    CURL* h = acquire();
    struct Release {
      S3ObjectStore* self;
      CURL* h;
      ~Release() { self->release(h); }
    } release_on_exit{this, h};
    Transfer t{h, &r, req.sink, opt_.max_response_bytes, req.body, 0, &aborted_};
    curl_easy_setopt(h, CURLOPT_URL, url.c_str());
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_AWS_SIGV4, sigv4_.c_str());
    curl_easy_setopt(h, CURLOPT_USERPWD, userpwd.c_str());
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers.list);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(opt_.connect_timeout.count()));
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, static_cast<long>(opt_.request_timeout.count()));
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, std::max(1L, static_cast<long>(opt_.stall_timeout.count() / 1000)));
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &t);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, &t);
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, &t);
    const std::string_view method = req.method;
    if (method == "PUT") {
      curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
      curl_easy_setopt(h, CURLOPT_READFUNCTION, on_read);
      curl_easy_setopt(h, CURLOPT_READDATA, &t);
      curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(req.body.size()));
    } else if (method == "POST") {
      curl_easy_setopt(h, CURLOPT_POST, 1L);
      curl_easy_setopt(h, CURLOPT_POSTFIELDS, req.body.empty() ? "" : reinterpret_cast<const char*>(req.body.data()));
      curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(req.body.size()));
    } else if (method == "HEAD") {
      curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    } else if (method == "DELETE") {
      curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, "DELETE");
    }
    char errbuf[CURL_ERROR_SIZE] = {};
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
    const CURLcode rc = curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r.status);
    if (rc == CURLE_WRITE_ERROR && r.overflow) {
      if (!req.sink.empty() && r.status / 100 == 2)
        throw Error(Errc::size_mismatch, file, std::string(action) + ": the server sent more bytes than asked for",
                    std::to_string(req.sink.size()) + " bytes", "more");
      throw Error(Errc::io_error, file, std::string(action) + ": response larger than the client's bound",
                  "at most " + std::to_string(opt_.max_response_bytes) + " bytes", "more");
    }
    if (rc == CURLE_ABORTED_BY_CALLBACK) throw aborted_error(file, action);
    if (rc != CURLE_OK) {
      const int err = transport_errno(rc);
      const std::string why = errbuf[0] ? errbuf : curl_easy_strerror(rc);
      throw Error(Errc::io_error, file, std::string(action) + " to " + opt_.endpoint + " failed: " + why, "a response",
                  err ? "no response" : "curl error " + std::to_string(static_cast<int>(rc)), err);
    }
    return r;
  }

  static Error aborted_error(const std::string& file, std::string_view action) {
    return Error(Errc::aborted, file, std::string(action) + ": the caller gave up on the store (abort_calls)", "a response",
                 "aborted");
  }

  S3Options opt_;
  std::atomic<bool> aborted_{false};
  S3Root root_;
  std::string root_prefix_;  // "prefix/" or ""
  std::string sigv4_;
  std::optional<detail::CredentialCache> credentials_;
  std::mutex mu_;
  std::vector<CURL*> idle_;
};

}  // namespace

std::unique_ptr<ObjectStore> make_s3_object_store(const S3Options& options) {
  return std::make_unique<S3ObjectStore>(options);
}

std::unique_ptr<ObjectStore> open_s3(const S3Options& options) {
  return std::make_unique<RetryingObjectStore>(make_s3_object_store(options), options.retry);
}

namespace {
std::unique_ptr<ObjectStore> open_s3_root(const std::string& root) {
  S3Options options;
  options.root = root;
  return open_s3(options);
}
// Registers s3:// when this library is loaded (open_store, the tiers and the tools reach the
// client through open_object_store). ckpt::s3 links every program that uses it with
// --undefined=ckpt_link_s3, so that the linker keeps this file of a static libckpt_s3.a.
const bool registered = (register_object_store_scheme("s3://", &open_s3_root), true);
}  // namespace

}  // namespace ckpt

extern "C" __attribute__((visibility("default"))) int ckpt_link_s3() { return ckpt::registered ? 1 : 0; }
