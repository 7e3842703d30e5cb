// The engine thread: owns the Scheduler and steps it while there is work. HTTP threads hand it
// requests and cancellations through a small locked inbox, so they never wait for a forward
// pass; events come back through each request's callback, on the engine thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/timer.h"
#include "engine/decode_router.h"
#include "engine/embedder.h"
#include "engine/scheduler.h"
#include "server/metrics.h"

namespace tandem::server {

// Disaggregated serving's rank 0 (engine/decode_router.h): with a link, prompts go to the
// prefill ranks and the serving loop's scheduler only decodes.
struct Disaggregated {
  PeerLink* link = nullptr;
  DisaggregationOptions opts;
};

class ServingLoop {
 public:
  ServingLoop(Model& model, BlockPool& pool, const SchedulerOptions& o, Metrics& metrics, const Disaggregated& d = {});
  ~ServingLoop();  // stops the thread; pending requests finish as cancelled

  // Queues a request; the result (id or error) is delivered to `accepted` on the engine thread
  // before any event. Errors are the scheduler's (e.g. prompt past the context).
  void submit(RequestParams p, SeqCallback cb, std::function<void(Result<int64_t>)> accepted);
  void cancel(int64_t id);
  // Embeddings of token sequences (engine/embedder.h), run on the engine thread one pass per
  // scheduler step (so decoding streams wait one pass at a time, not for the whole request),
  // in blocks of the same KV pool; the result goes to `done` there.
  using Embeddings = Result<std::vector<std::vector<float>>>;
  void embed(std::vector<std::vector<int32_t>> inputs, std::function<void(Embeddings)> done);
  // Ends every queued and running request with an error saying `why` (a drain's deadline).
  void abort_all(std::string why);
  // Blocks until nothing is waiting or running (tests).
  void wait_idle();
  // The scheduler's token masker (immutable; any thread may use it): workers check a request's
  // grammar with it before submitting, so a grammar that cannot start is a 400.
  std::shared_ptr<const grammar::TokenMasker> masker() const { return sched_.masker(); }
  // The model's backend error once a pass has failed with one (a GPU fault is sticky: every
  // later pass would fail too), else nullopt. /health and new requests answer 503 with it.
  std::optional<std::string> backend_failure() const;
  // Disaggregated serving: the prefill ranks as the router sees them (nullopt: colocated).
  std::optional<RouterStats> router_stats() const;

 private:
  void run();
  void publish_gauges(double tokens_per_s);  // the engine thread's (or the constructor's) view
  void wait_for_work(std::unique_lock<std::mutex>& l);

  Scheduler sched_;
  std::unique_ptr<DecodeRouter> router_;  // disaggregated serving only
  Model& model_;
  BlockPool& pool_;
  Metrics& metrics_;
  mutable std::mutex mu_;
  std::optional<std::string> backend_failure_;  // under mu_
  std::condition_variable cv_, idle_cv_;
  struct Incoming {
    RequestParams p;
    SeqCallback cb;
    std::function<void(Result<int64_t>)> accepted;
  };
  std::deque<Incoming> inbox_;
  struct EmbedJob {
    std::vector<std::vector<int32_t>> inputs;
    std::function<void(Embeddings)> done;
  };
  std::deque<EmbedJob> embeds_;  // under mu_: queued
  struct RunningEmbed {
    EmbeddingJob job;
    std::function<void(Embeddings)> done;
    Timer since_pass;  // how long it has waited for blocks
  };
  std::deque<RunningEmbed> running_embeds_;  // the engine thread's: the front runs a pass a step
  void embed_step();
  int64_t max_batch_tokens_;
  std::vector<int64_t> cancels_;
  std::optional<std::string> abort_;
  bool stop_ = false, idle_ = true;
  std::thread thread_;
};

}  // namespace tandem::server
