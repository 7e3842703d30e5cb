// `tandem serve`: the OpenAI-compatible server. One engine thread runs continuous batching
// over a paged KV pool; HTTP threads translate requests. Binds 127.0.0.1 unless told.
#include <csignal>
#include <filesystem>

#include <fmt/core.h>

#include "apps/commands.h"
#include "apps/common.h"
#include "apps/generation_options.h"
#include "core/units.h"
#include "kv/block_pool.h"
#include "server/http_server.h"

namespace tandem::apps {

namespace {
server::HttpServer* g_server = nullptr;
void on_signal(int) {
  if (g_server) g_server->stop();
}
}  // namespace

Command add_serve_command(CLI::App& app) {
  struct Args {
    ModelLoadOptions load;
    std::string host = "127.0.0.1", api_key, kv_memory = "1GiB", name;
    int port = 8080, max_running = 64, block_tokens = 16;
    int64_t batch_tokens = 512, kv_tokens = 0;
  };
  auto a = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("serve", "OpenAI-compatible HTTP server with continuous batching and a paged KV cache");
  a->load.add_to(sub);
  sub->add_option("--host", a->host, "address to bind (default 127.0.0.1: this machine only)");
  sub->add_option("--port", a->port, "port (0 = any free port, printed at start)")->check(CLI::Range(0, 65535));
  sub->add_option("--api-key", a->api_key, "require Authorization: Bearer KEY on /v1/*");
  sub->add_option("--kv-memory", a->kv_memory, "memory for the KV block pool, e.g. 512MiB, 4GiB");
  sub->add_option("--kv-tokens", a->kv_tokens, "size the KV block pool in tokens instead (overrides --kv-memory)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 32));
  sub->add_option("--block-tokens", a->block_tokens, "tokens per KV block")->check(CLI::Range(1, 1024));
  sub->add_option("--max-running", a->max_running, "sequences decoded together at most")->check(CLI::Range(1, 4096));
  sub->add_option("--batch-tokens", a->batch_tokens, "tokens per forward pass (decode tokens + prefill chunks)")->check(CLI::Range(1, 1 << 16));
  sub->add_option("--name", a->name, "model id reported by /v1/models (default: the file's name)");
  return [a]() -> int {
    auto lm = load_model(a->load);
    if (!lm.ok()) return fail(lm.error().message);
    LlamaModel& model = *lm->model;
    const LlamaConfig& c = model.config();
    auto mem = parse_bytes(a->kv_memory);
    if (!mem.ok()) return fail(mem.error().message);
    BlockPoolShape ps{c.n_layer, c.n_kv_head, c.head_dim, a->block_tokens, 0, DType::F16};
    ps.n_blocks = a->kv_tokens > 0 ? (a->kv_tokens + a->block_tokens - 1) / a->block_tokens
                                   : BlockPool::blocks_for_bytes(ps, mem.value());
    if (ps.n_blocks < 1) return fail(fmt::format("--kv-memory {} holds no KV block", a->kv_memory));
    auto pool = BlockPool::create(ps);
    if (!pool.ok()) return fail(pool.error().message);
    auto tmpl = ChatTemplate::from_gguf(model.gguf(), lm->tokenizer->vocab());
    if (!tmpl.ok()) fmt::print(stderr, "warning: {}; /v1/chat/completions is disabled\n", tmpl.error().message);

    server::Metrics metrics;
    SchedulerOptions so;
    so.max_running = a->max_running;
    so.max_batch_tokens = a->batch_tokens;
    server::ServingLoop loop(model, *pool.value(), so, metrics);
    server::ServerOptions opts;
    opts.host = a->host;
    opts.port = a->port;
    opts.api_key = a->api_key;
    opts.model_name = !a->name.empty() ? a->name : std::filesystem::path(a->load.model).stem().string();
    server::HttpServer http(model, *lm->tokenizer, tmpl.ok() ? &tmpl.value() : nullptr, loop, metrics, opts);
    Status st = http.bind();
    if (!st.ok()) return fail(st.error().message);
    fmt::print(stderr,
               "tandem serve: {} on http://{}:{} ; KV pool {} bytes ({}) = 2 x {} layers x {} kv heads x {} tokens x {} head dim x "
               "2 bytes, {} blocks of {} tokens\n",
               opts.model_name, opts.host, http.port(), pool.value()->bytes(), format_bytes((double)pool.value()->bytes()),
               c.n_layer, c.n_kv_head, ps.n_blocks * ps.block_tokens, c.head_dim, ps.n_blocks, ps.block_tokens);
    std::fflush(stderr);
    g_server = &http;
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    st = http.listen();
    g_server = nullptr;
    if (!st.ok()) return fail(st.error().message);
    return 0;
  };
}

}  // namespace tandem::apps
