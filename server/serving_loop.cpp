#include "server/serving_loop.h"

#include <cstdio>

#include "core/timer.h"
#include "engine/embedder.h"

namespace tandem::server {

ServingLoop::ServingLoop(Model& model, BlockPool& pool, const SchedulerOptions& o, Metrics& metrics, const Disaggregated& d)
    : sched_(model, pool, o), model_(model), pool_(pool), metrics_(metrics), max_batch_tokens_(o.max_batch_tokens) {
  if (d.link) {
    router_ = std::make_unique<DecodeRouter>(sched_, *d.link, d.opts);
    router_->on_handoff = [this](const HandoffTiming& t) { metrics_.observe_handoff(t); };
  }
  publish_gauges(0);  // the pool's size shows in /metrics before the first request
  thread_ = std::thread([this] { run(); });
}

ServingLoop::~ServingLoop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ServingLoop::submit(RequestParams p, SeqCallback cb, std::function<void(Result<int64_t>)> accepted) {
  {
    std::lock_guard<std::mutex> l(mu_);
    inbox_.push_back({std::move(p), std::move(cb), std::move(accepted)});
    idle_ = false;
  }
  cv_.notify_all();
}

void ServingLoop::embed(std::vector<std::vector<int32_t>> inputs, std::function<void(Embeddings)> done) {
  {
    std::lock_guard<std::mutex> l(mu_);
    embeds_.push_back({std::move(inputs), std::move(done)});
    idle_ = false;
  }
  cv_.notify_all();
}

void ServingLoop::cancel(int64_t id) {
  {
    std::lock_guard<std::mutex> l(mu_);
    cancels_.push_back(id);
  }
  cv_.notify_all();
}

void ServingLoop::abort_all(std::string why) {
  {
    std::lock_guard<std::mutex> l(mu_);
    abort_ = std::move(why);
  }
  cv_.notify_all();
}

std::optional<RouterStats> ServingLoop::router_stats() const {
  if (!router_) return std::nullopt;
  return router_->stats();
}

std::optional<std::string> ServingLoop::backend_failure() const {
  std::lock_guard<std::mutex> l(mu_);
  return backend_failure_;
}

void ServingLoop::wait_idle() {
  std::unique_lock<std::mutex> l(mu_);
  idle_cv_.wait(l, [&] { return idle_ && inbox_.empty(); });
}

void ServingLoop::publish_gauges(double tokens_per_s) {
  const SchedulerStats& st = sched_.stats();
  Gauges g;
  g.waiting = (int64_t)sched_.n_waiting();
  g.running = (int64_t)sched_.n_running();
  g.kv_blocks_total = pool_.shape().n_blocks;
  g.kv_blocks_free = pool_.free_blocks();
  g.kv_blocks_used = pool_.used_blocks();
  g.kv_blocks_cached = pool_.cached_blocks();
  g.prompt_tokens = st.prompt_tokens;
  g.cached_prompt_tokens = st.cached_prompt_tokens;
  g.generated_tokens = st.generated_tokens;
  g.preemptions = st.preemptions;
  g.steps = st.steps;
  g.drafted_tokens = st.drafted_tokens;
  g.accepted_tokens = st.accepted_tokens;
  g.draft_passes = st.draft_passes;
  g.tokens_per_s = tokens_per_s;
  metrics_.set_gauges(g);
  if (router_) metrics_.set_router(router_->stats(), st.pass_s);
}

// Sleeps until a request, cancel, embedding or abort comes in. With a router it wakes to poll
// the prefill ranks: every 500 us while prompts are out (nothing to decode meanwhile), else
// every 50 ms (heartbeats, silent ranks).
void ServingLoop::wait_for_work(std::unique_lock<std::mutex>& l) {
  if (sched_.has_work() || !inbox_.empty() || !cancels_.empty() || !embeds_.empty() || !running_embeds_.empty()) return;
  auto woken = [&] { return stop_ || !inbox_.empty() || !cancels_.empty() || abort_ || !embeds_.empty(); };
  if (router_ && router_->has_work()) return (void)cv_.wait_for(l, std::chrono::microseconds(500), woken);
  idle_ = true;
  idle_cv_.notify_all();
  if (!router_) return cv_.wait(l, woken);
  cv_.wait_for(l, std::chrono::milliseconds(50), woken);
}

void ServingLoop::run() {
  Timer window;
  int64_t window_tokens = 0;
  double rate = 0;
  while (true) {
    std::deque<Incoming> in;
    std::vector<int64_t> cancels;
    std::optional<std::string> abort;
    std::deque<EmbedJob> embeds;
    {
      std::unique_lock<std::mutex> l(mu_);
      wait_for_work(l);
      if (stop_) break;
      idle_ = false;
      in.swap(inbox_);
      cancels.swap(cancels_);
      abort.swap(abort_);
      embeds.swap(embeds_);
    }
    for (EmbedJob& j : embeds) {
      auto job = EmbeddingJob::start(model_, pool_, std::move(j.inputs));
      if (job.ok())
        running_embeds_.push_back({std::move(job.value()), std::move(j.done), Timer()});
      else
        j.done(job.error());
    }
    embed_step();
    for (Incoming& r : in) {
      auto id = router_ ? router_->submit(std::move(r.p), std::move(r.cb)) : sched_.add(std::move(r.p), std::move(r.cb));
      r.accepted(id);
    }
    for (int64_t id : cancels)
      if (!router_ || !router_->cancel(id)) sched_.cancel(id);
    if (router_) router_->poll();  // K,V landed, hand-offs admitted, silent prefill ranks
    if (abort && router_) router_->abort_all(*abort);  // prompts out at prefill ranks, requests on other decode ranks
    if (abort) sched_.abort_all(*abort);
    const int64_t before = sched_.stats().generated_tokens;
    // A failed pass finishes its sequences with an error event; one the backend keeps (a
    // device fault) also marks the server unhealthy.
    if (!sched_.step().ok())
      if (Status be = model_.backend().error(); !be.ok()) {
        std::lock_guard<std::mutex> l(mu_);
        if (!backend_failure_) {
          backend_failure_ = be.error().message;
          std::fprintf(stderr, "tandem serve: the backend failed (%s): every request now answers 503\n",
                       be.error().message.c_str());
        }
      }
    window_tokens += sched_.stats().generated_tokens - before;
    if (window.seconds() >= 2.0) {
      rate = window_tokens / window.seconds();
      window_tokens = 0;
      window.reset();
    }
    publish_gauges(sched_.has_work() ? rate : 0);
  }
  if (router_) router_->stop();
  // Shutting down: everything still queued or running ends as cancelled.
  for (Incoming& r : inbox_) r.accepted(make_error("the server is shutting down"));
  inbox_.clear();
  for (EmbedJob& j : embeds_) j.done(make_error("the server is shutting down"));
  embeds_.clear();
  for (RunningEmbed& r : running_embeds_) r.done(make_error("the server is shutting down"));
  running_embeds_.clear();
}

void ServingLoop::embed_step() {
  if (running_embeds_.empty()) return;
  RunningEmbed& r = running_embeds_.front();
  auto s = r.job.step(max_batch_tokens_);
  // Running requests will free blocks, but not forever: after 30 s without a pass, give up.
  if (s.ok() && s.value() == EmbeddingJob::Step::NoRoom && sched_.has_work() && r.since_pass.seconds() < 30) return;
  if (s.ok() && s.value() == EmbeddingJob::Step::Ran) r.since_pass.reset();
  if (!s.ok())
    r.done(s.error());
  else if (s.value() == EmbeddingJob::Step::NoRoom)
    r.done(make_error("the KV pool has no room for these inputs' blocks; retry with fewer or shorter inputs"));
  else if (r.job.finished())
    r.done(r.job.vectors());
  else
    return;
  running_embeds_.pop_front();
}

}  // namespace tandem::server
