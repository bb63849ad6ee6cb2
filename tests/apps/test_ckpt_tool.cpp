// The ckpt command-line tool, run as a user would run it.
#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <filesystem>

#include "../io/io_fixture.hpp"
#include "ckpt/io/commit.hpp"
#include "ckpt/io/layout.hpp"

using namespace ckpt;
namespace fs = std::filesystem;

namespace {
const std::string kTool = std::string(CKPT_TEST_BINARY_DIR) + "/bin/ckpt";

struct Run {
  int status;
  std::string out;
};
Run ckpt_run(const std::string& args) {
  int status = 0;
  std::string out = test::run_command(kTool + " " + args + " 2>&1", &status);
  return {status, out};
}

struct Saved {
  test::TempDir dir;
  test::Fixture fx{2, 10};
  Manifest m;
  Saved() { m = save_checkpoint(posix_file_system(), dir.path().string(), fx.request); }
  fs::path ckpt() const { return dir / "step-0000000010"; }
  fs::path shard(int r) const { return ckpt() / m.shards[static_cast<std::size_t>(r)].path; }
};

void flip(const fs::path& p, std::size_t at) {
  auto b = test::read_all(p);
  b.at(at) ^= 1;
  test::write_all(p, b);
}
}  // namespace

TEST_CASE("ckpt verify accepts a checkpoint the library wrote, fast and full") {
  Saved s;
  auto r = ckpt_run("verify " + s.ckpt().string());
  CHECK(r.status == 0);
  CHECK(r.out.find("OK ") == 0);
  r = ckpt_run("verify --full " + s.dir.path().string());  // a root: verifies its latest
  CHECK(r.status == 0);
  CHECK(r.out.find("sha256") != std::string::npos);
}

TEST_CASE("ckpt verify rejects each corrupted variant with its typed error") {
  struct Case {
    const char* what;
    std::function<void(Saved&)> damage;
    const char* error;
  };
  const std::vector<Case> cases = {
      {"flipped data byte", [](Saved& s) { flip(s.shard(1), s.m.tensors.back().begin); }, "checksum mismatch"},
      {"flipped header byte", [](Saved& s) { flip(s.shard(0), 20); }, "checksum mismatch"},
      {"truncated shard", [](Saved& s) { fs::resize_file(s.shard(0), 4096); }, "size mismatch"},
      {"missing shard", [](Saved& s) { fs::remove(s.shard(1)); }, "missing shard"},
      {"missing manifest", [](Saved& s) { fs::remove(s.ckpt() / "manifest.json"); }, "not found"},
      {"garbage manifest", [](Saved& s) { test::write_all(s.ckpt() / "manifest.json", {'{', 'x'}); }, "malformed manifest"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.what);
    Saved s;
    c.damage(s);
    const auto r = ckpt_run("verify " + s.ckpt().string());
    CHECK(r.status == 1);
    CHECK(r.out.find(c.error) != std::string::npos);
    CHECK(r.out.find(s.ckpt().string()) != std::string::npos);  // names the file
  }
}

TEST_CASE("ckpt verify --full catches what only SHA-256 sees and reports JSON") {
  Saved s;
  flip(s.shard(0), s.m.tensors.back().begin);
  const auto r = ckpt_run("verify --full --json " + s.ckpt().string());
  CHECK(r.status == 1);
  const auto line = r.out.substr(0, r.out.find('\n'));
  const auto v = boost::json::parse(line).as_object();
  CHECK(v.at("ok").as_bool() == false);
  CHECK(v.at("error").at("code").as_string() == "checksum mismatch");
  CHECK(v.at("error").at("file").as_string() == s.shard(0).string());
}

TEST_CASE("ckpt ls shows each checkpoint's state and inspect shows the tensor table") {
  Saved s;
  fs::create_directory(s.dir / ".tmp-step-0000000011-1-0");
  auto r = ckpt_run("ls " + s.dir.path().string());
  CHECK(r.status == 0);
  CHECK(r.out.find("complete (latest)") != std::string::npos);
  CHECK(r.out.find("in progress") != std::string::npos);
  fs::resize_file(s.shard(0), 100);
  r = ckpt_run("ls --json " + s.dir.path().string());
  CHECK(r.status == 1);
  const auto v = boost::json::parse(r.out).as_object();
  CHECK(v.at("checkpoints").as_array().size() == 2);
  CHECK(v.at("checkpoints").as_array()[1].at("state").as_string() == "corrupt");
  Saved t;
  r = ckpt_run("inspect " + t.ckpt().string());
  CHECK(r.status == 0);
  CHECK(r.out.find("world size  2") != std::string::npos);
  CHECK(r.out.find("f32") != std::string::npos);
  CHECK(r.out.find("[33, 31]") != std::string::npos);
}

TEST_CASE("ckpt usage errors exit 2 and help exits 0") {
  CHECK(ckpt_run("").status == 2);
  CHECK(ckpt_run("frobnicate x").status == 2);
  CHECK(ckpt_run("verify").status == 2);
  CHECK(ckpt_run("ls --verify sometimes /tmp").status == 2);
  const auto r = ckpt_run("--help");
  CHECK(r.status == 0);
  CHECK(r.out.find("exit codes") != std::string::npos);
}
