// SPDX-License-Identifier: Apache-2.0
// `ckpt get`: one tensor as a NumPy .npy file, read through the mapped shard.
#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "apps/ckpt_tool_fixture.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/read/reader.hpp"

using namespace ckpt;
namespace fs = std::filesystem;

namespace {
using test::Saved;

test::Run get(const std::string& args) { return test::ckpt_run("get " + args); }

// A Python with numpy: Debian's (python3-numpy, scripts/setup), else the first python3 on PATH.
std::string python_with_numpy() {
  for (const std::string py : {"/usr/bin/python3", "python3"}) {
    int status = 0;
    test::run_command(py + " -c 'import numpy' > /dev/null 2>&1", &status);
    if (status == 0) return py;
  }
  return {};
}

const char* descr_of(DType t) {
  switch (t) {
    case DType::F16: return "<f2";
    case DType::BF16: return "<u2";
    case DType::F32: return "<f4";
    case DType::F64: return "<f8";
    case DType::I32: return "<i4";
    case DType::I64: return "<i8";
    case DType::U8: return "|u1";
    default: return "?";
  }
}

std::string shape_tuple(const std::vector<std::uint64_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}
}  // namespace

TEST_CASE("ckpt get writes every dtype as a .npy file whose header and data are exactly the saved tensor, and numpy reads it back equal") {
  Saved s;
  test::TempDir out;
  const std::string py = python_with_numpy();
  std::string checks;  // one Python assertion per tensor, run at once
  for (const auto& t : s.fx.request.ranks[1].tensors) {
    CAPTURE(t.name);
    const std::string npy = (out / (t.name + ".npy")).string(), raw = (out / (t.name + ".bin")).string();
    const auto r = get(s.ckpt_dir().string() + " " + t.name + " --rank 1 --out " + npy);
    REQUIRE(r.status == 0);
    CHECK(r.out.find("wrote " + t.name + " (rank 1, ") == 0);
    const auto file = test::read_all(npy);
    // The preamble: magic, version 1.0, header length; the data starts at a multiple of 64.
    REQUIRE(file.size() >= 10);
    CHECK(std::memcmp(file.data(), "\x93NUMPY\x01\x00", 8) == 0);
    const std::size_t header_len = file[8] | (file[9] << 8);
    CHECK((10 + header_len) % 64 == 0);
    const std::string header(reinterpret_cast<const char*>(file.data()) + 10, header_len);
    CHECK(header.find("{'descr': '" + std::string(descr_of(t.dtype)) + "', 'fortran_order': False, 'shape': " + shape_tuple(t.shape) +
                      ", }") == 0);
    CHECK(header.back() == '\n');
    REQUIRE(file.size() == 10 + header_len + t.data.size());
    CHECK((t.data.empty() || std::memcmp(file.data() + 10 + header_len, t.data.data(), t.data.size()) == 0));
    test::write_all(raw, std::vector<std::uint8_t>(reinterpret_cast<const std::uint8_t*>(t.data.data()),
                                                   reinterpret_cast<const std::uint8_t*>(t.data.data()) + t.data.size()));
    checks += "a = numpy.load('" + npy + "'); assert a.dtype.str == '" + descr_of(t.dtype) + "', a.dtype.str; assert a.shape == " +
              shape_tuple(t.shape) + ", a.shape; assert a.tobytes() == open('" + raw + "', 'rb').read(); n += 1\n";
  }
  if (py.empty()) {
    MESSAGE("no Python with numpy (scripts/setup installs python3-numpy): the numpy read-back is skipped");
    return;
  }
  const std::string script = (out / "check.py").string();
  std::ofstream(script) << "import numpy\nn = 0\n" << checks << "print(n, 'ok')\n";
  int status = 0;
  const std::string said = test::run_command(py + " " + script + " 2>&1", &status);
  CHECK(status == 0);
  CHECK(said == std::to_string(s.fx.request.ranks[1].tensors.size()) + " ok\n");
}

TEST_CASE("ckpt get reads and checks only the chunks covering the tensor, the whole shard with --verify full, none without") {
  Saved s;
  test::TempDir out;
  const std::string npy = (out / "t.npy").string();
  const TensorRecord& u8 = *s.m.find_tensor("u8", 0);
  const std::uint64_t cs = s.m.chunk_size, size = s.m.shards[0].size;
  std::uint64_t chunks = 0, bytes = 0;
  for (std::uint64_t k = u8.begin / cs; k <= (u8.end - 1) / cs; ++k) ++chunks, bytes += std::min(cs, size - k * cs);
  REQUIRE(bytes < size);  // the check below would pass for a whole-file read otherwise
  auto json = [&](const std::string& verify) {
    const auto r = get(s.ckpt_dir().string() + " u8 --out " + npy + " --json --verify " + verify);
    REQUIRE(r.status == 0);
    return boost::json::parse(r.out).as_object();
  };
  auto v = json("fast");
  CHECK(v.at("rank").as_int64() == 0);  // no --rank: the lowest rank holding it
  CHECK(v.at("mapped").as_bool());
  CHECK(v.at("chunks_checked").as_int64() == static_cast<std::int64_t>(chunks));
  CHECK(v.at("bytes_checked").as_int64() == static_cast<std::int64_t>(bytes));
  CHECK(v.at("descr").as_string() == "|u1");
  v = json("full");
  CHECK(v.at("bytes_checked").as_int64() == static_cast<std::int64_t>(size));
  v = json("none");
  CHECK(v.at("bytes_checked").as_int64() == 0);
  const auto r = get(s.ckpt_dir().string() + " u8 --out " + npy);
  CHECK(r.out.find("verified: " + std::to_string(chunks) + " chunks") != std::string::npos);
}

TEST_CASE("ckpt get of a bf16 tensor writes its raw bits as '<u2' and says so") {
  Saved s;
  test::TempDir out;
  const auto r = get(s.ckpt_dir().string() + " bf16 --out " + (out / "b.npy").string());
  CHECK(r.status == 0);
  CHECK(r.out.find("as '<u2'") != std::string::npos);
  CHECK(r.out.find("note: numpy has no bfloat16: the raw bits are written as '<u2' (see ckpt get --help)") != std::string::npos);
}

TEST_CASE("ckpt get refuses a missing tensor, a rank out of range, an unwritable output and a corrupt chunk with exit 1 and the typed message") {
  Saved s;
  test::TempDir out;
  const std::string npy = (out / "t.npy").string();
  auto r = get(s.ckpt_dir().string() + " nope --rank 1 --out " + npy);
  CHECK(r.status == 1);
  CHECK(r.out == "ckpt get: not found: " + s.shard(1).string() +
                     ": no tensor 'nope' on rank 1: expected one of the 9 tensors of rank 1: f64, i64, f32, i32, empty, scalar, f16, "
                     "bf16, u8, actual 'nope'\n");
  r = get(s.ckpt_dir().string() + " nope --out " + npy);  // no rank holds it: rank 0's tensors are listed
  CHECK(r.status == 1);
  CHECK(r.out.find("no tensor 'nope' on rank 0: expected one of the 9 tensors of rank 0: ") != std::string::npos);
  r = get(s.ckpt_dir().string() + " f32 --rank 2 --out " + npy);
  CHECK(r.status == 1);
  CHECK(r.out == "ckpt get: invalid argument: " + s.ckpt_dir().string() + ": rank: expected 0..1, actual 2\n");
  r = get(s.ckpt_dir().string() + " f32 --out " + out.path().string() + "/no-such-dir/t.npy");
  CHECK(r.status == 1);
  CHECK(r.out == "ckpt get: I/O error: " + out.path().string() + "/no-such-dir/t.npy: open for writing failed: No such file or directory\n");
  r = get(s.ckpt_dir().string() + " f32 --out " + out.path().string());  // a directory
  CHECK(r.status == 1);
  CHECK(r.out.find("ckpt get: I/O error: " + out.path().string() + ": rename failed: ") == 0);
  r = get(s.ckpt_dir().string() + " f32 --rank -1 --out " + npy);
  CHECK(r.status == 2);
  r = get(s.ckpt_dir().string() + " f32");
  CHECK(r.status == 2);
  CHECK(r.out.find("--out is required") != std::string::npos);
  // A flipped byte in the tensor: checksum mismatch naming the shard and chunk, and no output.
  const TensorRecord& f32 = *s.m.find_tensor("f32", 1);
  auto bytes = test::read_all(s.shard(1));
  bytes.at(static_cast<std::size_t>(f32.begin + 7)) ^= 1;
  test::write_all(s.shard(1), bytes);
  r = get(s.ckpt_dir().string() + " f32 --rank 1 --out " + npy);
  CHECK(r.status == 1);
  CHECK(r.out.find("ckpt get: checksum mismatch: " + s.shard(1).string() + ": xxh3 of chunk " + std::to_string(f32.begin / s.m.chunk_size) + " of ") ==
        0);
  CHECK(test::names_in(out.path()).empty());
  // --json: the error as the one JSON object.
  r = get(s.ckpt_dir().string() + " f32 --rank 1 --json --out " + npy);
  CHECK(r.status == 1);
  CHECK(boost::json::parse(r.out.substr(0, r.out.find('\n'))).at("error").at("code").as_string() == "checksum_mismatch");
}

TEST_CASE("ckpt get refuses a tensor the manifest index calls I32 while its shard header says F32, with exit 1, the field named and no output") {
  // Without the header check, the float bits would be written out as an int32 array.
  Saved s;
  test::write_index_dtype(s.ckpt_dir(), s.m, "f32", 1, DType::I32);
  test::TempDir out;
  const std::string npy = (out / "t.npy").string();
  for (const char* verify : {"none", "fast", "full"}) {
    CAPTURE(verify);
    const auto r = get(s.ckpt_dir().string() + " f32 --rank 1 --verify " + verify + " --out " + npy);
    CHECK(r.status == 1);
    CHECK(r.out == "ckpt get: malformed shard: " + s.shard(1).string() +
                       ": tensor 'f32' disagrees with the manifest index in its dtype: expected I32, actual F32\n");
    CHECK(test::names_in(out.path()).empty());
  }
  // Rank 0's index is right: its f32 is written.
  const auto r = get(s.ckpt_dir().string() + " f32 --rank 0 --out " + npy);
  CHECK(r.status == 0);
  CHECK(test::names_in(out.path()) == std::vector<std::string>{"t.npy"});
}

TEST_CASE("ckpt get --out - writes the .npy to standard output, byte-equal to the file, and its report to stderr") {
  Saved s;
  test::TempDir out;
  const std::string file = (out / "f.npy").string(), piped = (out / "piped.npy").string(), report = (out / "report.txt").string();
  REQUIRE(get(s.ckpt_dir().string() + " f32 --out " + file).status == 0);
  int status = -1;
  test::run_command(test::kTool + " get " + s.ckpt_dir().string() + " f32 --out - > " + piped + " 2> " + report, &status);
  CHECK(status == 0);
  std::ifstream a(file, std::ios::binary), b(piped, std::ios::binary), r(report);
  const std::string fa((std::istreambuf_iterator<char>(a)), {}), fb((std::istreambuf_iterator<char>(b)), {}),
      said((std::istreambuf_iterator<char>(r)), {});
  CHECK(fa.size() > 128);
  CHECK(fa == fb);
  CHECK(said.find("wrote f32 (rank") != std::string::npos);
  CHECK(said.find(" to - as '<f4'") != std::string::npos);
  CHECK_FALSE(fs::exists("-"));
  // With --json the JSON would go where the tensor goes: a usage error, nothing written.
  const auto r2 = get(s.ckpt_dir().string() + " f32 --out - --json");
  CHECK(r2.status == 2);
  CHECK(r2.out.find("ckpt get: --out - writes the tensor to standard output, where --json would write too") != std::string::npos);
  CHECK(r2.out.find("\"code\":\"usage\"") != std::string::npos);
  CHECK(r2.out.find("\x93NUMPY") == std::string::npos);
}
