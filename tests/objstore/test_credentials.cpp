// SPDX-License-Identifier: Apache-2.0
// The S3 credential chain without a server: the shared files' parsing, which source wins
// (the order of the AWS SDKs), the JSON of a credential_process and of the container
// endpoint, the refresh margin, and that no error quotes a secret. The environment is a map
// of the test's own; the files are written to a temporary directory.
#include <doctest/doctest.h>

#include <atomic>
#include <fstream>
#include <map>
#include <thread>

#include "ckpt/objstore/detail/credentials.hpp"
#include "support/test_support.hpp"

using namespace ckpt;
using namespace std::chrono_literals;
using detail::Environment;
using detail::resolve_credential_source;

namespace {

// An environment of exactly `vars`, with HOME pointing at a directory that has no .aws.
Environment env_of(std::map<std::string, std::string> vars) {
  if (!vars.contains("HOME")) vars["HOME"] = "/nonexistent-home";
  return [vars](const std::string& name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    if (it == vars.end() || it->second.empty()) return std::nullopt;
    return it->second;
  };
}

void write(const std::filesystem::path& p, const std::string& text) { std::ofstream(p) << text; }

S3Options root_only() { return {.root = "s3://bucket/prefix"}; }

// The source the chain picks and the credentials it fetches.
AwsCredentials fetch(const S3Options& o, const Environment& env) { return resolve_credential_source(o, env)->fetch(); }

// A directory holding a credentials file and a config file with profiles "default" and "dev".
struct SharedFiles {
  test::TempDir dir{"ckpt-cred"};
  std::string creds = (dir / "credentials").string();
  std::string config = (dir / "config").string();
  SharedFiles(const std::string& credentials_text, const std::string& config_text) {
    if (!credentials_text.empty()) write(creds, credentials_text);
    if (!config_text.empty()) write(config, config_text);
  }
  std::map<std::string, std::string> vars(std::map<std::string, std::string> more = {}) const {
    more["AWS_SHARED_CREDENTIALS_FILE"] = creds;
    more["AWS_CONFIG_FILE"] = config;
    return more;
  }
};

}  // namespace

TEST_CASE("a credentials file parses into profiles, skipping comments, blank lines and indented sub-settings, keys lower-cased") {
  const auto p = detail::parse_profile_file(
      "# comment\n; another\n\n[default]\naws_access_key_id = AKIDDEFAULT\nAWS_Secret_Access_Key=s3cr3t\n"
      "[dev]  \n  aws_access_key_id =  AKIDDEV  \r\n  s3 =\n    max_concurrent_requests = 10\naws_session_token = tok\n",
      "creds", false);
  REQUIRE(p.size() == 2);
  CHECK(p.at("default").at("aws_access_key_id").value == "AKIDDEFAULT");
  CHECK(p.at("default").at("aws_secret_access_key").value == "s3cr3t");
  CHECK(p.at("dev").at("aws_access_key_id").value == "AKIDDEV");
  CHECK(p.at("dev").at("aws_access_key_id").line == 8);
  CHECK(!p.at("dev").contains("max_concurrent_requests"));
  CHECK(p.at("dev").at("aws_session_token").value == "tok");
}

TEST_CASE("a config file's profiles are [profile NAME] and [default], and other sections are no profiles") {
  const auto p = detail::parse_profile_file(
      "[default]\nregion = eu-west-1\n[profile dev]\ncredential_process = /bin/true\n[dev2]\naws_access_key_id = X\n"
      "[sso-session corp]\nsso_region = us-east-1\n",
      "config", true);
  CHECK(p.size() == 2);
  CHECK(p.at("dev").at("credential_process").value == "/bin/true");
  CHECK(p.contains("default"));
  CHECK(!p.contains("dev2"));
}

TEST_CASE("a malformed line of a credentials file is invalid_argument naming the file and line without quoting the line") {
  const Error e = test::error_of(
      [] { detail::parse_profile_file("[default]\naws_access_key_id = AKID\naws_secret_access_key: VERYSECRET\n", "/x/credentials", false); });
  CHECK(e.code() == Errc::invalid_argument);
  CHECK(e.file() == "/x/credentials");
  CHECK(e.detail().find("line 3") != std::string::npos);
  CHECK(e.expected().find("name = value") != std::string::npos);
  CHECK(std::string(e.what()).find("VERYSECRET") == std::string::npos);
  const Error before = test::error_of([] { detail::parse_profile_file("aws_access_key_id = AKID\n", "/x/credentials", false); });
  CHECK(before.detail() == "line 1: a setting before any [section]");
  const Error open = test::error_of([] { detail::parse_profile_file("[default\n", "/x/config", true); });
  CHECK(open.detail().find("line 1: a section header without ']'") == 0);
}

TEST_CASE("explicit S3Options keys come before the environment, and the environment before the shared files") {
  SharedFiles files("[default]\naws_access_key_id = FROMFILE\naws_secret_access_key = filesecret\n", "");
  const auto env = env_of(files.vars({{"AWS_ACCESS_KEY_ID", "FROMENV"}, {"AWS_SECRET_ACCESS_KEY", "envsecret"}, {"AWS_SESSION_TOKEN", "envtoken"}}));
  S3Options o = root_only();
  o.access_key = "FROMOPTIONS";
  o.secret_key = "optsecret";
  o.session_token = "opttoken";
  const AwsCredentials explicit_keys = fetch(o, env);
  CHECK(explicit_keys.access_key_id == "FROMOPTIONS");
  CHECK(explicit_keys.session_token == "opttoken");
  CHECK(resolve_credential_source(o, env)->describe() == "S3Options::access_key");
  const AwsCredentials from_env = fetch(root_only(), env);
  CHECK(from_env.access_key_id == "FROMENV");
  CHECK(from_env.secret_access_key == "envsecret");
  CHECK(from_env.session_token == "envtoken");
  CHECK(!from_env.expiration);
  const AwsCredentials from_file = fetch(root_only(), env_of(files.vars()));
  CHECK(from_file.access_key_id == "FROMFILE");
  CHECK(from_file.session_token.empty());
}

TEST_CASE("half a key pair is an error, in the options and in the environment, naming what is missing") {
  S3Options o = root_only();
  o.access_key = "AKID";
  const Error opt = test::error_of([&] { resolve_credential_source(o, env_of({})); });
  CHECK(opt.code() == Errc::invalid_argument);
  CHECK(opt.detail() == "S3Options has access_key without secret_key");
  const Error env = test::error_of([&] { resolve_credential_source(root_only(), env_of({{"AWS_ACCESS_KEY_ID", "AKID"}})); });
  CHECK(env.detail() == "AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not");
}

TEST_CASE("AWS_PROFILE selects the profile, the default is default, and S3Options::profile overrides both and the environment's keys") {
  SharedFiles files(
      "[default]\naws_access_key_id = DEFAULTKEY\naws_secret_access_key = d\n"
      "[dev]\naws_access_key_id = DEVKEY\naws_secret_access_key = s\naws_session_token = devtoken\n"
      "[ops]\naws_access_key_id = OPSKEY\naws_secret_access_key = o\n",
      "");
  CHECK(fetch(root_only(), env_of(files.vars())).access_key_id == "DEFAULTKEY");
  const AwsCredentials dev = fetch(root_only(), env_of(files.vars({{"AWS_PROFILE", "dev"}})));
  CHECK(dev.access_key_id == "DEVKEY");
  CHECK(dev.session_token == "devtoken");
  S3Options o = root_only();
  o.profile = "ops";
  const auto env = env_of(files.vars({{"AWS_PROFILE", "dev"}, {"AWS_ACCESS_KEY_ID", "ENVKEY"}, {"AWS_SECRET_ACCESS_KEY", "e"}}));
  CHECK(fetch(o, env).access_key_id == "OPSKEY");
  CHECK(resolve_credential_source(o, env)->describe() == "profile ops of " + files.creds);
}

TEST_CASE("the credentials file's keys win over the config file's, and over a credential_process of the same profile") {
  SharedFiles files("[dev]\naws_access_key_id = CREDSKEY\naws_secret_access_key = c\n",
                    "[profile dev]\naws_access_key_id = CONFIGKEY\naws_secret_access_key = k\ncredential_process = false\n");
  CHECK(fetch(root_only(), env_of(files.vars({{"AWS_PROFILE", "dev"}}))).access_key_id == "CREDSKEY");
}

TEST_CASE("a profile's credential_process comes before the config file's keys, and the config file's keys serve a profile the credentials file lacks") {
  SharedFiles files("[other]\naws_access_key_id = X\naws_secret_access_key = x\n",
                    "[profile dev]\naws_access_key_id = CONFIGKEY\naws_secret_access_key = k\n"
                    "credential_process = echo '{\"Version\": 1, \"AccessKeyId\": \"PROCKEY\", \"SecretAccessKey\": \"p\"}'\n"
                    "[default]\naws_access_key_id = CONFIGDEFAULT\naws_secret_access_key = k\n");
  const auto env = env_of(files.vars({{"AWS_PROFILE", "dev"}}));
  CHECK(fetch(root_only(), env).access_key_id == "PROCKEY");
  CHECK(resolve_credential_source(root_only(), env)->describe().starts_with("credential_process `echo"));
  CHECK(fetch(root_only(), env_of(files.vars())).access_key_id == "CONFIGDEFAULT");
}

TEST_CASE("a credential_process in the credentials file serves its profile too, as in botocore's merged profile") {
  SharedFiles files("[dev]\ncredential_process = echo '{\"Version\": 1, \"AccessKeyId\": \"PROCKEY\", \"SecretAccessKey\": \"p\", \"SessionToken\": \"t\"}'\n",
                    "[profile dev]\nregion = eu-west-1\n");
  const AwsCredentials c = fetch(root_only(), env_of(files.vars({{"AWS_PROFILE", "dev"}})));
  CHECK(c.access_key_id == "PROCKEY");
  CHECK(c.session_token == "t");
}

TEST_CASE("a named profile in neither file is invalid_argument naming the files and the profile") {
  SharedFiles files("[default]\naws_access_key_id = A\naws_secret_access_key = a\n", "");
  const Error e = test::error_of([&] { resolve_credential_source(root_only(), env_of(files.vars({{"AWS_PROFILE", "prod"}}))); });
  CHECK(e.code() == Errc::invalid_argument);
  CHECK(e.file() == files.creds);
  CHECK(e.detail() == "profile prod (AWS_PROFILE) is in neither file");
  CHECK(e.expected() == "a [prod] section in " + files.creds + " or [profile prod] in " + files.config);
  CHECK(e.actual() == files.config + " does not exist; no such profile");
}

TEST_CASE("a profile with an access key and no secret is invalid_argument naming the file, profile and line") {
  SharedFiles files("[default]\n\naws_access_key_id = AKID\n", "");
  const Error e = test::error_of([&] { resolve_credential_source(root_only(), env_of(files.vars())); });
  CHECK(e.code() == Errc::invalid_argument);
  CHECK(e.file() == files.creds);
  CHECK(e.detail() == "profile default (line 3) has aws_access_key_id but no aws_secret_access_key");
  CHECK(e.actual() == "aws_access_key_id alone");
}

TEST_CASE("with no source at all the error names the variables, the files and the profile looked at") {
  const Error e = test::error_of([] { resolve_credential_source(root_only(), env_of({{"HOME", "/home/nobody"}})); });
  CHECK(e.code() == Errc::invalid_argument);
  CHECK(e.file() == "s3://bucket/prefix");
  CHECK(e.detail().find("AWS_ACCESS_KEY_ID") != std::string::npos);
  CHECK(e.detail().find("/home/nobody/.aws/credentials") != std::string::npos);
  CHECK(e.detail().find("/home/nobody/.aws/config") != std::string::npos);
  CHECK(e.detail().find("AWS_CONTAINER_CREDENTIALS_FULL_URI") != std::string::npos);
}

TEST_CASE("a credential_process's JSON gives keys, token and expiration, and bad JSON is io_error naming the command without quoting it") {
  const AwsCredentials c = detail::parse_credentials_json(
      R"({"Version": 1, "AccessKeyId": "AK", "SecretAccessKey": "SK", "SessionToken": "TK", "Expiration": "2030-01-02T03:04:05Z"})", "cmd", true);
  CHECK(c.access_key_id == "AK");
  CHECK(c.session_token == "TK");
  REQUIRE(c.expiration);
  CHECK(std::chrono::duration_cast<std::chrono::seconds>(c.expiration->time_since_epoch()).count() == 1893553445);
  const Error version = test::error_of([] {
    detail::parse_credentials_json(R"({"Version": 2, "AccessKeyId": "AK", "SecretAccessKey": "HUSH"})", "cmd", true);
  });
  CHECK(version.code() == Errc::io_error);
  CHECK(version.file() == "cmd");
  CHECK(version.expected() == "1");
  CHECK(version.actual() == "2");
  const Error garbage = test::error_of([] { detail::parse_credentials_json("SecretAccessKey=HUSH", "cmd", true); });
  CHECK(garbage.detail() == "credential_process output is not a JSON object");
  CHECK(garbage.actual().starts_with("not JSON ("));
  const Error missing = test::error_of([] { detail::parse_credentials_json(R"({"AccessKeyId": "AK", "Token": "HUSH"})", "uri", false); });
  CHECK(missing.detail() == "container credentials has no SecretAccessKey");
  for (const Error& e : {version, garbage, missing}) CHECK(std::string(e.what()).find("HUSH") == std::string::npos);
}

TEST_CASE("Expiration is read as RFC 3339 with fractions and offsets, and anything else is io_error naming the source") {
  using std::chrono::seconds;
  const auto at = [](const char* t) {
    return std::chrono::duration_cast<seconds>(detail::parse_expiration(t, "src").time_since_epoch()).count();
  };
  CHECK(at("2030-01-02T03:04:05Z") == 1893553445);
  CHECK(at("2030-01-02T03:04:05.123456Z") == 1893553445);
  const auto fine = detail::parse_expiration("2030-01-02T03:04:05.123456Z", "src").time_since_epoch();
  CHECK(std::chrono::duration_cast<std::chrono::microseconds>(fine).count() == 1893553445123456);
  CHECK(at("2030-01-02T05:04:05+02:00") == 1893553445);
  CHECK(at("2030-01-02T01:04:05-02:00") == 1893553445);
  const Error e = test::error_of([] { detail::parse_expiration("tomorrow", "src"); });
  CHECK(e.code() == Errc::io_error);
  CHECK(e.file() == "src");
  CHECK(e.actual() == "\"tomorrow\"");
  CHECK_THROWS_AS(detail::parse_expiration("2030-02-30T03:04:05Z", "src"), Error);
}

TEST_CASE("a credential_process that fails, exits non-zero or prints bad JSON is io_error naming the command and exit status") {
  SharedFiles files("", "[default]\ncredential_process = exit 3\n");
  const Error exit3 = test::error_of([&] { fetch(root_only(), env_of(files.vars())); });
  CHECK(exit3.code() == Errc::io_error);
  CHECK(exit3.file() == "credential_process `exit 3`");
  CHECK(exit3.expected() == "exit status 0");
  CHECK(exit3.actual() == "exit status 3");
  SharedFiles missing("", "[default]\ncredential_process = /nonexistent/helper 2>/dev/null\n");
  CHECK(test::error_of([&] { fetch(root_only(), env_of(missing.vars())); }).actual() == "exit status 127");
  // The command is named in errors, so the secret is in a script it runs, not on its line.
  SharedFiles bad("", "");
  write(bad.dir / "helper.sh", "echo '{\"Version\": 1, \"AccessKeyId\": \"AK\", \"SecretAccessKey\": \"HUSH\", \"Expiration\": 5}'\n");
  write(bad.config, "[default]\ncredential_process = sh " + (bad.dir / "helper.sh").string() + "\n");
  const Error json = test::error_of([&] { fetch(root_only(), env_of(bad.vars())); });
  CHECK(json.code() == Errc::io_error);
  CHECK(json.detail() == "credential_process output: Expiration is not a non-empty string");
  CHECK(std::string(json.what()).find("HUSH") == std::string::npos);
}

TEST_CASE("the container endpoint must be https or http to a loopback or the ECS agent, as the SDKs accept") {
  for (const char* uri : {"http://127.0.0.1:1/creds", "http://localhost/x", "http://[::1]:80/x", "https://creds.example.com/x",
                          "http://169.254.170.23/v1/credentials"}) {
    CAPTURE(uri);
    CHECK_NOTHROW(resolve_credential_source(root_only(), env_of({{"AWS_CONTAINER_CREDENTIALS_FULL_URI", uri}})));
  }
  for (const char* uri : {"http://10.0.0.1/creds", "http://127.0.0.1.evil.com/x", "ftp://127.0.0.1/x", "http://user@example.com/x"}) {
    CAPTURE(uri);
    const Error e = test::error_of([&] { resolve_credential_source(root_only(), env_of({{"AWS_CONTAINER_CREDENTIALS_FULL_URI", uri}})); });
    CHECK(e.code() == Errc::invalid_argument);
    CHECK(e.file() == uri);
  }
  CHECK(resolve_credential_source(root_only(), env_of({{"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "/v2/creds/abc"}}))->describe() ==
        "the container credentials endpoint http://169.254.170.2/v2/creds/abc");
}

TEST_CASE("an unreachable container endpoint is io_error naming the URI, transient, and never quoting the authorization token") {
  const std::string uri = "http://127.0.0.1:1/creds";
  const Error e = test::error_of([&] {
    fetch(root_only(), env_of({{"AWS_CONTAINER_CREDENTIALS_FULL_URI", uri}, {"AWS_CONTAINER_AUTHORIZATION_TOKEN", "AUTHHUSH"}}));
  });
  CHECK(e.code() == Errc::io_error);
  CHECK(e.file() == uri);
  CHECK(e.actual() == "no response");
  CHECK(e.sys_errno() == ECONNREFUSED);
  CHECK(std::string(e.what()).find("AUTHHUSH") == std::string::npos);
}

namespace {

// A source whose every fetch hands out credentials expiring `ttl` after the test clock.
struct CountingSource final : detail::CredentialSource {
  std::atomic<int>* fetches;
  std::chrono::system_clock::time_point* now;
  std::chrono::seconds ttl;
  CountingSource(std::atomic<int>* f, std::chrono::system_clock::time_point* n, std::chrono::seconds t) : fetches(f), now(n), ttl(t) {}
  AwsCredentials fetch() override {
    const int n = ++*fetches;
    return {.access_key_id = "KEY" + std::to_string(n), .secret_access_key = "s", .expiration = *now + ttl};
  }
  std::string describe() const override { return "counting source"; }
};

}  // namespace

TEST_CASE("cached credentials are fetched again a margin before they expire, not before, and expired ones are refused") {
  std::atomic<int> fetches{0};
  auto now = std::chrono::system_clock::now();
  detail::CredentialCache cache(std::make_unique<CountingSource>(&fetches, &now, 600s), 300s, [&] { return now; });
  CHECK(cache.current().access_key_id == "KEY1");
  now += 299s;
  CHECK(cache.current().access_key_id == "KEY1");
  now += 1s;  // 300 s left: within the margin
  CHECK(cache.current().access_key_id == "KEY2");
  CHECK(fetches == 2);

  struct Expired final : detail::CredentialSource {
    AwsCredentials fetch() override {
      return {.access_key_id = "K", .secret_access_key = "HUSH", .expiration = std::chrono::system_clock::now() - 10s};
    }
    std::string describe() const override { return "credential_process `old`"; }
  };
  detail::CredentialCache stale(std::make_unique<Expired>(), 60s);
  const Error e = test::error_of([&] { stale.current(); });
  CHECK(e.code() == Errc::io_error);
  CHECK(e.file() == "credential_process `old`");
  CHECK(e.detail() == "handed out credentials that have already expired");
  CHECK(e.expected().starts_with("an Expiration after now ("));
  CHECK(std::string(e.what()).find("HUSH") == std::string::npos);
}

TEST_CASE("threads asking a cache at once while its credentials are due get them fetched once") {
  std::atomic<int> fetches{0};
  auto now = std::chrono::system_clock::now();
  detail::CredentialCache cache(std::make_unique<CountingSource>(&fetches, &now, 600s), 300s, [&] { return now; });
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int i = 0; i < 8; ++i)
    threads.emplace_back([&] {
      for (int j = 0; j < 100; ++j)
        if (cache.current().access_key_id != "KEY1") ++wrong;
    });
  for (auto& t : threads) t.join();
  CHECK(fetches == 1);
  CHECK(wrong == 0);
}
