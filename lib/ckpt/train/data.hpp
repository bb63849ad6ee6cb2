// SPDX-License-Identifier: Apache-2.0
// Training data for the demo: a deterministic synthetic corpus with structure a small model
// learns within a few steps, and a loader that splits one global sample order across ranks.
// The loader's whole state is one integer, so an exact resume only has to save position().
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace ckpt::train {

/// total_tokens tokens in [0, vocab), a function of (seed, total_tokens, vocab) only.
///
/// The tokens are a walk on a sparse random Markov chain: from each token only four successors
/// occur, with probabilities 1/2, 1/4, 3/20 and 1/10 (conditional entropy about 1.2 nats,
/// against ln(64) = 4.16 for uniform tokens), so a bigram-capable model can push the loss far
/// below ln(vocab). The most likely successors form one cycle through the whole vocabulary,
/// which keeps the chain irreducible: every token keeps occurring however long the corpus.
/// The chain is drawn before the walk, so a longer corpus extends a shorter one with the same
/// seed and vocab (its prefix is the shorter corpus).
/// Throws Errc::invalid_argument unless 1 <= vocab <= 2^20.
std::vector<std::int32_t> make_corpus(std::uint64_t seed, std::size_t total_tokens,
                                      int vocab = 64);

/// Batches of next-token samples for one rank of a world of `world` ranks.
///
/// The global sample order is fixed: global sample g is the corpus window starting at
/// sample_start(g) = (g * seq) mod (corpus.size() - seq); its tokens are corpus[s, s+seq) and
/// its targets corpus[s+1, s+seq+1), i.e. the tokens shifted by one. Consecutive samples tile
/// the corpus back to back and wrap around at its end.
///
/// One step consumes world*batch global samples: with p = position() at the start of the step,
/// rank r's row b is global sample p + b*world + r (interleaved: global row j of the step goes
/// to rank j % world as its row j / world). So the union over ranks of one step is exactly the
/// batch a single rank with batch*world would take for that step, and the data order depends
/// only on the global batch, not on how it is split.
///
/// position() counts GLOBAL samples consumed (steps * batch * world), the same number on every
/// rank. Saved with a checkpoint and passed to set_position() on a fresh loader, it reproduces
/// the same subsequent batches bit for bit; since it does not depend on the split, a run can
/// also resume at another world size with the same global batch and see the same data.
///
/// The loader keeps a view of the corpus: the corpus must outlive it.
class DataLoader {
 public:
  /// Throws Errc::invalid_argument unless seq > 0, batch > 0, world > 0, 0 <= rank < world and
  /// corpus.size() >= seq + 1 (at least one window with its shifted targets).
  DataLoader(std::span<const std::int32_t> corpus, int seq, int batch, int rank, int world);

  /// Fills tokens and targets ([batch, seq] row-major, batch*seq elements each; else
  /// Errc::invalid_argument) with this rank's rows of the current step, then advances
  /// position() by batch*world.
  void next_batch(std::span<std::int32_t> tokens, std::span<std::int32_t> targets);

  /// Global samples consumed so far by the whole world (see the class comment).
  std::uint64_t position() const noexcept { return position_; }
  /// Restores a saved position(); any value is accepted.
  void set_position(std::uint64_t global_samples) noexcept { position_ = global_samples; }

  /// Corpus offset of global sample g (the rule above).
  std::size_t sample_start(std::uint64_t global_sample) const noexcept;

  int seq() const noexcept { return seq_; }
  int batch() const noexcept { return batch_; }
  int rank() const noexcept { return rank_; }
  int world() const noexcept { return world_; }

 private:
  std::span<const std::int32_t> corpus_;
  int seq_, batch_, rank_, world_;
  std::uint64_t position_ = 0;
};

}  // namespace ckpt::train
