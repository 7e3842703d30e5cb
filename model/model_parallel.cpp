// Tensor parallelism's side of Model: rank 0's pass sends its step to the other ranks first
// (the pool it runs on and the ForwardBatch), every rank runs the same pass over its shard, and
// the logits' vocabulary shares are gathered; follow() is the other ranks' loop.
#include <map>

#include "kv/block_pool.h"
#include "model/model.h"

namespace tandem {

Model::~Model() {
  stop_heartbeat();
  // Rank 0's model ends the job's followers (unless a peer already failed: nobody listens).
  if (comm_ && tp_.rank == 0 && !comm_->failed()) send_step(*comm_, TensorParallelStep::Stop, 0, KvStore{}, {}, nullptr);
}

void Model::start_heartbeat() {
  last_step_ = std::chrono::steady_clock::now();
  heartbeat_ = std::thread([this] {
    const auto period = std::chrono::duration<double>(kHeartbeatS);
    std::unique_lock<std::timed_mutex> lock(comm_->step_mu);
    while (!heartbeat_stop_ && !comm_->failed()) {
      // Wakes when a period has passed since the last step; a pass holds step_mu, so a
      // heartbeat never goes out between one pass's collectives.
      const auto due = last_step_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(period);
      if (heartbeat_cv_.wait_until(lock, due, [&] { return heartbeat_stop_; })) break;
      if (std::chrono::steady_clock::now() < last_step_ + period) continue;
      send_step(*comm_, TensorParallelStep::Heartbeat, 0, KvStore{}, {}, nullptr);
      last_step_ = std::chrono::steady_clock::now();
    }
  });
}

void Model::stop_heartbeat() {
  if (!heartbeat_.joinable()) return;
  {
    std::lock_guard<std::timed_mutex> lock(comm_->step_mu);
    heartbeat_stop_ = true;
  }
  heartbeat_cv_.notify_all();
  heartbeat_.join();
}

int64_t Model::pool_id(const KvStore& kv, std::vector<int64_t>& dropped) {
  int64_t id = 0;
  for (size_t i = 0; i < pools_.size();) {
    const std::weak_ptr<void>& w = pools_[i].second;
    if (w.expired()) {  // the pool is gone: the followers free their copy
      dropped.push_back(pools_[i].first);
      pools_.erase(pools_.begin() + (ptrdiff_t)i);
      continue;
    }
    if (!w.owner_before(kv.owner) && !kv.owner.owner_before(w)) id = pools_[i].first;
    i++;
  }
  if (id == 0) {
    id = next_pool_id_++;
    pools_.emplace_back(id, kv.owner);
  }
  return id;
}

Result<std::span<const float>> Model::parallel_pass(const KvStore& kv, const ForwardBatch& b) {
  Collectives& c = *comm_;
  std::unique_lock<std::timed_mutex> step_lock(c.step_mu, std::defer_lock);
  if (tp_.rank == 0) {
    step_lock.lock();
    last_step_ = std::chrono::steady_clock::now();
    std::vector<int64_t> dropped;
    const int64_t id = pool_id(kv, dropped);
    send_step(c, TensorParallelStep::Forward, id, kv, dropped, &b);
  }
  if (!c.failed()) pass(kv, KvLayerGroups::plan(config_.n_layer, {}), b, 0);
  const size_t n = b.logit_rows().size(), V = (size_t)config_.n_vocab;
  if (n > 0 && !c.failed()) {
    // Every rank's [n, share] block, then each row joined from the blocks in rank order.
    std::vector<size_t> counts;
    for (int64_t share : tp_.vocab_cols) counts.push_back(n * (size_t)share);
    std::vector<float> blocks(n * V);
    c.all_gather_v(backend_->read(logits_).data(), counts, blocks.data());
    gathered_.resize(n * V);
    const float* block = blocks.data();
    size_t col = 0;
    for (int64_t s : tp_.vocab_cols) {
      const size_t share = (size_t)s;
      for (size_t row = 0; row < n; row++) std::copy_n(block + row * share, share, gathered_.data() + row * V + col);
      block += n * share;
      col += share;
    }
  }
  if (c.failed()) return make_error("{}", c.error());
  return std::span<const float>(gathered_.data(), n * V);
}

Status Model::follow() {
  if (!comm_ || tp_.rank == 0) return make_error("follow() is for the ranks other than 0 of a tensor-parallel job");
  std::map<int64_t, KvStore> stores;  // rank 0's pools, by id: this rank's heads of each
  for (;;) {
    auto step = receive_step(*comm_);
    if (!step.ok()) return step.error();
    for (int64_t id : step->dropped_pools) stores.erase(id);
    if (step->op == TensorParallelStep::Stop) return Status::Ok();
    if (step->op == TensorParallelStep::Heartbeat) continue;
    auto it = stores.find(step->pool_id);
    if (it == stores.end()) {
      auto row = kv_row_bytes(step->kv_dtype, tp_.n_kv_head, config_.head_dim);
      if (!row.ok()) return row.error();
      auto kv = backend_->new_kv_store(step->kv_dtype, config_.n_layer, (int)step->block_tokens, step->n_blocks,
                                       row.value());
      if (!kv.ok()) return make_error("tensor parallel rank {}: {}", tp_.rank, kv.error().message);
      it = stores.emplace(step->pool_id, std::move(kv.value())).first;
    }
    const ForwardBatch& b = *step->batch;
    ensure_scratch(b.n_tokens(), std::max<int64_t>(1, (int64_t)b.logit_rows().size()));
    auto r = parallel_pass(it->second, b);
    if (!r.ok()) return r.error();
  }
}

}  // namespace tandem
