// SPDX-License-Identifier: Apache-2.0
// The CheckpointStore conformance suite (TensorStore's kvstore/test_util, for checkpoints): the
// same cases over every kind of store. A module instantiates it for its kinds with
//   TEST_CASE_TEMPLATE_INVOKE(store_conformance, KindA, KindB, ...);
// (tests/store: a directory and node sets with and without redundancy; tests/objstore: the
// object store on the real RGW). A Kind is default-constructible, owns a fresh empty root
// for its life, and provides:
//   static constexpr const char* name;       for messages
//   static constexpr int world;              ranks per checkpoint
//   static constexpr bool file_backed;       shard_dir() and the crash cleanup of temporaries
//   std::unique_ptr<CheckpointStore> open(); the store at its root (open_store), each call anew
//   void damage_manifest(std::uint64_t);     make that step's manifest undecodable everywhere
//   void leave_crashed_save(std::uint64_t);  (file_backed) what a writer killed mid-save leaves
//   void leave_crashed_removal(std::uint64_t); (file_backed) what a removal of a step killed
//                                            after its first rename leaves
//   bool holds_step_dir(std::uint64_t);      (file_backed) a directory of the step on any root
//   bool has_leftovers();                    (file_backed) anything of a save in progress left
#pragma once

#include <doctest/doctest.h>

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/core/error.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/store/copy.hpp"
#include "ckpt/store/store.hpp"
#include "io/io_fixture.hpp"

namespace ckpt::test {

/// A checkpoint of `world` ranks at `step`, saved in a scratch directory: what the cases put
/// into the store under test, shard by shard, through StepTarget::write_shard.
struct SourceCheckpoint {
  SavedCheckpoint saved;
  SourceCheckpoint(int world, std::uint64_t step) : saved(world, step) {}
  const Manifest& manifest() const { return saved.m; }
  std::vector<std::byte> shard_bytes(int rank) const {
    const auto b = read_all(saved.shard(rank));
    return std::vector<std::byte>(reinterpret_cast<const std::byte*>(b.data()), reinterpret_cast<const std::byte*>(b.data()) + b.size());
  }
};

/// Writes `src` into `target` (every shard, then the redundancy units the store asks for)
/// without committing.
inline void write_all_shards(StepTarget& target, const SourceCheckpoint& src) {
  FileSystem& fs = posix_file_system();
  const Manifest& m = src.manifest();
  std::vector<std::uint64_t> sizes;
  for (const auto& s : m.shards) {
    target.write_shard(s.rank, s.path, *fs.open_read(src.saved.shard(s.rank).string()));
    sizes.push_back(s.size);
  }
}

/// Writes and commits `src` as step src.manifest().step through `w`; returns what commit returned.
inline std::string put_checkpoint(StoreWriter& w, const SourceCheckpoint& src, const StepOptions& begin = {}) {
  FileSystem& fs = posix_file_system();
  const Manifest& m = src.manifest();
  auto target = w.begin(m.step, begin);
  write_all_shards(*target, src);
  std::vector<std::uint64_t> sizes;
  for (const auto& s : m.shards) sizes.push_back(s.size);
  std::vector<RedundancyBlock> blocks;
  for (std::size_t u = 0; u < target->redundancy_units(sizes); ++u)
    for (auto& b : target->write_redundancy_unit(
             sizes, u, [&](int rank, std::uint64_t at, std::span<std::byte> out) { fs.open_read(src.saved.shard(rank).string())->read_at(at, out); },
             m.chunk_size, {}))
      blocks.push_back(std::move(b));
  return target->commit(m, std::move(blocks));
}

inline std::vector<std::uint64_t> committed_steps(const std::vector<StoredCheckpoint>& list) {
  std::vector<std::uint64_t> out;
  for (const auto& c : list)
    if (c.step) out.push_back(*c.step);
  return out;
}

}  // namespace ckpt::test

TEST_CASE_TEMPLATE_DEFINE("store conformance: a committed checkpoint reads back as it was written, through every read", Kind, store_conformance) {
  using namespace ckpt;
  using namespace ckpt::test;
  Kind kind;
  CAPTURE(Kind::name);
  const SourceCheckpoint src(Kind::world, 10);
  auto store = kind.open();

  SUBCASE("an empty store has no latest, no steps, and a read of a step is not_found") {
    CHECK_FALSE(store->latest());
    CHECK(store->steps().empty());
    CHECK(expect_error([&] { store->manifest(10); }).code() == Errc::not_found);
    CHECK(expect_error([&] { store->open(10); }).code() == Errc::not_found);
    CHECK_FALSE(store->rotated_away(10));
  }

  SUBCASE("begin, write, commit: latest, steps, list, manifest, reader, shard and verify agree with what was written") {
    {
      auto w = store->writer();
      put_checkpoint(*w, src);
    }
    auto again = kind.open();  // a fresh open sees the same
    for (auto* s : {store.get(), again.get()}) {
      REQUIRE(s->latest() == std::optional<std::uint64_t>(10));
      CHECK(s->steps() == std::vector<std::uint64_t>{10});
      const auto list = s->list(Verify::full);
      REQUIRE(list.size() == 1);
      CHECK(list[0].name == "step-0000000010");
      CHECK(list[0].state == CheckpointState::complete);
      CHECK(list[0].is_latest);
      CHECK(list[0].world_size == Kind::world);
      std::uint64_t bytes = 0;
      for (const auto& sh : src.manifest().shards) bytes += sh.size;
      CHECK(list[0].bytes == bytes);
      const auto m = s->manifest(10);
      REQUIRE(m->shards.size() == src.manifest().shards.size());
      for (std::size_t i = 0; i < m->shards.size(); ++i) {
        CHECK(m->shards[i].sha256 == src.manifest().shards[i].sha256);
        CHECK(m->shards[i].chunk_xxh3 == src.manifest().shards[i].chunk_xxh3);
      }
      s->verify(10, Verify::full);
      const CheckpointReader reader = s->open(10, Kind::world);
      reader.verify(Verify::full);
      for (int r = 0; r < Kind::world; ++r) {
        const auto got = reader.read_tensor("f32", r, Verify::fast);
        const auto want = src.saved.saved(r, "f32");
        CHECK(std::equal(got.begin(), got.end(), want.begin(), want.end()));
        const auto file = s->shard(10, reader.manifest().shard(r));
        const auto expect = src.shard_bytes(r);
        REQUIRE(file->size() == expect.size());
        std::vector<std::byte> all(expect.size());
        file->read_at(0, all);
        CHECK(all == expect);
      }
      CHECK(expect_error([&] { s->open(10, Kind::world + 1); }).code() == Errc::world_size_mismatch);
    }
  }

  SUBCASE("copy_checkpoint brings a directory's checkpoint in and takes it out again, byte for byte, verified") {
    // In: the scratch directory's checkpoint into this store (a node set with a scheme
    // computes its redundancy from the shards on the way).
    const auto in = open_store(src.saved.root());
    CopyReport r;
    {
      auto w = store->writer();
      r = copy_checkpoint(*in, 10, *w, {.verify = Verify::full, .parallel_shards = 4});
    }
    std::uint64_t bytes = 0, chunks = 0;
    for (const auto& sh : src.manifest().shards) bytes += sh.size, chunks += sh.chunk_xxh3.size();
    CHECK(r.bytes == bytes);
    CHECK(r.chunks_verified == chunks);
    CHECK(r.sha256_verified);
    REQUIRE(store->latest() == std::optional<std::uint64_t>(10));
    store->verify(10, Verify::full);
    if (const auto h = store->health(10, Verify::full)) CHECK(h->healthy());
    // A checkpoint of one root committed as one: its manifest bytes are the source's.
    if (!store->manifest(10)->nodes) {
      const auto file = read_all(src.saved.ckpt_dir() / "manifest.json");
      CHECK(store->manifest_text(10) == std::string(file.begin(), file.end()));
    }
    // Out: into a fresh directory, with the copy record naming this store.
    const test::TempDir out;
    const auto dst = open_store((out / "copy").string());
    r = copy_checkpoint(*store, 10, *dst->writer(), {.verify = Verify::full, .piece_bytes = 1});
    CHECK(r.bytes == bytes);
    CHECK(r.chunks_verified == chunks);
    const StoredCheckpoint c = dst->describe(10);
    REQUIRE(c.copy);
    CHECK(c.copy->source_root == store->root());
    CHECK(c.copy->xxh3_chunks_verified == chunks);
    CHECK(c.copy->sha256_verified);
    CHECK_FALSE(c.manifest->nodes);
    CHECK(c.manifest->redundancy.empty());
    dst->verify(10, Verify::full);
    for (int rank = 0; rank < Kind::world; ++rank) {
      const auto file = dst->shard(10, c.manifest->shard(rank));
      std::vector<std::byte> all(file->size());
      file->read_at(0, all);
      CHECK(all == src.shard_bytes(rank));
    }
    // A step the destination holds already is refused there, and nothing changes.
    CHECK(expect_error([&] { copy_checkpoint(*store, 10, *dst->writer()); }).code() == Errc::invalid_argument);
    CHECK(dst->steps() == std::vector<std::uint64_t>{10});
  }

  SUBCASE("an aborted step, or one whose target is dropped, leaves no trace and latest where it was") {
    auto w = store->writer();
    put_checkpoint(*w, src);
    const SourceCheckpoint next(Kind::world, 11);
    {
      auto t = w->begin(11);
      write_all_shards(*t, next);
      t->abort();
      t->abort();  // idempotent
    }
    {
      auto t = w->begin(11);
      write_all_shards(*t, next);
    }  // dropped uncommitted
    CHECK(store->latest() == std::optional<std::uint64_t>(10));
    CHECK(store->steps() == std::vector<std::uint64_t>{10});
    const auto list = store->list();
    CHECK(committed_steps(list) == std::vector<std::uint64_t>{10});
    CHECK(list.size() == 1);  // no save in progress either
    if constexpr (Kind::file_backed) CHECK_FALSE(kind.has_leftovers());
    // The step can be written again after all.
    put_checkpoint(*w, next);
    CHECK(store->latest() == std::optional<std::uint64_t>(11));
  }

  SUBCASE("latest never moves back: a committed step and a step before latest are refused, naming the step") {
    auto w = store->writer();
    put_checkpoint(*w, src);
    const Error again = expect_error([&] { w->begin(10); });
    CHECK(again.code() == Errc::invalid_argument);
    CHECK(std::string(again.what()).find("10") != std::string::npos);
    const Error older = expect_error([&] { w->begin(9); });
    CHECK(older.code() == Errc::invalid_argument);
    CHECK(store->latest() == std::optional<std::uint64_t>(10));
    CHECK(store->steps() == std::vector<std::uint64_t>{10});
  }

  SUBCASE("rotation keeps the newest K, the committed one, latest's and the kept ones; remove refuses latest") {
    auto w = store->writer();
    std::vector<std::uint64_t> removed;
    for (std::uint64_t step = 1; step <= 5; ++step) {
      put_checkpoint(*w, SourceCheckpoint(Kind::world, step));
      for (auto s : w->rotate(2, step, [](std::uint64_t s) { return s == 1; })) removed.push_back(s);
    }
    CHECK(removed == std::vector<std::uint64_t>{2, 3});
    CHECK(store->steps() == std::vector<std::uint64_t>{1, 4, 5});
    CHECK(store->rotated_away(2));
    CHECK_FALSE(store->rotated_away(4));
    CHECK(w->rotate(0, 5).empty());  // keep_last 0 keeps everything
    const Error latest = expect_error([&] { w->remove(5); });
    CHECK(latest.code() == Errc::invalid_argument);
    CHECK(expect_error([&] { w->remove(3); }).code() == Errc::not_found);
    w->remove(1);
    CHECK(store->steps() == std::vector<std::uint64_t>{4, 5});
    CHECK(w->make_room(0).empty());
    CHECK(store->latest() == std::optional<std::uint64_t>(5));
    store->verify(5, Verify::full);
  }

  SUBCASE("a second writer is refused with busy while the first holds the store") {
    auto w = store->writer();
    auto other = kind.open();
    const Error busy = expect_error([&] { other->writer(); });
    CHECK(busy.code() == Errc::busy);
    put_checkpoint(*w, src);  // the first goes on
    w.reset();
    auto after = other->writer();  // and once it is gone, the second writes
    put_checkpoint(*after, SourceCheckpoint(Kind::world, 11));
    CHECK(store->latest() == std::optional<std::uint64_t>(11));
  }

  SUBCASE("a damaged manifest is listed as corrupt, with the error, and the other checkpoints still open") {
    {
      auto w = store->writer();
      put_checkpoint(*w, SourceCheckpoint(Kind::world, 9));
      put_checkpoint(*w, src);
    }
    kind.damage_manifest(9);
    const auto list = store->list();
    REQUIRE(list.size() == 2);
    CHECK(list[0].name == "step-0000000009");
    CHECK(list[0].state == CheckpointState::corrupt);
    CHECK_FALSE(list[0].error.empty());
    CHECK(list[1].state == CheckpointState::complete);
    CHECK(expect_error([&] { store->open(9); }).code() != Errc::not_found);
    store->open(10).verify(Verify::full);
  }

  SUBCASE("a listing racing commits and rotation never reports a checkpoint as damaged") {
    std::atomic<bool> done{false};
    std::atomic<int> listings{0};
    std::thread lister([&] {
      auto reader = kind.open();
      while (!done.load()) {
        try {
          for (const auto& c : reader->list()) {
            CAPTURE(c.name);
            CAPTURE(c.error);
            CHECK(c.state != CheckpointState::corrupt);
          }
          ++listings;
        } catch (const Error& e) {
          // Before the first commit the root may not be a checkpoint root yet.
          CHECK(e.code() == Errc::not_found);
        }
      }
    });
    {
      auto w = store->writer();
      for (std::uint64_t step = 1; step <= 12; ++step) {
        put_checkpoint(*w, SourceCheckpoint(Kind::world, step));
        w->rotate(1, step);
      }
    }
    while (listings.load() < 3) std::this_thread::yield();
    done = true;
    lister.join();
    CHECK(store->steps() == std::vector<std::uint64_t>{12});
  }

  if constexpr (Kind::file_backed) {
    SUBCASE("a save killed midway is cleaned up by the next writer, and the committed checkpoint is untouched") {
      {
        auto w = store->writer();
        put_checkpoint(*w, src);
      }
      kind.leave_crashed_save(11);
      CHECK(kind.has_leftovers());
      auto w = store->writer();
      CHECK_FALSE(w->cleaned_up().empty());
      CHECK_FALSE(kind.has_leftovers());
      CHECK(store->latest() == std::optional<std::uint64_t>(10));
      store->verify(10, Verify::full);
      put_checkpoint(*w, SourceCheckpoint(Kind::world, 11));
      CHECK(store->latest() == std::optional<std::uint64_t>(11));
    }
    SUBCASE("a removal killed midway is never listed as damage and the next writer finishes it, on every root of the store") {
      {
        auto w = store->writer();
        put_checkpoint(*w, src);
        put_checkpoint(*w, SourceCheckpoint(Kind::world, 12));
      }
      kind.leave_crashed_removal(10);
      CHECK(kind.has_leftovers());
      // The removal's temporary may be listed as work in progress (a temporary), never as a
      // checkpoint, damaged or not.
      for (const auto& info : store->list(Verify::fast)) {
        INFO(info.name << ": " << checkpoint_state_name(info.state) << " " << info.error);
        if (info.state == CheckpointState::in_progress) CHECK_FALSE(info.step.has_value());
        else CHECK((info.step == std::optional<std::uint64_t>(12) && info.state == CheckpointState::complete));
      }
      auto w = store->writer();
      CHECK_FALSE(w->cleaned_up().empty());
      CHECK_FALSE(kind.has_leftovers());
      CHECK_FALSE(kind.holds_step_dir(10));
      CHECK(store->steps() == std::vector<std::uint64_t>{12});
      store->verify(12, Verify::full);
    }
  }
}
