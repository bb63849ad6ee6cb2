// SPDX-License-Identifier: Apache-2.0
// The credential chain, its sources and the refreshing cache (detail/credentials.hpp).
//
// The order is botocore's (the AWS CLI's), which the other SDKs follow but for the place of
// credential_process: explicit keys, the environment, the credentials file's keys, the
// profile's credential_process, the config file's keys, the container endpoint. The profile
// is the two files merged, the credentials file winning a key both set (botocore's
// full_config), so credential_process may sit in either file.
#include "ckpt/objstore/detail/credentials.hpp"

#include <fcntl.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include <boost/json.hpp>
#include <curl/curl.h>

extern char** environ;

namespace ckpt::detail {

namespace {

namespace json = boost::json;
using std::chrono::system_clock;

// How long a credential_process may run, and how much it and an endpoint may print.
constexpr std::chrono::seconds kProcessTimeout{60};
constexpr std::size_t kMaxAnswerBytes = 1u << 20;
constexpr long kEndpointTimeoutMs = 5000;
constexpr int kEndpointAttempts = 3;

std::string trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return std::string(s);
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

std::string format_time(system_clock::time_point t) {
  const auto day = std::chrono::floor<std::chrono::days>(t);
  const std::chrono::year_month_day ymd(day);
  const std::chrono::hh_mm_ss hms(std::chrono::floor<std::chrono::seconds>(t - day));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%04d-%02u-%02uT%02d:%02d:%02dZ", static_cast<int>(ymd.year()), static_cast<unsigned>(ymd.month()),
                static_cast<unsigned>(ymd.day()), static_cast<int>(hms.hours().count()), static_cast<int>(hms.minutes().count()),
                static_cast<int>(hms.seconds().count()));
  return buf;
}

class FixedSource final : public CredentialSource {
 public:
  FixedSource(AwsCredentials c, std::string where) : creds_(std::move(c)), where_(std::move(where)) {}
  AwsCredentials fetch() override { return creds_; }
  std::string describe() const override { return where_; }

 private:
  AwsCredentials creds_;
  std::string where_;
};

class FunctionSource final : public CredentialSource {
 public:
  explicit FunctionSource(std::function<AwsCredentials()> f) : f_(std::move(f)) {}
  AwsCredentials fetch() override {
    AwsCredentials c = f_();
    if (c.access_key_id.empty() || c.secret_access_key.empty())
      throw Error(Errc::invalid_argument, describe(), "returned credentials without an access key id or a secret key",
                  "both", c.access_key_id.empty() ? "no access key id" : "no secret key");
    return c;
  }
  std::string describe() const override { return "S3Options::credentials"; }

 private:
  std::function<AwsCredentials()> f_;
};

// Runs `command` with `sh -c` (as the Java, Go and Rust SDKs do), stdin from /dev/null,
// stderr passed through, and returns what it printed; `who` names it in errors.
std::string run_process(const std::string& command, const std::string& who) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw_errno(errno, "pipe2 for credential_process", who);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  std::string cmd = command;
  char sh[] = "sh", dash_c[] = "-c";
  char* argv[] = {sh, dash_c, cmd.data(), nullptr};
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, "/bin/sh", &fa, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    throw Error(Errc::io_error, who, "could not start /bin/sh", "a running process", std::strerror(rc), rc);
  }
  std::string out;
  bool too_much = false, timed_out = false;
  const auto deadline = std::chrono::steady_clock::now() + kProcessTimeout;
  for (char buf[4096];;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) continue;
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (out.size() + static_cast<std::size_t>(n) > kMaxAnswerBytes) {
      too_much = true;
      break;
    }
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fds[0]);
  if (timed_out || too_much) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out)
    throw Error(Errc::io_error, who, "did not finish", "exit within " + std::to_string(kProcessTimeout.count()) + " s",
                "still running (killed)", ETIMEDOUT);
  if (too_much)
    throw Error(Errc::io_error, who, "printed too much", "at most " + std::to_string(kMaxAnswerBytes) + " bytes", "more");
  if (WIFSIGNALED(status))
    throw Error(Errc::io_error, who, "failed", "exit status 0", "killed by signal " + std::to_string(WTERMSIG(status)));
  if (WEXITSTATUS(status) != 0)
    throw Error(Errc::io_error, who, "failed", "exit status 0", "exit status " + std::to_string(WEXITSTATUS(status)));
  return out;
}

class ProcessSource final : public CredentialSource {
 public:
  ProcessSource(std::string command, std::string where) : command_(std::move(command)), where_(std::move(where)) {}
  AwsCredentials fetch() override {
    const std::string who = "credential_process `" + command_ + "`";
    return parse_credentials_json(run_process(command_, who), who, true);
  }
  std::string describe() const override { return "credential_process `" + command_ + "` of " + where_; }

 private:
  std::string command_, where_;
};

std::size_t on_answer(char* data, std::size_t size, std::size_t n, void* user) {
  auto* out = static_cast<std::string*>(user);
  if (out->size() + size * n > kMaxAnswerBytes) return 0;
  out->append(data, size * n);
  return size * n;
}

// Only https, or http to this machine or to the ECS/EKS agent, as the SDKs accept: a token
// and credentials never cross a network in the clear.
void check_container_uri(const std::string& uri, const std::string& variable) {
  const bool https = uri.starts_with("https://");
  if (!https && !uri.starts_with("http://"))
    throw Error(Errc::invalid_argument, uri, variable + ": not an http(s) URI", "https://... or http://127.0.0.1:PORT/...", uri);
  if (https) return;
  std::string_view rest = std::string_view(uri).substr(7);
  rest = rest.substr(0, rest.find_first_of("/?#"));
  if (const auto at = rest.rfind('@'); at != std::string_view::npos) rest.remove_prefix(at + 1);
  std::string_view host = rest;
  if (host.starts_with("[")) {
    host = host.substr(0, host.find(']') + 1);
  } else {
    host = host.substr(0, host.find(':'));
  }
  const std::string h = lower(std::string(host));
  bool ok = h == "localhost" || h == "[::1]" || h == "169.254.170.2" || h == "169.254.170.23" || h == "[fd00:ec2::23]";
  if (!ok && h.starts_with("127.")) {
    ok = std::count(h.begin(), h.end(), '.') == 3 &&
         std::all_of(h.begin(), h.end(), [](char c) { return c == '.' || (c >= '0' && c <= '9'); });
  }
  if (!ok)
    throw Error(Errc::invalid_argument, uri, variable + ": plain http to a host that is not this machine",
                "https, or http to a loopback address (127.0.0.0/8, ::1, localhost) or the ECS/EKS agent "
                "(169.254.170.2, 169.254.170.23, fd00:ec2::23)",
                "http to " + std::string(host));
}

class ContainerSource final : public CredentialSource {
 public:
  ContainerSource(std::string uri, std::string token, std::string token_file)
      : uri_(std::move(uri)), token_(std::move(token)), token_file_(std::move(token_file)) {}

  AwsCredentials fetch() override {
    std::string token = token_;
    if (!token_file_.empty()) {  // read each time: EKS rotates the file
      std::ifstream in(token_file_, std::ios::binary);
      if (!in)
        throw Error(Errc::invalid_argument, token_file_, "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE cannot be read",
                    "a readable file", std::strerror(errno), errno);
      std::stringstream s;
      s << in.rdbuf();
      token = trim(s.str());
    }
    if (token.find_first_of("\r\n") != std::string::npos)
      throw Error(Errc::invalid_argument, token_file_.empty() ? "AWS_CONTAINER_AUTHORIZATION_TOKEN" : token_file_,
                  "the container authorization token holds a line break", "one line", "several lines");
    std::string answer;
    long status = 0;
    CURLcode rc = CURLE_OK;
    char errbuf[CURL_ERROR_SIZE];
    for (int attempt = 1; attempt <= kEndpointAttempts; ++attempt) {
      answer.clear();
      errbuf[0] = 0;
      CURL* h = curl_easy_init();
      if (!h) throw Error(Errc::io_error, uri_, "curl_easy_init failed");
      curl_slist* headers = nullptr;
      const std::string auth = "Authorization: " + token;
      if (!token.empty()) headers = curl_slist_append(headers, auth.c_str());
      curl_easy_setopt(h, CURLOPT_URL, uri_.c_str());
      curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
      curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
      curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, kEndpointTimeoutMs);
      curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, kEndpointTimeoutMs);
      curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
      curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_answer);
      curl_easy_setopt(h, CURLOPT_WRITEDATA, &answer);
      curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
      rc = curl_easy_perform(h);
      status = 0;
      curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
      curl_slist_free_all(headers);
      curl_easy_cleanup(h);
      if (rc == CURLE_OK && status / 100 != 5) break;
    }
    if (rc == CURLE_WRITE_ERROR)
      throw Error(Errc::io_error, uri_, "the container credentials endpoint answered too much",
                  "at most " + std::to_string(kMaxAnswerBytes) + " bytes", "more");
    if (rc != CURLE_OK)
      throw Error(Errc::io_error, uri_,
                  "the container credentials endpoint is unreachable after " + std::to_string(kEndpointAttempts) +
                      " attempts: " + (errbuf[0] ? std::string(errbuf) : curl_easy_strerror(rc)),
                  "a response", "no response", rc == CURLE_OPERATION_TIMEDOUT ? ETIMEDOUT : ECONNREFUSED);
    if (status != 200)
      throw Error(Errc::io_error, uri_, "the container credentials endpoint refused", "HTTP 200",
                  "HTTP " + std::to_string(status));
    return parse_credentials_json(answer, uri_, false);
  }
  std::string describe() const override { return "the container credentials endpoint " + uri_; }

 private:
  std::string uri_, token_, token_file_;
};

// A file's text, or nullopt if there is no such file.
std::optional<std::string> read_optional_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(Errc::invalid_argument, path, "cannot be read", "a readable file", std::strerror(errno), errno);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::optional<std::string> setting(const Profile* p, const std::string& key) {
  if (!p) return std::nullopt;
  const auto it = p->find(key);
  if (it == p->end() || it->second.value.empty()) return std::nullopt;
  return it->second.value;
}

// The keys of `profile` (read from `file`), or nullopt if it names no access key id.
std::optional<AwsCredentials> profile_keys(const Profile* profile, const std::string& name, const std::string& file) {
  const auto id = setting(profile, "aws_access_key_id");
  if (!id) return std::nullopt;
  const auto secret = setting(profile, "aws_secret_access_key");
  if (!secret)
    throw Error(Errc::invalid_argument, file,
                "profile " + name + " (line " + std::to_string(profile->at("aws_access_key_id").line) +
                    ") has aws_access_key_id but no aws_secret_access_key",
                "both aws_access_key_id and aws_secret_access_key", "aws_access_key_id alone");
  return AwsCredentials{.access_key_id = *id, .secret_access_key = *secret,
                        .session_token = setting(profile, "aws_session_token").value_or(""), .expiration = {}};
}

}  // namespace

Environment process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (!v || !*v) return std::nullopt;
    return std::string(v);
  };
}

std::map<std::string, Profile> parse_profile_file(std::string_view text, const std::string& file, bool config) {
  std::map<std::string, Profile> out;
  Profile* current = nullptr;  // null before the first section, and in a section that is no profile
  bool in_section = false;
  bool after_key = false;  // an indented line under a key without a value is one of its sub-settings
  int number = 0;
  auto bad = [&](std::string why, std::string expected, std::string actual) {
    throw Error(Errc::invalid_argument, file, "line " + std::to_string(number) + ": " + why, std::move(expected),
                std::move(actual));
  };
  for (std::size_t pos = 0; pos <= text.size();) {
    const std::size_t end = std::min(text.find('\n', pos), text.size());
    std::string_view raw = text.substr(pos, end - pos);
    pos = end + 1;
    ++number;
    if (!raw.empty() && raw.back() == '\r') raw.remove_suffix(1);
    const std::string line = trim(raw);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    const bool indented = std::isspace(static_cast<unsigned char>(raw.front()));
    if (indented && after_key) continue;
    if (line[0] == '[') {
      if (line.back() != ']') bad("a section header without ']'", "[name]", "'[' and no ']' at the end");
      std::string name = trim(std::string_view(line).substr(1, line.size() - 2));
      if (name.empty()) bad("an empty section name", "[name]", "[]");
      in_section = true;
      after_key = false;
      current = nullptr;
      if (config) {
        if (name == "default") {
          current = &out["default"];
        } else if (name.starts_with("profile ") || name.starts_with("profile\t")) {
          name = trim(std::string_view(name).substr(8));
          if (name.empty()) bad("a profile section without a name", "[profile NAME]", "[profile]");
          current = &out[name];
        }
      } else {
        current = &out[name];
      }
      continue;
    }
    const auto eq = line.find('=');
    if (eq == std::string::npos || eq == 0)
      bad(eq == 0 ? "a setting without a name" : "neither a [section], a `name = value` setting nor a comment",
          "[section], name = value, # comment or a blank line",
          eq == 0 ? "'=' first" : "a line of " + std::to_string(line.size()) + " characters without '='");
    if (!in_section) bad("a setting before any [section]", "a [section] line first", "a setting");
    std::string value = trim(std::string_view(line).substr(eq + 1));
    after_key = value.empty();  // `s3 =` and indented settings under it
    if (current) (*current)[lower(trim(std::string_view(line).substr(0, eq)))] = {std::move(value), file, number};
  }
  return out;
}

system_clock::time_point parse_expiration(std::string_view text, const std::string& source) {
  auto bad = [&]() -> system_clock::time_point {
    throw Error(Errc::io_error, source, "Expiration is not an RFC 3339 time", "YYYY-MM-DDThh:mm:ssZ",
                "\"" + std::string(text.substr(0, 64)) + "\"");
  };
  auto num = [&](std::size_t at, std::size_t len) {
    int v = 0;
    if (at + len > text.size()) return -1;
    for (std::size_t i = at; i < at + len; ++i) {
      if (text[i] < '0' || text[i] > '9') return -1;
      v = v * 10 + (text[i] - '0');
    }
    return v;
  };
  if (text.size() < 20 || text[4] != '-' || text[7] != '-' || (text[10] != 'T' && text[10] != 't' && text[10] != ' ') ||
      text[13] != ':' || text[16] != ':')
    return bad();
  const int y = num(0, 4), mo = num(5, 2), d = num(8, 2), h = num(11, 2), mi = num(14, 2), s = num(17, 2);
  if (y < 0 || mo < 1 || mo > 12 || d < 1 || h < 0 || h > 23 || mi < 0 || mi > 59 || s < 0 || s > 60) return bad();
  const std::chrono::year_month_day ymd{std::chrono::year(y), std::chrono::month(static_cast<unsigned>(mo)),
                                        std::chrono::day(static_cast<unsigned>(d))};
  if (!ymd.ok()) return bad();
  std::size_t at = 19;
  std::chrono::nanoseconds fraction{0};
  if (at < text.size() && text[at] == '.') {
    ++at;
    const std::size_t digits = at;
    std::int64_t scale = 100000000;
    for (; at < text.size() && text[at] >= '0' && text[at] <= '9'; ++at, scale /= 10)
      fraction += std::chrono::nanoseconds((text[at] - '0') * scale);
    if (at == digits) return bad();
  }
  std::chrono::seconds offset{0};
  if (at + 1 == text.size() && (text[at] == 'Z' || text[at] == 'z')) {
  } else if (at + 6 == text.size() && (text[at] == '+' || text[at] == '-') && text[at + 3] == ':') {
    const int oh = num(at + 1, 2), om = num(at + 4, 2);
    if (oh < 0 || oh > 23 || om < 0 || om > 59) return bad();
    offset = std::chrono::hours(oh) + std::chrono::minutes(om);
    if (text[at] == '-') offset = -offset;
  } else {
    return bad();
  }
  return std::chrono::time_point_cast<system_clock::duration>(std::chrono::sys_days(ymd) + std::chrono::hours(h) +
                                                               std::chrono::minutes(mi) + std::chrono::seconds(s) + fraction - offset);
}

AwsCredentials parse_credentials_json(std::string_view text, const std::string& source, bool process) {
  const std::string what = process ? "credential_process output" : "container credentials";
  const std::string shape = process ? R"({"Version": 1, "AccessKeyId", "SecretAccessKey", "SessionToken", "Expiration"})"
                                    : R"({"AccessKeyId", "SecretAccessKey", "Token", "Expiration"})";
  boost::system::error_code ec;
  const json::value v = json::parse(text, ec);
  if (ec || !v.is_object())
    throw Error(Errc::io_error, source, what + " is not a JSON object", shape,
                ec ? "not JSON (" + ec.message() + ", " + std::to_string(text.size()) + " bytes)" : "JSON that is no object");
  const json::object& o = v.as_object();
  auto field = [&](std::string_view name, bool required) -> std::string {
    const json::value* f = o.if_contains(name);
    if (!f || f->is_null()) {
      if (required) throw Error(Errc::io_error, source, what + " has no " + std::string(name), shape, "no " + std::string(name));
      return {};
    }
    if (!f->is_string() || (required && f->as_string().empty()))
      throw Error(Errc::io_error, source, what + ": " + std::string(name) + " is not a non-empty string", "a string",
                  f->is_string() ? "an empty string" : "another JSON type");
    return std::string(f->as_string());
  };
  if (process) {
    const json::value* version = o.if_contains("Version");
    if (!version || !version->is_int64() || version->as_int64() != 1)
      throw Error(Errc::io_error, source, what + ": Version", "1",
                  !version ? "no Version" : version->is_number() ? json::serialize(*version) : "not a number");
  }
  AwsCredentials c{.access_key_id = field("AccessKeyId", true),
                   .secret_access_key = field("SecretAccessKey", true),
                   .session_token = field(process ? "SessionToken" : "Token", false), .expiration = {}};
  if (const std::string e = field("Expiration", false); !e.empty()) c.expiration = parse_expiration(e, source);
  return c;
}

std::unique_ptr<CredentialSource> resolve_credential_source(const S3Options& o, const Environment& env) {
  // 1. What the caller gave.
  if (o.credentials) return std::make_unique<FunctionSource>(o.credentials);
  if (!o.access_key.empty() || !o.secret_key.empty()) {
    if (o.access_key.empty() || o.secret_key.empty())
      throw Error(Errc::invalid_argument, o.root, "S3Options has " + std::string(o.access_key.empty() ? "secret_key" : "access_key") + " without " + (o.access_key.empty() ? "access_key" : "secret_key"),
                  "both or neither", "one");
    return std::make_unique<FixedSource>(AwsCredentials{o.access_key, o.secret_key, o.session_token, std::nullopt},
                                         "S3Options::access_key");
  }
  // 2. The environment; a profile named in S3Options is meant over it (as in botocore).
  const auto id = env("AWS_ACCESS_KEY_ID");
  const auto secret = env("AWS_SECRET_ACCESS_KEY");
  if (o.profile.empty() && (id || secret)) {
    if (!id || !secret)
      throw Error(Errc::invalid_argument, id ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID",
                  std::string(id ? "AWS_ACCESS_KEY_ID" : "AWS_SECRET_ACCESS_KEY") + " is set but " +
                      (id ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID") + " is not",
                  "both set", "one");
    return std::make_unique<FixedSource>(AwsCredentials{*id, *secret, env("AWS_SESSION_TOKEN").value_or(""), std::nullopt},
                                         "the environment (AWS_ACCESS_KEY_ID)");
  }
  // 3. The profile of the shared files.
  std::string home;
  if (const auto h = env("HOME")) {
    home = *h;
  } else if (const passwd* pw = ::getpwuid(::getuid()); pw && pw->pw_dir) {
    home = pw->pw_dir;
  }
  const std::string cred_file = env("AWS_SHARED_CREDENTIALS_FILE").value_or(home + "/.aws/credentials");
  const std::string config_file = env("AWS_CONFIG_FILE").value_or(home + "/.aws/config");
  const std::optional<std::string> named = !o.profile.empty() ? std::optional(o.profile) : env("AWS_PROFILE");
  const std::string profile = named.value_or("default");
  std::map<std::string, Profile> creds, config;
  const auto cred_text = read_optional_file(cred_file);
  const auto config_text = read_optional_file(config_file);
  if (cred_text) creds = parse_profile_file(*cred_text, cred_file, false);
  if (config_text) config = parse_profile_file(*config_text, config_file, true);
  const Profile* in_creds = creds.contains(profile) ? &creds.at(profile) : nullptr;
  const Profile* in_config = config.contains(profile) ? &config.at(profile) : nullptr;
  if (named && !in_creds && !in_config)
    throw Error(Errc::invalid_argument, cred_file,
                "profile " + profile + " (" + (o.profile.empty() ? "AWS_PROFILE" : "S3Options::profile") + ") is in neither file",
                "a [" + profile + "] section in " + cred_file + " or [profile " + profile + "] in " + config_file,
                std::string(cred_text ? "" : cred_file + " does not exist; ") + (config_text ? "" : config_file + " does not exist; ") +
                    "no such profile");
  if (auto keys = profile_keys(in_creds, profile, cred_file))
    return std::make_unique<FixedSource>(std::move(*keys), "profile " + profile + " of " + cred_file);
  Profile merged = in_config ? *in_config : Profile{};
  if (in_creds)
    for (const auto& [k, v] : *in_creds) merged[k] = v;
  if (const auto cmd = setting(&merged, "credential_process"))
    return std::make_unique<ProcessSource>(*cmd, "profile " + profile + " of " + merged.at("credential_process").file);
  if (auto keys = profile_keys(in_config, profile, config_file))
    return std::make_unique<FixedSource>(std::move(*keys), "profile " + profile + " of " + config_file);
  // 4. The container endpoint.
  std::optional<std::string> uri = env("AWS_CONTAINER_CREDENTIALS_FULL_URI");
  std::string variable = "AWS_CONTAINER_CREDENTIALS_FULL_URI";
  if (const auto rel = env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")) {  // ECS, and first where both are set
    uri = "http://169.254.170.2" + *rel;
    variable = "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI";
  }
  if (uri) {
    check_container_uri(*uri, variable);
    return std::make_unique<ContainerSource>(*uri, env("AWS_CONTAINER_AUTHORIZATION_TOKEN").value_or(""),
                                             env("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE").value_or(""));
  }
  throw Error(Errc::invalid_argument, o.root,
              "no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a profile (AWS_PROFILE, now " + profile +
                  ") with keys or a credential_process in " + cred_file + " or " + config_file +
                  ", or AWS_CONTAINER_CREDENTIALS_FULL_URI (or S3Options::access_key/secret_key or credentials)",
              "credentials", "none found");
}

CredentialCache::CredentialCache(std::unique_ptr<CredentialSource> source, std::chrono::seconds margin, Clock now)
    : source_(std::move(source)), margin_(margin), now_(now ? std::move(now) : Clock([] { return system_clock::now(); })) {}

AwsCredentials CredentialCache::current() {
  std::lock_guard lock(mu_);
  const auto now = now_();
  if (cached_ && (!cached_->expiration || *cached_->expiration - margin_ > now)) return *cached_;
  AwsCredentials next = source_->fetch();
  if (next.expiration && *next.expiration <= now)
    throw Error(Errc::io_error, source_->describe(), "handed out credentials that have already expired",
                "an Expiration after now (" + format_time(now) + ")", format_time(*next.expiration));
  cached_ = std::move(next);
  return *cached_;
}

}  // namespace ckpt::detail
