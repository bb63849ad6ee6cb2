// SPDX-License-Identifier: Apache-2.0
#include "ckpt/store/recovery.hpp"
#include "ckpt/store/store.hpp"
#include "ckpt/train/trainer.hpp"

#include <boost/json.hpp>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>

#include "ckpt/core/error.hpp"
#include "ckpt/core/random.hpp"
#include "ckpt/format/boost_json.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/read/load_into.hpp"
#include "ckpt/read/slice_load.hpp"
#include "ckpt/ops/reshard.hpp"
#include "ckpt/store/tiers.hpp"

namespace ckpt::train {

namespace json = boost::json;

json::object TrainConfig::to_json() const {
  return {{"vocab", model.vocab},       {"seq", model.seq},
          {"dim", model.dim},           {"heads", model.heads},
          {"layers", model.layers},     {"batch", model.batch},
          {"seed", seed},               {"corpus_tokens", corpus_tokens},
          {"precision", precision == Precision::f16 ? "f16" : "bf16"},
          {"lr", adam.lr},              {"beta1", adam.beta1},
          {"beta2", adam.beta2},        {"eps", adam.eps},
          {"weight_decay", adam.weight_decay}, {"grad_clip", adam.grad_clip},
          {"warmup_steps", warmup_steps}, {"total_steps", total_steps},
          {"token_noise", token_noise}, {"lr_multiplier", lr_multiplier},
          {"accumulate", accumulate},   {"tensor_parallel", tensor_parallel}};
}

namespace {
std::uint64_t rotl(std::uint64_t x, int k) noexcept { return (x << k) | (x >> (64 - k)); }

// TrainConfig::tensor_parallel, checked against the world and the model.
int checked_tensor_parallel(const TrainConfig& c, const dist::Communicator& comm) {
  const int t = c.tensor_parallel;
  if (t < 1 || comm.size() % t != 0 || c.model.heads % t != 0)
    throw Error(Errc::invalid_argument, {}, "tensor_parallel must divide the world size " +
                std::to_string(comm.size()) + " and the heads " + std::to_string(c.model.heads),
                "a common divisor", std::to_string(t));
  return t;
}

// "tensor 2 x data 2": how a world is split, as errors name it.
std::string layout_name(int tensor, int data) {
  return "tensor " + std::to_string(tensor) + " x data " + std::to_string(data);
}

template <class T>
std::vector<T> copy_tensor(const TensorView& t, const char* name, std::size_t expect) {
  if (t.data.size() != expect * sizeof(T))
    throw Error(Errc::invalid_argument, {}, std::string("tensor ") + name + " bytes", std::to_string(expect * sizeof(T)),
                std::to_string(t.data.size()));
  std::vector<T> out(expect);
  if (expect) std::memcpy(out.data(), t.data.data(), t.data.size());
  return out;
}
}  // namespace

Rng::Rng(std::uint64_t seed) noexcept {
  for (auto& w : s_) w = splitmix64(seed);
}

std::uint64_t Rng::next() noexcept {
  const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const std::uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

Trainer::Trainer(const TrainConfig& config, dist::Communicator& comm)
    : cfg_(config),
      comm_(comm),
      corpus_((config.model.validate(), checked_tensor_parallel(config, comm), make_corpus(config.seed, config.corpus_tokens, config.model.vocab))),
      loader_(corpus_, config.model.seq, config.model.batch,
              comm.rank() / config.tensor_parallel, comm.size() / config.tensor_parallel),
      opt_(train::num_params(config.model), comm, config.precision, config.adam,
           LrSchedule{config.adam.lr * config.lr_multiplier, config.warmup_steps, config.total_steps, 0.1f}),
      ws_(config.model, config.tensor_parallel),
      rng_(config.seed * 0x100000001b3ull + static_cast<std::uint64_t>(comm.rank() / config.tensor_parallel) + 1),
      params32_(train::num_params(config.model)),
      grads32_(params32_.size()),
      tokens_(static_cast<std::size_t>(config.model.batch * config.model.seq)),
      targets_(tokens_.size()),
      layout_(param_layout(config.model)),
      tp_size_(config.tensor_parallel) {
  if (cfg_.accumulate < 1)
    throw Error(Errc::invalid_argument, {}, "TrainConfig.accumulate (micro-batches per step)", ">= 1", std::to_string(cfg_.accumulate));
  if (tp_size_ > 1) {
    tp_comm_ = comm.split(data_parallel_rank(), comm.rank() % tp_size_);
    tp_ = TensorParallel{tp_comm_->rank(), tp_comm_->size(),
                         [c = tp_comm_.get()](std::span<float> s) { c->all_reduce(s, dist::ReduceOp::sum); }};
  }
  if (comm.rank() == 0) init_params(cfg_.model, cfg_.seed, params32_);
  opt_.init_from(params32_);  // DDP: rank 0's initial parameters, broadcast once
  opt_.params_to_f32(params32_);
}

void Trainer::next_input() {
  loader_.next_batch(tokens_, targets_);
  if (cfg_.token_noise > 0)
    for (auto& tok : tokens_)
      if (rng_.uniform() < cfg_.token_noise) tok = static_cast<std::int32_t>(rng_.next() % static_cast<std::uint64_t>(cfg_.model.vocab));
}

StepStats Trainer::step() {
  const auto t0 = std::chrono::steady_clock::now();
  if (skip_steps_.contains(step_ + 1))
    for (int i = 0; i < cfg_.accumulate; ++i) next_input();  // the skipped batch: consumed, not trained on
  // The mean over k micro-batches: 1/k is folded into the loss scale, so the gradients are
  // scaled once, inside backward, and the sum over micro-batches is the mean gradient. With
  // k a power of two (and the power-of-two loss scale) the folded scale is exact; otherwise
  // it carries one rounding, the same for every element.
  const int k = cfg_.accumulate;
  const float scale = opt_.loss_scale() / static_cast<float>(k);
  std::fill(grads32_.begin(), grads32_.end(), 0.0f);
  float loss = 0.0f;
  for (int i = 0; i < k; ++i) {
    next_input();
    // With tensor parallelism both calls are collective over the group, and every rank of it
    // ends with the same loss and the whole gradient, so the ZeRO-1 mean over all ranks is the
    // mean over the data-parallel replicas.
    loss += gpt_forward(cfg_.model, params32_, tokens_, targets_, ws_, tp_);
    gpt_backward(cfg_.model, params32_, tokens_, targets_, ws_, grads32_, scale, tp_);
  }
  loss /= static_cast<float>(k);  // k = 1: exact, the loss of the one batch
  float lr_multiplier = 1.0f;
  if (lr_once_ && lr_once_->first == step_ + 1) {
    lr_multiplier = lr_once_->second;
    lr_once_.reset();
  }
  const auto t_fence = std::chrono::steady_clock::now();
  wait_for_staging();  // the saved state changes from here on
  const double fence_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_fence).count();
  const StepReport rep = opt_.step(grads32_, lr_multiplier);
  opt_.params_to_f32(params32_);
  comm_.all_reduce(std::span<float>(&loss, 1), dist::ReduceOp::mean);
  double sq = 0;
  for (float p : params32_) sq += static_cast<double>(p) * p;
  ++step_;
  StepStats s;
  s.step = step_;
  s.loss = loss;
  s.grad_norm = rep.grad_norm;
  s.param_norm = std::sqrt(sq);
  s.lr = rep.lr;
  s.loss_scale = rep.loss_scale;
  s.skipped = rep.skipped;
  s.step_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  s.fence_ms = fence_ms;
  wall_seconds_ += s.step_ms / 1000.0;
  return s;
}

void Trainer::set_lr_multiplier_once(std::uint64_t step, float x) { lr_once_ = std::pair{step, x}; }

void Trainer::skip_batch_of_step(std::uint64_t step) {
  if (step == 0) throw Error(Errc::invalid_argument, {}, "skip_batch_of_step: step (1-based)", ">= 1", "0");
  skip_steps_.insert(step);
}

MemoryProfile Trainer::memory() const noexcept {
  MemoryProfile m;
  m.params = opt_.param_bytes();
  m.grads = opt_.grad_bytes();
  m.params32 = params32_.capacity() * sizeof(float);
  m.grads32 = grads32_.capacity() * sizeof(float);
  m.optimizer = opt_.optimizer_bytes();
  m.activations = ws_.bytes();
  m.expected_optimizer = 12 * opt_.padded_numel() / static_cast<std::uint64_t>(comm_.size());
  return m;
}

std::vector<float> Trainer::parameters() const { return params32_; }

std::vector<TensorView> Trainer::checkpoint_tensors() const {
  const std::uint64_t n = opt_.shard().numel;
  // The flat ZeRO tensors are 1-D slices of 1-D global tensors of the padded flat size, of
  // the same names (docs/format.md, "Sharded tensors"); training.param_layout still says
  // where each model tensor lives in them.
  const auto flat = [&](const char* name) {
    return slice_of(name, {opt_.padded_numel()}, {opt_.shard().offset}, {n});
  };
  std::vector<TensorView> out{{"optim.master", DType::F32, {n}, std::as_bytes(opt_.master()), flat("optim.master")},
                              {"optim.m", DType::F32, {n}, std::as_bytes(opt_.adam_m()), flat("optim.m")},
                              {"optim.v", DType::F32, {n}, std::as_bytes(opt_.adam_v()), flat("optim.v")}};
  if (comm_.rank() == 0) {
    const auto p16 = opt_.params16();
    for (const auto& t : layout_) {
      std::vector<std::uint64_t> shape(t.shape.begin(), t.shape.end());
      out.push_back({"model." + t.name, opt_.dtype16(), std::move(shape), std::as_bytes(p16.subspan(t.offset, t.numel)), std::nullopt});
    }
  }
  return out;
}

SaveInfo Trainer::checkpoint_info() const {
  SaveInfo info;
  info.param_shard_offset = opt_.shard().offset;
  info.param_shard_numel = opt_.shard().numel;
  info.param_numel = opt_.padded_numel();
  info.wall_clock_seconds = wall_seconds_;
  const auto s = rng_.state();
  json_of(info.metadata) = json::object{{"data_position", loader_.position()}, {"rng", json::array{s[0], s[1], s[2], s[3]}}};
  const auto& sc = opt_.scaler();
  json_of(info.training) = json::object{{"step", step_},
                   {"adam_step", opt_.adam_step()},
                   {"loss_scaler", {{"scale", sc.scale}, {"good_steps", sc.good_steps}, {"growth_interval", sc.growth_interval}}},
                   {"lr_schedule",
                    {{"kind", "warmup+cosine"},
                     {"base_lr", opt_.schedule().base_lr},
                     {"warmup_steps", opt_.schedule().warmup_steps},
                     {"total_steps", opt_.schedule().total_steps},
                     {"min_ratio", opt_.schedule().min_ratio}}},
                   {"num_params", opt_.num_params()},
                   {"config", cfg_.to_json()}};
  json::array skips;
  for (auto st : skip_steps_) skips.emplace_back(st);
  json_of(info.training)["skip_batches"] = std::move(skips);
  // What resharding and consolidation need to read the checkpoint without this code: which
  // tensors slice the flat space, where each model tensor lives in it, and which per-rank
  // metadata means something only for its rank.
  json::array layout;
  for (const auto& t : layout_) {
    json::array shape;
    for (auto d : t.shape) shape.emplace_back(d);
    layout.push_back(json::object{{"name", t.name}, {"shape", std::move(shape)}, {"offset", t.offset}, {"numel", t.numel}});
  }
  json_of(info.training)["flat_tensors"] = json::array{"optim.master", "optim.m", "optim.v"};
  json_of(info.training)["param_layout"] = std::move(layout);
  json_of(info.training)["rank_local_metadata"] = json::array{"rng"};
  json_of(info.training)["parallel"] = {{"tensor", tp_size_}, {"data", comm_.size() / tp_size_}, {"tp_split", "attention heads"}};
  return info;
}

struct Trainer::LoadedState {
  std::vector<float> master, m, v;  // empty when in_place
  bool in_place = false;            // the optimizer's own buffers already hold master, m and v
  std::uint64_t step = 0, adam_step = 0, data_position = 0;
  LossScaler scaler;
  std::array<std::uint64_t, 4> rng{};
  double wall_seconds = 0;
  std::set<std::uint64_t> skip_steps;
};

namespace {
// The global state every rank takes from the manifest's training object, whatever the world
// size. `replica` is the rank's data-parallel index (its rank without tensor parallelism): it
// names the stream of a rank the checkpoint has no RNG state for. A key that is missing or of
// the wrong type is Errc::malformed_manifest naming `where`, never Boost.JSON's own exception.
void load_global_state_unchecked(const json::object& tr, const json::object& rank_metadata, std::uint64_t seed, int replica,
                                 std::uint64_t& step, std::uint64_t& adam_step, LossScaler& scaler, std::uint64_t& data_position,
                                 std::array<std::uint64_t, 4>& rng, std::set<std::uint64_t>& skip_steps) {
  const json::object& sc = tr.at("loss_scaler").as_object();
  scaler.scale = static_cast<float>(sc.at("scale").to_number<double>());
  scaler.good_steps = json::value_to<std::uint32_t>(sc.at("good_steps"));
  scaler.growth_interval = json::value_to<std::uint32_t>(sc.at("growth_interval"));
  adam_step = json::value_to<std::uint64_t>(tr.at("adam_step"));
  step = json::value_to<std::uint64_t>(tr.at("step"));
  data_position = json::value_to<std::uint64_t>(rank_metadata.at("data_position"));
  skip_steps.clear();
  if (const auto* sk = tr.if_contains("skip_batches"))  // absent in checkpoints older than the key
    for (const auto& v : sk->as_array()) skip_steps.insert(json::value_to<std::uint64_t>(v));
  if (const auto* r = rank_metadata.if_contains("rng")) {
    const auto& a = r->as_array();
    rng = {json::value_to<std::uint64_t>(a.at(0)), json::value_to<std::uint64_t>(a.at(1)), json::value_to<std::uint64_t>(a.at(2)),
           json::value_to<std::uint64_t>(a.at(3))};
  } else {
    // A rank the checkpoint has no stream for (it was resharded to more ranks).
    rng = Rng(rank_rng_seed(seed, replica, step)).state();
  }
}

void load_global_state(const std::string& where, const json::object& tr, const json::object& rank_metadata, std::uint64_t seed,
                       int replica, std::uint64_t& step, std::uint64_t& adam_step, LossScaler& scaler, std::uint64_t& data_position,
                       std::array<std::uint64_t, 4>& rng, std::set<std::uint64_t>& skip_steps) {
  try {
    load_global_state_unchecked(tr, rank_metadata, seed, replica, step, adam_step, scaler, data_position, rng, skip_steps);
  } catch (const std::exception& e) {
    throw Error(Errc::malformed_manifest, where, std::string("training state (loss_scaler, adam_step, step, data_position, rng): ") + e.what());
  }
}
}  // namespace

std::uint64_t rank_rng_seed(std::uint64_t seed, int rank, std::uint64_t step) noexcept {
  std::uint64_t x = seed ^ 0x5265736861726421ull;  // "Reshard!": apart from the initial streams' seeds
  x = splitmix64(x) ^ static_cast<std::uint64_t>(rank);
  x = splitmix64(x) ^ step;
  return splitmix64(x);
}

void Trainer::check_parallel(const json::object& training, const std::string& where, int world_size) const {
  // Checked before the configuration (which holds tensor_parallel too) so that this
  // difference is named as what it is.
  int tensor = 1;  // checkpoints from before tensor parallelism record nothing
  if (const auto* p = training.if_contains("parallel"); p && p->is_object())
    if (const auto* t = p->as_object().if_contains("tensor"); t && t->is_int64()) tensor = static_cast<int>(t->as_int64());
  if (tensor == tp_size_) return;
  const int data = tensor > 0 ? world_size / tensor : 0;
  throw Error(Errc::invalid_argument, where,
              "tensor-parallel layout differs: the checkpoint's attention heads are split over another number of ranks",
              layout_name(tp_size_, comm_.size() / tp_size_), layout_name(tensor, data));
}

void Trainer::check_config(const json::object& training, const std::string& where) const {
  const auto* cfg = training.if_contains("config");
  const json::value mine = cfg_.to_json();
  json::value theirs = cfg ? *cfg : json::value();
  // Checkpoints written before gradient accumulation or tensor parallelism existed trained one
  // batch per step on whole heads.
  if (theirs.is_object())
    for (const char* key : {"accumulate", "tensor_parallel"})
      if (!theirs.as_object().contains(key)) theirs.as_object()[key] = 1;
  if (!cfg || theirs != mine)
    throw Error(Errc::invalid_argument, where, "training configuration differs", json::serialize(mine),
                cfg ? json::serialize(*cfg) : "none");
}

void Trainer::check_shard_range(const std::string& where, std::uint64_t offset, std::uint64_t numel) const {
  if (offset != opt_.shard().offset || numel != opt_.shard().numel)
    throw Error(Errc::invalid_argument, where, "rank " + std::to_string(comm_.rank()) + " shard range",
                std::to_string(opt_.shard().offset) + "+" + std::to_string(opt_.shard().numel),
                std::to_string(offset) + "+" + std::to_string(numel));
}

void Trainer::check_restorable(const Manifest& manifest, const std::string& where) const {
  check_parallel(json_of(manifest.training), where, manifest.world_size);
  if (manifest.world_size != comm_.size())
    throw Error(Errc::world_size_mismatch, where, "world size", std::to_string(comm_.size()), std::to_string(manifest.world_size));
  check_config(json_of(manifest.training), where);
}

Trainer::LoadedState Trainer::load_state(const LoadedShard& shard, const Manifest& manifest) const {
  // The manifest beside the shard the rank loaded (of several roots, tiers or copies, the one refused).
  const std::string where = join_path(std::filesystem::path(shard.path()).parent_path().string(), kManifestName);
  check_restorable(manifest, where);
  check_shard_range(where, shard.record.param_shard_offset, shard.record.param_shard_numel);
  LoadedState st;
  const std::size_t n = opt_.shard().numel;
  st.master = copy_tensor<float>(shard.tensor("optim.master"), "optim.master", n);
  st.m = copy_tensor<float>(shard.tensor("optim.m"), "optim.m", n);
  st.v = copy_tensor<float>(shard.tensor("optim.v"), "optim.v", n);
  load_global_state(where, json_of(manifest.training), json_of(shard.record.metadata), cfg_.seed, data_parallel_rank(), st.step, st.adam_step, st.scaler,
                    st.data_position, st.rng, st.skip_steps);
  st.wall_seconds = manifest.wall_clock_seconds;
  return st;
}

Trainer::LoadedState Trainer::load_state_into(const CheckpointReader& checkpoint, Verify verify) {
  const Manifest& manifest = checkpoint.manifest();
  const std::string where = checkpoint.manifest_path();
  check_restorable(manifest, where);
  const ShardRecord& record = manifest.rank_record(comm_.rank());
  check_shard_range(where, record.param_shard_offset, record.param_shard_numel);
  // Everything that can be refused is, before a byte lands in the optimizer's buffers.
  LoadedState st;
  load_global_state(where, json_of(manifest.training), json_of(record.metadata), cfg_.seed, data_parallel_rank(), st.step, st.adam_step, st.scaler,
                    st.data_position, st.rng, st.skip_steps);
  st.wall_seconds = manifest.wall_clock_seconds;
  const std::uint64_t n = opt_.shard().numel;
  const LoadTarget targets[] = {{"optim.master", std::as_writable_bytes(opt_.master()), DType::F32, {n}, 0, std::nullopt},
                                {"optim.m", std::as_writable_bytes(opt_.adam_m()), DType::F32, {n}, 0, std::nullopt},
                                {"optim.v", std::as_writable_bytes(opt_.adam_v()), DType::F32, {n}, 0, std::nullopt}};
  load_into(checkpoint, comm_.rank(), targets, verify);
  st.in_place = true;
  return st;
}

Trainer::LoadedState Trainer::load_state_resharded(const CheckpointReader& checkpoint, Verify verify) {
  const Manifest& manifest = checkpoint.manifest();
  const std::string where = checkpoint.manifest_path();
  check_parallel(json_of(manifest.training), where, manifest.world_size);
  check_config(json_of(manifest.training), where);
  const int world = comm_.size(), rank = comm_.rank();
  // The ranks share the whole-file checks: rank r checks source shards r, r + M, ...; the
  // agreement before restoring makes one rank's failure every rank's.
  verify_headers(checkpoint, verify, rank, world);
  // The flat tensors as the checkpoint's global tensors (1-D slices of the flat space, the
  // descriptions of schema 2 or training.flat_tensors of schema 1), planned by load_slices.
  const auto globals = global_tensors(manifest, where);
  const dist::ShardRange slice = opt_.shard();
  if (slice != flat_slice(opt_.num_params(), world, rank))
    throw Error(Errc::invalid_argument, where, "ZeRO shard of rank " + std::to_string(rank) + " against the reshard rule",
                std::to_string(flat_slice(opt_.num_params(), world, rank).offset), std::to_string(slice.offset));
  for (const char* name : {"optim.master", "optim.m", "optim.v"}) {
    const auto g = std::find_if(globals.begin(), globals.end(), [&](const GlobalTensor& x) { return x.name == name; });
    if (g == globals.end() || g->shape.size() != 1 || g->shape[0] < opt_.num_params())
      throw Error(Errc::malformed_manifest, where, std::string("flat tensor ") + name,
                  "1-D slices of at least " + std::to_string(opt_.num_params()) + " elements", g == globals.end() ? "absent" : format_index(g->shape));
    if (g->dtype != DType::F32)
      throw Error(Errc::invalid_argument, where, std::string("dtype of ") + name, "F32", std::string(dtype_name(g->dtype)));
  }
  LoadedState st;
  // Rank-local metadata (the RNG) continues source rank r's if it exists; the data position
  // is global, the same on every source rank.
  json::object meta = json_of(manifest.rank_record(0).metadata);
  meta.erase("rng");
  if (rank < manifest.world_size)
    if (const auto* r = json_of(manifest.rank_record(rank).metadata).if_contains("rng")) meta["rng"] = *r;
  load_global_state(where, json_of(manifest.training), meta, cfg_.seed, data_parallel_rank(), st.step, st.adam_step, st.scaler, st.data_position,
                    st.rng, st.skip_steps);
  st.wall_seconds = manifest.wall_clock_seconds;
  // The slice's pieces of the source shards go straight into the optimizer's buffers, every
  // source file read at once; the SHA-256s were shared out above, so the ranges are checked
  // chunk by chunk (fast).
  // Elements at or past num_params are padding: zero, never read.
  const std::uint64_t real = slice.offset >= opt_.num_params() ? 0 : std::min(slice.numel, opt_.num_params() - slice.offset);
  std::vector<SliceTarget> targets;
  for (auto [name, buf] : {std::pair{"optim.master", opt_.master()}, std::pair{"optim.m", opt_.adam_m()}, std::pair{"optim.v", opt_.adam_v()}}) {
    targets.push_back({name, DType::F32, {slice.offset}, {real}, std::as_writable_bytes(buf.first(static_cast<std::size_t>(real)))});
    std::fill(buf.begin() + static_cast<std::ptrdiff_t>(real), buf.end(), 0.0f);
  }
  if (real > 0) load_slices(checkpoint, globals, targets, verify == Verify::none ? Verify::none : Verify::fast);
  st.in_place = true;
  return st;
}

void Trainer::apply_state(const LoadedState& st) {
  wait_for_staging();  // (resume_from has waited before an in-place load already)
  if (st.in_place) opt_.restore(opt_.master(), opt_.adam_m(), opt_.adam_v(), st.adam_step, st.scaler);
  else opt_.restore(st.master, st.m, st.v, st.adam_step, st.scaler);
  opt_.params_to_f32(params32_);
  step_ = st.step;
  loader_.set_position(st.data_position);
  rng_.set_state(st.rng);
  wall_seconds_ = st.wall_seconds;
  skip_steps_ = st.skip_steps;
}

void Trainer::restore(const LoadedShard& shard, const Manifest& manifest) { apply_state(load_state(shard, manifest)); }

Trainer::LoadedState Trainer::load_state(const StagedSnapshot& snapshot) const {
  const std::string where = "staged snapshot of step " + std::to_string(snapshot.step);
  check_config(json_of(snapshot.info.training), where);
  check_shard_range(where, snapshot.info.param_shard_offset, snapshot.info.param_shard_numel);
  const auto tensor = [&](const char* name) -> const TensorView& {
    for (const auto& t : snapshot.tensors)
      if (t.name == name) return t;
    throw Error(Errc::invalid_argument, where, std::string("tensor ") + name, "present", "missing");
  };
  LoadedState st;
  const std::size_t n = opt_.shard().numel;
  st.master = copy_tensor<float>(tensor("optim.master"), "optim.master", n);
  st.m = copy_tensor<float>(tensor("optim.m"), "optim.m", n);
  st.v = copy_tensor<float>(tensor("optim.v"), "optim.v", n);
  load_global_state(where, json_of(snapshot.info.training), json_of(snapshot.info.metadata), cfg_.seed, data_parallel_rank(), st.step, st.adam_step, st.scaler,
                    st.data_position, st.rng, st.skip_steps);
  st.wall_seconds = snapshot.info.wall_clock_seconds;
  return st;
}

void Trainer::restore(const StagedSnapshot& snapshot) { apply_state(load_state(snapshot)); }

RollbackResult Trainer::rollback(Checkpointer& checkpointer, std::uint64_t tripped_step, Verify verify, RollbackFrom from) {
  // A save in flight commits (or fails) first: if it commits, it is the last good checkpoint.
  // Every rank saved it already (the steps since were collective), so this cannot wait forever.
  checkpointer.wait_all();
  std::optional<StagedSnapshot> snapshot;
  if (from == RollbackFrom::memory_or_disk) snapshot = checkpointer.staged(comm_.rank());
  // Memory only if every rank holds the same committed step; else every rank reads the disk.
  const std::uint64_t mine = snapshot ? snapshot->step + 1 : 0;  // 0: no snapshot
  bool same = mine != 0;
  for (const auto& theirs : comm_.all_gather_bytes(std::as_bytes(std::span(&mine, 1))))
    same = same && theirs.size() == sizeof mine && std::memcmp(theirs.data(), &mine, sizeof mine) == 0;
  const auto marks = skip_steps_;  // decisions of earlier rollbacks outlive the restore
  RollbackResult result;
  if (same) {
    restore(*snapshot);
    result.step = snapshot->step;
    result.from_memory = true;
  } else {
    result.step = resume_latest(checkpointer.options().root, verify);
  }
  skip_steps_.insert(marks.begin(), marks.end());
  if (tripped_step <= result.step)
    throw Error(Errc::invalid_argument, checkpointer.options().root,
                "rollback: the last checkpoint is not older than the tripped step (save only after the guard's verdict)",
                "< " + std::to_string(tripped_step), std::to_string(result.step));
  skip_steps_.insert(tripped_step);
  result.skipped_step = tripped_step;
  return result;
}

// ---- SpikeGuard ---------------------------------------------------------------------------

const char* trip_name(Trip t) noexcept {
  switch (t) {
    case Trip::none: return "none";
    case Trip::non_finite_loss: return "non-finite loss";
    case Trip::non_finite_grad: return "non-finite gradient";
    case Trip::loss_spike: return "loss spike";
  }
  return "?";
}

SpikeGuard::SpikeGuard(SpikeGuardConfig config) : cfg_(config) {
  if (!(cfg_.factor > 1.0)) throw Error(Errc::invalid_argument, {}, "SpikeGuardConfig.factor", "> 1", std::to_string(cfg_.factor));
  if (cfg_.window < 1) throw Error(Errc::invalid_argument, {}, "SpikeGuardConfig.window", ">= 1", "0");
  if (cfg_.min_history < 1 || cfg_.min_history > cfg_.window)
    throw Error(Errc::invalid_argument, {}, "SpikeGuardConfig.min_history", "1.." + std::to_string(cfg_.window),
                std::to_string(cfg_.min_history));
}

double SpikeGuard::recent_mean() const noexcept {
  const std::size_t n = std::min(cfg_.window, history_.size());
  if (n == 0) return std::numeric_limits<double>::quiet_NaN();
  double sum = 0;
  for (std::size_t i = history_.size() - n; i < history_.size(); ++i) sum += history_[i].second;
  return sum / static_cast<double>(n);
}

Trip SpikeGuard::check(const StepStats& s) {
  if (!std::isfinite(s.loss)) return Trip::non_finite_loss;
  if (!std::isfinite(s.grad_norm) && !(s.skipped && s.loss_scale > 1.0f)) return Trip::non_finite_grad;
  if (history_.size() >= cfg_.min_history && static_cast<double>(s.loss) > cfg_.factor * recent_mean()) return Trip::loss_spike;
  history_.emplace_back(s.step, s.loss);
  while (history_.size() > cfg_.window + kRewindSlack) history_.pop_front();
  return Trip::none;
}

void SpikeGuard::rewind_to(std::uint64_t step) {
  while (!history_.empty() && history_.back().first > step) history_.pop_back();
}

SaveHandle start_save(Checkpointer& checkpointer, Trainer& trainer, std::optional<Staging> staging) {
  const auto tensors = trainer.checkpoint_tensors();
  SaveHandle h = checkpointer.save(trainer.rank(), trainer.step_count(), tensors, trainer.checkpoint_info(),
                                   staging.value_or(checkpointer.options().staging));
  trainer.stage_fence(h);
  return h;
}

Trainer::~Trainer() {
  try {
    wait_for_staging();
  } catch (const Error&) {
    // The copy has finished (it failed its check): nothing reads the state any more.
  }
}

void Trainer::stage_fence(SaveHandle save) {
  wait_for_staging();
  fence_ = std::move(save);
}

void Trainer::wait_for_staging() {
  if (!fence_.valid()) return;
  const SaveHandle h = std::exchange(fence_, SaveHandle());
  h.wait_staged();
}

std::uint64_t Trainer::resume_latest(const std::string& root, Verify verify, Reshard reshard) {
  return resume_from([&](std::optional<int> expect) { return open_latest(posix_file_system(), root, {.expected_world_size = expect}); },
                     root, verify, reshard);
}

std::uint64_t Trainer::resume_latest(const Checkpointer& checkpointer, Verify verify, Reshard reshard) {
  // The Checkpointer's start-up repaired what a node set's redundancy rebuilds (reads never
  // write): the resume opens what is there.
  const CheckpointerOptions& o = checkpointer.options();
  return resume_from([&](std::optional<int> expect) { return open_latest(checkpointer.file_system(), o.root, {.expected_world_size = expect}); },
                     o.root, verify, reshard);
}

std::optional<std::uint64_t> Trainer::resume_or_start(const std::string& root, Verify verify, Reshard reshard) {
  FileSystem& fs = posix_file_system();
  // The ranks agree on the decision before any of them enters the collective resume.
  char mine = 0;
  try {
    mine = find_committed_checkpoint(fs, root) ? 1 : 0;
  } catch (const Error&) {
    mine = 1;  // the resume reports what is wrong with the root
  }
  const auto all = comm_.all_gather_bytes(std::as_bytes(std::span(&mine, 1)));
  for (int r = 0; r < comm_.size(); ++r)
    if (static_cast<char>(all[static_cast<std::size_t>(r)].at(0)) != mine)
      throw Error(Errc::aborted, root, "rank " + std::to_string(r) + " sees another root (a `latest` or none)",
                  mine ? "latest" : "no latest", mine ? "no latest" : "latest");
  if (!mine) return std::nullopt;
  return resume_latest(root, verify, reshard);
}

std::uint64_t Trainer::resume_from(const std::function<OpenedCheckpoint(std::optional<int>)>& open, const std::string& where,
                                   Verify verify, Reshard reshard) {
  wait_for_staging();  // the load writes the saved state
  // Every rank loads its own part; they then agree that all of them succeeded, on the same
  // checkpoint, before any rank enters the collective restore (else one failing rank would
  // leave the others blocked in the all-gather).
  std::optional<OpenedCheckpoint> opened;
  std::optional<LoadedState> state;
  std::optional<Error> error;
  std::string mine;
  resume_timing_ = {};
  const auto t_open = std::chrono::steady_clock::now();
  auto t_load = t_open;
  try {
    const std::optional<int> expect = reshard == Reshard::allow ? std::nullopt : std::optional<int>(comm_.size());
    opened.emplace(open(expect));
    t_load = std::chrono::steady_clock::now();
    resume_timing_.verify = t_load - t_open;
    const Manifest& m = opened->reader.manifest();
    if (m.world_size == comm_.size())
      state.emplace(load_state_into(opened->reader, verify));
    else
      state.emplace(load_state_resharded(opened->reader, verify));
    mine = "ok " + opened->reader.dir();
  } catch (const Error& e) {
    error = e;
    mine = "fail";
  }
  const auto all = comm_.all_gather_bytes(std::as_bytes(std::span(mine.data(), mine.size())));
  for (int r = 0; r < comm_.size(); ++r) {
    const std::string theirs(reinterpret_cast<const char*>(all[static_cast<std::size_t>(r)].data()), all[static_cast<std::size_t>(r)].size());
    if (theirs == mine) continue;
    if (error) throw *error;
    throw Error(Errc::aborted, where, "rank " + std::to_string(r) + " could not load the same checkpoint", mine, theirs);
  }
  if (error) throw *error;
  apply_state(*state);
  resume_timing_.load = std::chrono::steady_clock::now() - t_load;
  return opened->reader.manifest().step;
}

// ---- levels ----

std::optional<Trainer::PlannedResume> Trainer::resume_planned(const std::vector<std::string>& levels, Verify verify, Reshard reshard,
                                                              const std::string& restore_into) {
  // Rank 0 plans and fetches; the answer every rank gets: "-" (nothing committed anywhere),
  // "ok\n<step>\n<root>\n<plan>\n<discover ns> <fetch ns> <rebuild ns>", or "error\n<message>".
  std::optional<PlannedResume> out;
  std::optional<Error> error;
  std::string answer = "-";  // never empty: every rank sends at least one byte
  if (comm_.rank() == 0) {
    try {
      bool committed = false;
      for (const auto& l : levels) {
        try {
          committed = committed || open_store(l)->committed_evidence().has_value();
        } catch (const Error&) {
          committed = true;  // an unreadable level may hold one: the plan says what is wrong
        }
      }
      if (committed) {
        const RecoveryOptions options{.expected_world_size = reshard == Reshard::allow ? std::nullopt : std::optional<int>(comm_.size())};
        const RecoveryPlan plan = plan_recovery(levels, options);
        const Recovered got = recover_planned(plan, options, restore_into);
        const std::string root = got.from.kind == StoreKind::object_store ? restore_into : got.from.root;
        answer = "ok\n" + std::to_string(got.from.step) + "\n" + root + "\n" + plan.summary() + "\n" + std::to_string(plan.discover.count()) + " " +
                 std::to_string(got.fetch.count()) + " " + std::to_string(got.rebuild.count());
      }
    } catch (const Error& e) {
      error = e;
      answer = std::string("error\n") + e.what();
    }
  }
  const auto all = comm_.all_gather_bytes(std::as_bytes(std::span(answer.data(), answer.size())));
  const std::string zero(reinterpret_cast<const char*>(all.at(0).data()), all.at(0).size());
  if (zero == "-") return std::nullopt;
  if (zero.starts_with("error\n")) {
    if (error) throw *error;
    throw Error(Errc::aborted, levels.empty() ? std::string() : levels.front(), "rank 0 could not plan the recovery: " + zero.substr(6));
  }
  PlannedResume r;
  std::size_t at = 3;
  const auto field = [&] {
    const std::size_t end = zero.find('\n', at);
    std::string f = zero.substr(at, end == std::string::npos ? std::string::npos : end - at);
    at = end == std::string::npos ? zero.size() : end + 1;
    return f;
  };
  const std::uint64_t step = std::stoull(field());
  r.root = field();
  r.plan = field();
  long long d = 0, f = 0, b = 0;
  std::sscanf(field().c_str(), "%lld %lld %lld", &d, &f, &b);
  r.discover = std::chrono::nanoseconds(d), r.fetch = std::chrono::nanoseconds(f), r.rebuild = std::chrono::nanoseconds(b);
  r.step = resume_from(
      [&](std::optional<int> expect) {
        auto store = open_store(r.root);
        return OpenedCheckpoint{store->open(step, expect), checkpoint_dir_name(step), false, {}};
      },
      r.root, verify, reshard);
  out = std::move(r);
  return out;
}

// ---- two tiers ----

Trainer::TieredResume Trainer::resume_latest_tiered(const std::string& local_root, const std::string& durable_root, Verify verify,
                                                    Reshard reshard, bool adopt_run) {
  TieredResume out;
  // An s3:// durable root: its checkpoint is restored into the local root (store/tiers.hpp).
  out.step = resume_from(
      [&](std::optional<int> expect) {
        const OpenLatestOptions opt{.expected_world_size = expect, .verify = verify};
        TieredCheckpoint t = open_latest_tiered(posix_file_system(), local_root, posix_file_system(), durable_root, opt, adopt_run);
        out.tier = t.tier;
        out.local_error = t.local_error;
        out.adopted_run = t.adopted_run;
        return std::move(t.opened);
      },
      local_root, verify, reshard);
  return out;
}

}  // namespace ckpt::train
