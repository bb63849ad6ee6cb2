// SPDX-License-Identifier: Apache-2.0
// The S3 client's credentials end to end. Against sigv4_server.py, a loopback S3 of the
// tests' own that checks every request's SigV4 signature with Python's hmac and hashlib (no
// code shared with the client, which signs through libcurl) and refuses expired keys: a
// session token sent and signed as x-amz-security-token, credentials of the container
// endpoint and of a credential_process refreshed before they expire, their failures, and no
// secret in any error, log line or output of the ckpt tool. Against the real RGW: a profile
// of a shared credentials file and keys from the environment save, list and load.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/json.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "ckpt/core/log.hpp"
#include "ckpt/objstore/s3.hpp"
#include "ckpt/ops/save.hpp"
#include "ckpt/store/object/object_commit.hpp"
#include "ckpt/store/store.hpp"
#include "io/io_fixture.hpp"
#include "objstore/rgw_fixture.hpp"
#include "support/test_support.hpp"

using namespace ckpt;
using namespace std::chrono_literals;
using test::bytes_of;
using test::text_of;

namespace {

const std::string kServer = std::string(CKPT_SOURCE_DIR) + "/tests/objstore/sigv4_server.py";
const std::string kTool = std::string(CKPT_TEST_BINARY_DIR) + "/bin/ckpt";

// Every variable the credential chain reads, set to `vars` (others unset, and the shared
// files pointed at nothing) while the object lives; the old values come back afterwards.
class ScopedEnv {
 public:
  explicit ScopedEnv(std::map<std::string, std::string> vars) : env_(chain_variables(std::move(vars))) {}

 private:
  static std::map<std::string, std::optional<std::string>> chain_variables(std::map<std::string, std::string> vars) {
    std::map<std::string, std::optional<std::string>> out;
    for (const char* name : {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                             "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                             "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_AUTHORIZATION_TOKEN",
                             "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", "AWS_ENDPOINT_URL", "AWS_REGION"})
      out[name] = std::nullopt;
    vars.try_emplace("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials");
    vars.try_emplace("AWS_CONFIG_FILE", "/nonexistent/config");
    for (auto& [k, v] : vars) out[k] = std::move(v);
    return out;
  }
  test::ScopedEnv env_;
};

// sigv4_server.py serving on a loopback port for the object's lifetime.
class SigV4Server {
 public:
  explicit SigV4Server(std::vector<std::string> args) {
    if (std::system("python3 -c '' 2>/dev/null") != 0) {
      MESSAGE("skipped: python3 is not installed (the signature-checking server needs it)");
      std::exit(77);
    }
    const std::string port_file = (dir_ / "port").string();
    std::vector<std::string> argv{"/usr/bin/env", "python3", kServer, "serve", "--port-file", port_file};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> cargs;
    for (auto& a : argv) cargs.push_back(a.data());
    cargs.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, (dir_ / "log").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    REQUIRE(::posix_spawn(&pid_, argv[0].c_str(), &fa, nullptr, cargs.data(), ::environ) == 0);
    posix_spawn_file_actions_destroy(&fa);
    for (int i = 0; i < 1000 && !std::filesystem::exists(port_file); ++i) std::this_thread::sleep_for(10ms);
    std::ifstream in(port_file);
    in >> port_;
    REQUIRE_MESSAGE(port_ > 0, "sigv4_server.py did not start: " << text_of(dir_ / "log"));
  }
  ~SigV4Server() {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  SigV4Server(const SigV4Server&) = delete;
  SigV4Server& operator=(const SigV4Server&) = delete;

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  boost::json::object stats() const { return boost::json::parse(get("/_stats")).as_object(); }
  std::int64_t stat(const char* name) const { return stats().at(name).as_int64(); }
  /// Every secret key and token it handed out.
  std::vector<std::string> issued() const {
    std::vector<std::string> out;
    const boost::json::value all = boost::json::parse(get("/_issued"));
    for (const auto& v : all.as_array()) out.emplace_back(v.as_string());
    return out;
  }
  /// The credential_process command that fetches credentials from it.
  std::string process_command() const { return "python3 " + kServer + " fetch '" + url() + "/_creds?format=process'"; }
  /// Options for s3://bucket/`prefix` on it, credentials from the chain.
  S3Options options(const std::string& prefix) const {
    return {.root = "s3://bucket/" + prefix, .endpoint = url(), .region = "us-east-1"};
  }

 private:
  static std::string text_of(const std::filesystem::path& p) {
    std::ifstream in(p);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  std::string get(const std::string& path) const {
    int status = 0;
    const std::string out = test::run_command("python3 " + kServer + " fetch " + url() + path, &status);
    REQUIRE(status == 0);
    return out;
  }
  test::TempDir dir_{"ckpt-sigv4"};
  pid_t pid_ = -1;
  int port_ = 0;
};

void write(const std::filesystem::path& p, const std::string& text) { std::ofstream(p) << text; }

// A put, a get, a head and a listing: each one request the server checks.
void round_trip(ObjectStore& store, const std::string& key) {
  store.put(key, bytes_of("payload of " + key));
  CHECK(text_of(store.get(key)) == "payload of " + key);
  CHECK(store.head(key).size == ("payload of " + key).size());
  CHECK(!store.list("").objects.empty());
}

}  // namespace

TEST_CASE("a session token is sent as x-amz-security-token and signed, and a server checking SigV4 on its own refuses a wrong token or secret") {
  SigV4Server server({"--static", "ASIATOKENKEY:tokensecret:the-session-token"});
  ScopedEnv env({});
  S3Options o = server.options(test::unique_prefix("token"));
  o.access_key = "ASIATOKENKEY";
  o.secret_key = "tokensecret";
  o.session_token = "the-session-token";
  auto store = make_s3_object_store(o);
  round_trip(*store, "a");
  CHECK(server.stat("tokens") == server.stat("accepted"));
  CHECK(server.stat("accepted") >= 5);
  CHECK(server.stat("rejected") == 0);

  // The server really checks: another token, no token, another secret are refused.
  o.session_token = "another-token";
  const Error wrong_token = test::error_of([&] { make_s3_object_store(o)->put("b", bytes_of("x")); });
  CHECK(wrong_token.actual() == "HTTP 403 InvalidToken");
  o.session_token.clear();
  CHECK(test::error_of([&] { make_s3_object_store(o)->put("b", bytes_of("x")); }).actual() == "HTTP 403 AccessDenied");
  o.session_token = "the-session-token";
  o.secret_key = "not-the-secret";
  CHECK(test::error_of([&] { make_s3_object_store(o)->put("b", bytes_of("x")); }).actual() == "HTTP 403 SignatureDoesNotMatch");
  CHECK(server.stat("rejected") == 3);
}

TEST_CASE("a session token from the environment and from a profile's aws_session_token reaches the server signed") {
  SigV4Server server({"--static", "ASIAENVKEY:envsecret:env-token", "--static", "ASIAFILEKEY:filesecret:file-token"});
  {
    ScopedEnv env({{"AWS_ACCESS_KEY_ID", "ASIAENVKEY"}, {"AWS_SECRET_ACCESS_KEY", "envsecret"}, {"AWS_SESSION_TOKEN", "env-token"}});
    round_trip(*make_s3_object_store(server.options(test::unique_prefix("env"))), "e");
  }
  test::TempDir dir("ckpt-cred");
  write(dir / "credentials", "[default]\naws_access_key_id = WRONG\naws_secret_access_key = wrong\n\n[ci]\n"
                             "aws_access_key_id = ASIAFILEKEY\naws_secret_access_key = filesecret\naws_session_token = file-token\n");
  {
    ScopedEnv env({{"AWS_SHARED_CREDENTIALS_FILE", (dir / "credentials").string()}, {"AWS_PROFILE", "ci"}});
    round_trip(*make_s3_object_store(server.options(test::unique_prefix("file"))), "f");
  }
  CHECK(server.stat("rejected") == 0);
  CHECK(server.stat("tokens") >= 10);
}

TEST_CASE("container credentials are fetched with the authorization token and refreshed a margin before they expire, so no request is refused") {
  SigV4Server server({"--ttl", "2", "--auth", "container-auth-token"});
  test::TempDir dir("ckpt-cred");
  write(dir / "token", "container-auth-token\n");
  ScopedEnv env({{"AWS_CONTAINER_CREDENTIALS_FULL_URI", server.url() + "/_creds"},
                 {"AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", (dir / "token").string()},
                 {"AWS_CONTAINER_AUTHORIZATION_TOKEN", "a-token-the-file-overrides"}});
  S3Options o = server.options(test::unique_prefix("container"));
  o.credentials_refresh_margin = 1s;
  auto store = make_s3_object_store(o);
  // Credentials live 2 s; the server refuses any request signed with expired ones, so
  // without a refresh this fails after 2 s.
  int n = 0;
  for (const auto until = std::chrono::steady_clock::now() + 2500ms; std::chrono::steady_clock::now() < until; ++n) {
    store->put("k" + std::to_string(n), bytes_of("v"));
    CHECK(text_of(store->get("k" + std::to_string(n))) == "v");
    std::this_thread::sleep_for(50ms);
  }
  const auto st = server.stats();
  CHECK(st.at("rejected").as_int64() == 0);
  CHECK(st.at("issued").as_int64() >= 2);
  // Refreshed before they expired, not when they did: every request had most of the margin
  // left (refreshing only at expiry leaves under 100 ms: measured by breaking the cache).
  CHECK(st.at("min_remaining_ms").as_int64() >= 300);
  CHECK(st.at("tokens") == st.at("accepted"));
}

TEST_CASE("credential_process credentials are refreshed a margin before they expire, from threads at once, so no request is refused") {
  SigV4Server server({"--ttl", "2"});
  test::TempDir dir("ckpt-cred");
  write(dir / "config", "[profile proc]\ncredential_process = " + server.process_command() + "\n");
  ScopedEnv env({{"AWS_CONFIG_FILE", (dir / "config").string()}, {"AWS_PROFILE", "proc"}});
  S3Options o = server.options(test::unique_prefix("process"));
  o.credentials_refresh_margin = 1s;
  auto store = make_s3_object_store(o);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 3; ++t)
    threads.emplace_back([&, t] {
      for (const auto until = std::chrono::steady_clock::now() + 2500ms; std::chrono::steady_clock::now() < until;) {
        try {
          store->put("t" + std::to_string(t), bytes_of("v"));
        } catch (const Error& e) {
          ++failures;
          MESSAGE(e.what());
        }
        std::this_thread::sleep_for(30ms);
      }
    });
  for (auto& th : threads) th.join();
  CHECK(failures == 0);
  const auto st = server.stats();
  CHECK(st.at("rejected").as_int64() == 0);
  CHECK(st.at("issued").as_int64() >= 2);
  CHECK(st.at("min_remaining_ms").as_int64() >= 300);
}

TEST_CASE("a container endpoint answering garbage, refusing the token, unreachable or handing out expired credentials fails with io_error naming the URI") {
  SigV4Server server({"--ttl", "3", "--auth", "right-token"});
  SigV4Server expired({"--ttl", "-5"});
  const S3Options o = server.options("x");
  struct Case {
    std::string uri, token, actual;
  };
  for (const Case& c : {Case{server.url() + "/_garbage", "", "not JSON"}, Case{server.url() + "/_creds", "wrong-token", "HTTP 401"},
                        Case{"http://127.0.0.1:1/creds", "", "no response"}, Case{expired.url() + "/_creds", "", ""}}) {
    CAPTURE(c.uri);
    ScopedEnv env({{"AWS_CONTAINER_CREDENTIALS_FULL_URI", c.uri}, {"AWS_CONTAINER_AUTHORIZATION_TOKEN", c.token}});
    const Error e = test::error_of([&] { make_s3_object_store(o); });
    CHECK(e.code() == Errc::io_error);
    if (c.actual.empty()) {  // the expired ones: named by their source, the endpoint
      CHECK(e.file() == "the container credentials endpoint " + c.uri);
      CHECK(e.detail() == "handed out credentials that have already expired");
    } else {
      CHECK(e.file() == c.uri);
      CHECK(e.actual().starts_with(c.actual));
    }
  }
}

TEST_CASE("no secret key, session token or authorization token appears in errors, logs or the ckpt tool's output, --json included") {
  SigV4Server server({"--ttl", "30", "--auth", "HUSH-auth-token", "--static", "ASIASTATIC:HUSH-static-secret:HUSH-static-token"});
  test::TempDir dir("ckpt-cred");
  std::vector<std::string> secrets{"HUSH-auth-token", "HUSH-static-secret", "HUSH-static-token", "HUSH-wrong-token",
                                   "HUSH-process-secret", "HUSH-process-token", "HUSH-line-secret", "HUSH-printed"};
  const std::string creds = (dir / "credentials").string(), config = (dir / "config").string();
  write(creds,
        "[static]\naws_access_key_id = ASIASTATIC\naws_secret_access_key = HUSH-static-secret\naws_session_token = HUSH-static-token\n"
        "[wrongtoken]\naws_access_key_id = ASIASTATIC\naws_secret_access_key = HUSH-static-secret\naws_session_token = HUSH-wrong-token\n");
  write(dir / "malformed", "[default]\naws_access_key_id = ASIASTATIC\naws_secret_access_key: HUSH-line-secret\n");
  // Errors name a credential_process's command line, so the secrets are in the scripts it
  // runs, not on the line.
  write(dir / "badjson.sh", "echo '{\"Version\": 2, \"AccessKeyId\": \"A\", \"SecretAccessKey\": \"HUSH-process-secret\", "
                            "\"SessionToken\": \"HUSH-process-token\"}'\n");
  write(dir / "expired.sh", "echo '{\"Version\": 1, \"AccessKeyId\": \"A\", \"SecretAccessKey\": \"HUSH-process-secret\", "
                            "\"SessionToken\": \"HUSH-process-token\", \"Expiration\": \"2001-01-01T00:00:00Z\"}'\n");
  write(dir / "failing.sh", "echo HUSH-printed; exit 1\n");
  write(dir / "garbage.sh", "echo HUSH-printed\n");
  const std::string sh = "credential_process = sh " + dir.path().string() + "/";
  write(config, "[profile badjson]\n" + sh + "badjson.sh\n[profile expired]\n" + sh + "expired.sh\n[profile failing]\n" + sh +
                    "failing.sh\n[profile garbage]\n" + sh + "garbage.sh\n[profile container]\nregion = us-east-1\n");
  const std::map<std::string, std::string> files{{"AWS_SHARED_CREDENTIALS_FILE", creds}, {"AWS_CONFIG_FILE", config}};
  auto with = [&](std::map<std::string, std::string> more) {
    more.insert(files.begin(), files.end());
    return more;
  };
  const std::vector<std::map<std::string, std::string>> configurations{
      with({{"AWS_PROFILE", "static"}}),
      with({{"AWS_PROFILE", "wrongtoken"}}),
      with({{"AWS_PROFILE", "badjson"}}),
      with({{"AWS_PROFILE", "expired"}}),
      with({{"AWS_PROFILE", "failing"}}),
      with({{"AWS_PROFILE", "garbage"}}),
      {{"AWS_SHARED_CREDENTIALS_FILE", (dir / "malformed").string()}},
      with({{"AWS_PROFILE", "container"}, {"AWS_CONTAINER_CREDENTIALS_FULL_URI", server.url() + "/_creds"},
            {"AWS_CONTAINER_AUTHORIZATION_TOKEN", "HUSH-auth-token"}}),
      with({{"AWS_PROFILE", "container"}, {"AWS_CONTAINER_CREDENTIALS_FULL_URI", server.url() + "/_garbage"},
            {"AWS_CONTAINER_AUTHORIZATION_TOKEN", "HUSH-auth-token"}}),
      {{"AWS_CONTAINER_CREDENTIALS_FULL_URI", server.url() + "/_creds"}, {"AWS_CONTAINER_AUTHORIZATION_TOKEN", "HUSH-wrong-token"}},
  };
  std::string seen;  // everything printed, thrown or logged
  int errors = 0;
  const bool tool = std::filesystem::exists(kTool);
  if (!tool) MESSAGE("the ckpt tool is not built (CKPT_BUILD_APPS=OFF): checking the library's errors and logs only");
  for (auto vars : configurations) {
    vars["AWS_ENDPOINT_URL"] = server.url();
    vars["AWS_REGION"] = "us-east-1";
    ScopedEnv env(vars);
    {
      test::LogCapture log;
      try {
        auto store = open_s3({.root = "s3://bucket/grep", .retry = test::fast_retries(2)});
        round_trip(*store, "g");
      } catch (const Error& e) {
        ++errors;
        seen += std::string(e.what()) + "\n" + e.file() + e.detail() + e.expected() + e.actual() + "\n";
      }
      for (const auto& line : log.lines()) seen += line + "\n";
    }
    if (tool) {
      for (const char* args : {" ls --json s3://bucket/grep", " ls s3://bucket/grep", " verify --json s3://bucket/grep"}) {
        int status = 0;
        seen += test::run_command(kTool + args + " 2>&1", &status);
      }
    }
  }
  CHECK(errors == 8);  // all but the good profile and the good endpoint
  CHECK(server.stat("accepted") > 0);
  const auto issued = server.issued();
  CHECK(!issued.empty());
  secrets.insert(secrets.end(), issued.begin(), issued.end());
  for (const auto& s : secrets) {
    CAPTURE(s);
    CHECK(seen.find(s) == std::string::npos);
  }
  // What was seen does name the sources, so the grep looked at real messages.
  CHECK(seen.find("credential_process `sh " + dir.path().string() + "/badjson.sh`") != std::string::npos);
  CHECK(seen.find((dir / "malformed").string() + ": line 3") != std::string::npos);
  CHECK(seen.find("HTTP 403 InvalidToken") != std::string::npos);
}

TEST_CASE("a profile of a shared credentials file and keys from the environment save, list and load a checkpoint on the RGW through an s3 root") {
  auto rgw = test::rgw_env();
  const S3Options base = test::rgw_options(test::unique_prefix("profile"));
  test::TempDir dir("ckpt-cred");
  write(dir / "credentials", "[default]\naws_access_key_id = nobody\naws_secret_access_key = wrong\n\n[rgw]\naws_access_key_id = " +
                                 rgw["AWS_ACCESS_KEY_ID"] + "\naws_secret_access_key = " + rgw["AWS_SECRET_ACCESS_KEY"] + "\n");
  const std::map<std::string, std::string> common{{"AWS_ENDPOINT_URL", rgw["AWS_ENDPOINT_URL"]}, {"AWS_REGION", rgw["AWS_REGION"]}};
  test::TempDir local;
  const std::string root = (local / "root").string();
  {
    auto vars = common;
    vars["AWS_SHARED_CREDENTIALS_FILE"] = (dir / "credentials").string();
    vars["AWS_PROFILE"] = "rgw";
    ScopedEnv env(vars);
    auto store = make_s3_object_store({.root = base.root});
    for (std::uint64_t s : {10, 20}) {
      test::Fixture fx(2, s);
      save_checkpoint_sync(posix_file_system(), root, fx.request);
      commit_to_object_store(posix_file_system(), root, s, *store);
    }
    auto ckpts = open_store(base.root);
    CHECK(ckpts->steps() == std::vector<std::uint64_t>{10, 20});
    test::Fixture fx(2, 20);
    const auto f32 = ckpts->open(20).read_tensor("f32", 1, Verify::full);
    CHECK(f32.size() == fx.request.ranks[1].tensors[2].data.size());
    CHECK(std::equal(f32.begin(), f32.end(), fx.request.ranks[1].tensors[2].data.begin()));
    if (std::filesystem::exists(kTool)) {
      int status = 0;
      const std::string out = test::run_command(kTool + " ls --json " + base.root + " 2>&1", &status);
      INFO(out);
      CHECK(status == 0);
      CHECK(out.find("\"step\":20") != std::string::npos);
    }
  }
  {
    auto vars = common;
    vars["AWS_ACCESS_KEY_ID"] = rgw["AWS_ACCESS_KEY_ID"];
    vars["AWS_SECRET_ACCESS_KEY"] = rgw["AWS_SECRET_ACCESS_KEY"];
    ScopedEnv env(vars);
    open_store(base.root)->open(10).verify(Verify::full);
  }
  {  // the default profile's wrong keys are used when no profile is named: refused by the RGW
    auto vars = common;
    vars["AWS_SHARED_CREDENTIALS_FILE"] = (dir / "credentials").string();
    ScopedEnv env(vars);
    const Error e = test::error_of([&] { make_s3_object_store({.root = base.root})->head("latest"); });
    CHECK(e.actual().starts_with("HTTP 403"));
  }
}
