// `tandem serve`: the OpenAI-compatible server. One engine thread runs continuous batching
// over a paged KV pool; HTTP threads translate requests. Binds 127.0.0.1 unless told.
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/core.h>

#include "apps/commands.h"
#include "apps/common.h"
#include "apps/generation_options.h"
#include "apps/serve_disaggregated.h"
#include "backend/mpi/mpi_peer_link.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/make_backend.h"
#include "core/units.h"
#include "engine/grammar/token_mask.h"
#include "engine/draft_model.h"
#include "kv/block_pool.h"
#include "server/http_server.h"

namespace tandem::apps {

namespace {

std::string trimmed(std::string s) {
  while (!s.empty() && std::isspace((unsigned char)s.back())) s.pop_back();
  while (!s.empty() && std::isspace((unsigned char)s.front())) s.erase(s.begin());
  return s;
}

// Keys from a file given as `option`: one per line, blank lines and lines starting with #
// skipped (a file keeps them out of `ps`).
Result<std::vector<std::string>> keys_from_file(const char* option, const std::string& file) {
  std::ifstream in(file);
  if (!in) return make_error("{} {}: cannot open", option, file);
  std::vector<std::string> keys;
  for (std::string line; std::getline(in, line);) {
    line = trimmed(line);
    if (!line.empty() && line[0] != '#') keys.push_back(line);
  }
  if (keys.empty()) return make_error("{} {}: the file holds no key", option, file);
  return keys;
}

// The keys from --api-key, --api-key-file (each a tenant) or $TANDEM_API_KEY.
Result<std::vector<std::string>> api_keys(const std::string& flag, const std::string& file) {
  if (!flag.empty() && !file.empty()) return make_error("give --api-key or --api-key-file, not both");
  if (!flag.empty()) return std::vector<std::string>{flag};
  if (!file.empty()) return keys_from_file("--api-key-file", file);
  const char* env = std::getenv("TANDEM_API_KEY");
  const std::string key = trimmed(env ? env : "");
  return key.empty() ? std::vector<std::string>{} : std::vector<std::string>{key};
}

// The model's own template, or --chat-template-file's (its bos/eos text from the vocabulary).
// Either is untrusted code: it renders under `limits`.
Result<ChatTemplate> chat_template(const std::string& file, const GgufFile& gguf, const Vocab& v, const TemplateLimits& limits) {
  if (file.empty()) return ChatTemplate::from_gguf(gguf, v, limits);
  std::ifstream in(file, std::ios::binary);
  if (!in) return make_error("--chat-template-file {}: cannot open", file);
  std::stringstream ss;
  ss << in.rdbuf();
  return ChatTemplate::from_source(ss.str(), v.bos >= 0 ? v.tokens[v.bos] : "", v.eos >= 0 ? v.tokens[v.eos] : "", limits);
}

std::chrono::milliseconds ms(double seconds) { return std::chrono::milliseconds((int64_t)(seconds * 1000)); }

struct ServeArgs {
  ModelLoadOptions load;
  SpeculativeOptions speculative;
  std::string host = "127.0.0.1", api_key, api_key_file, operator_key_file, kv_memory = "1GiB", name, chat_template_file,
      kv_dtype = "f16";
  bool allow_special_in_messages = false;
  int port = 8080, max_running = 64, block_tokens = 16;
  int64_t batch_tokens = 512, kv_tokens = 0;
  bool swa_full = false;
  std::vector<std::string> allow_origin, allow_host;
  int max_connections = 1024, max_connections_per_client = 0, reserved_connections = 0;
  double header_timeout = 10, body_timeout = 60, idle_timeout = 30, write_timeout = 30, drain_timeout = 30;
  std::string prefix_cache_scope = "key";
  std::string tool_format = "auto";
  std::string responses_store = "64MiB";
  std::string disaggregate;  // P:D (engine/disaggregation.h)
  double rank_timeout = 5;
};

// The HTTP side's options: the address, who may call, and the connection limits.
void add_http_options(CLI::App* sub, ServeArgs& a) {
  sub->add_option("--host", a.host, "address to bind (default 127.0.0.1: this machine only)");
  sub->add_option("--port", a.port, "port (0 = any free port, printed at start)")->check(CLI::Range(0, 65535));
  sub->add_option("--api-key", a.api_key,
                  "require Authorization: Bearer KEY on /v1/* and /metrics (visible in `ps`: prefer --api-key-file or $TANDEM_API_KEY)");
  sub->add_option("--api-key-file", a.api_key_file,
                  "read the API keys from FILE, one per line, each a tenant (the environment's TANDEM_API_KEY is used otherwise)");
  sub->add_option("--operator-key-file", a.operator_key_file,
                  "keys (one per line) that may also read the server-wide /metrics; with --api-key-file each tenant's "
                  "/metrics shows only its own requests");
  sub->add_option("--prefix-cache-scope", a.prefix_cache_scope,
                  "which requests share cached prompt blocks: global, key (requests with the same API key; the default) or request "
                  "(none); a request's cache_salt narrows sharing further")
      ->check(CLI::IsMember({"global", "key", "request"}));
  sub->add_option("--responses-store", a.responses_store,
                  "memory for the Responses API's stored answers (previous_response_id, GET /v1/responses/ID), least "
                  "recently used out first; 0 keeps none")
      ->check(CLI::Validator([](std::string& v) { return parse_bytes(v).ok() ? std::string() : "not a size such as 64MiB: " + v; },
                             "SIZE"));
  sub->add_option("--drain-timeout", a.drain_timeout,
                  "on SIGTERM: seconds running requests get to finish (new ones get 503) before they are ended; a second signal stops at once")
      ->check(CLI::Range(0.0, 86400.0));
  sub->add_option("--allow-origin", a.allow_origin, "let web pages from ORIGIN (e.g. https://app.example) call the API (CORS); '*' for any")
      ->take_all();
  sub->add_option("--allow-host", a.allow_host, "accept requests for Host NAME (besides the bound address, localhost, 127.0.0.1, [::1])")
      ->take_all();
  sub->add_option("--max-connections", a.max_connections, "open connections at most; more get 503")->check(CLI::Range(1, 1 << 20));
  sub->add_option("--max-connections-per-client", a.max_connections_per_client,
                  "ordinary connection slots one client address may hold, past which it gets only the reserved slots "
                  "(default: half of --max-connections with API keys, else no cap; raise it behind a proxy)")
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--reserved-connections", a.reserved_connections,
                  "the last connection slots, kept for requests with a valid API key and /health (default: an eighth of "
                  "--max-connections)")
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--header-timeout", a.header_timeout, "seconds a client has to send a request's header")->check(CLI::Range(0.1, 3600.0));
  sub->add_option("--body-timeout", a.body_timeout, "seconds a client has to send a request's body")->check(CLI::Range(0.1, 3600.0));
  sub->add_option("--idle-timeout", a.idle_timeout, "seconds an idle keep-alive connection stays open")->check(CLI::Range(0.1, 3600.0));
  sub->add_option("--write-timeout", a.write_timeout, "seconds a client may take to accept a write before it counts as gone")
      ->check(CLI::Range(0.1, 3600.0));
}

// The engine's options: the KV pool, batching, speculative decoding and the chat template.
void add_engine_options(CLI::App* sub, ServeArgs& a) {
  sub->add_option("--kv-memory", a.kv_memory, "memory for the KV block pool, e.g. 512MiB, 4GiB");
  sub->add_option("--kv-tokens", a.kv_tokens, "size the KV block pool as a full store of this many tokens would be (overrides --kv-memory)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 32));
  add_kv_dtype_option(sub, a.kv_dtype);
  sub->add_option("--block-tokens", a.block_tokens, "tokens per KV block")->check(CLI::Range(1, 1024));
  sub->add_flag("--swa-full", a.swa_full,
                "sliding-window layers keep every position (default: only their window's blocks, on the CPU backend)");
  sub->add_option("--max-running", a.max_running, "sequences decoded together at most")->check(CLI::Range(1, 4096));
  sub->add_option("--batch-tokens", a.batch_tokens, "tokens per forward pass (decode tokens + prefill chunks)")->check(CLI::Range(1, 1 << 16));
  a.speculative.add_to(sub);
  sub->add_option("--chat-template-file", a.chat_template_file, "a Jinja chat template to use instead of the model's");
  sub->add_option("--tool-format", a.tool_format,
                  "tool calls: auto (the template's own format when it reads tools, else the generic JSON format), "
                  "template (only the template's; a 400 when it has none) or generic (always the generic one)")
      ->check(CLI::IsMember({"auto", "template", "generic"}));
  sub->add_flag("--allow-special-in-messages", a.allow_special_in_messages,
                "special-token text inside chat messages becomes control tokens (default: text, so a user cannot forge a role)");
  sub->add_option("--name", a.name, "model id reported by /v1/models (default: the file's name)");
  sub->add_option("--disaggregate", a.disaggregate,
                  "P:D under mpirun -np P+D: prefill and decode on separate ranks (rank 0 serves HTTP, routes and decodes; "
                  "ranks 1..P prefill and stream each prompt's KV blocks to the decode rank chosen for it: rank 0 or one "
                  "of ranks P+1..P+D-1, which stream the tokens back)");
  sub->add_option("--rank-timeout", a.rank_timeout,
                  "with --disaggregate: seconds a rank may stay silent before it counts as dead (its requests fail)")
      ->check(CLI::Range(0.5, 3600.0));
}

void add_serve_options(CLI::App* sub, ServeArgs& a) {
  a.load.add_to(sub);
  add_http_options(sub, a);
  add_engine_options(sub, a);
}

// SIGINT/SIGTERM are taken by sigwait (drain_on_signal): block them before any thread starts,
// so that every thread inherits the mask and the main thread stops the server outside a handler.
sigset_t block_stop_signals() {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  return stop_signals;
}

Result<std::vector<std::string>> operator_keys(const ServeArgs& a) {
  if (a.operator_key_file.empty()) return std::vector<std::string>{};
  return keys_from_file("--operator-key-file", a.operator_key_file);
}

// The KV block pool and the shape it was made with.
struct KvPool {
  BlockPoolShape shape;
  std::unique_ptr<BlockPool> pool;
};

// This rank's K,V heads: --kv-memory is each rank's, so N ranks hold N times the sequences.
// Window-only blocks for sliding-window layers where the backend keeps layer groups (the
// CPU's, one process): the pool's bytes are what it allocates, its blocks one group's.
Result<KvPool> kv_pool(const ServeArgs& a, Model& model) {
  auto mem = parse_bytes(a.kv_memory);
  if (!mem.ok()) return mem.error();
  // Disaggregated ranks move one block table per sequence: the full store (as --swa-full).
  const bool window_only = !a.swa_full && a.disaggregate.empty();
  BlockPoolShape ps = model.kv_pool_shape(0, kv_dtype_of(a.kv_dtype), a.block_tokens, window_only);
  if (a.kv_tokens > 0) {  // as many bytes as a full store of that many tokens
    BlockPoolShape full = ps;
    full.keep_full_window = true;
    const int64_t blocks = (a.kv_tokens + a.block_tokens - 1) / a.block_tokens;
    ps.n_blocks = BlockPool::blocks_for_bytes(ps, (uint64_t)blocks * BlockPool::block_bytes_of(full));
  } else {
    ps.n_blocks = BlockPool::blocks_for_bytes(ps, mem.value());
  }
  if (ps.n_blocks < 1) return make_error("--kv-memory {} holds no KV block", a.kv_memory);
  auto pool = BlockPool::create(ps, model.backend());
  if (!pool.ok()) return pool.error();
  return KvPool{ps, std::move(pool.value())};
}

// With --draft-model, requests may draft with it ("speculative": "draft", or all of them
// when it is the server's mode); its K,V get a pool of as many positions as the model's.
struct Draft {
  std::unique_ptr<Model> model;
  std::unique_ptr<BlockPool> pool;
};

Result<Draft> load_draft(const ServeArgs& a, const Model& model, const BlockPool& pool) {
  auto draft = a.speculative.load_draft(a.load, model);
  if (!draft.ok()) return draft.error();
  Draft d{std::move(draft.value()), nullptr};
  if (d.model) {
    auto dp = new_draft_pool(*d.model, pool);
    if (!dp.ok()) return dp.error();
    d.pool = std::move(dp.value());
  }
  return d;
}

// Renders stop at once when the server stops, so no worker is left inside a template.
std::atomic<bool> stopping{false};

Result<ChatTemplate> serve_template(const ServeArgs& a, const LoadedModel& lm) {
  TemplateLimits limits;
  limits.max_total_bytes = size_t{64} << 20;  // per render; a few workers render at once
  limits.cancel = &stopping;
  return chat_template(a.chat_template_file, lm.model->gguf(), lm.tokenizer->vocab(), limits);
}

SchedulerOptions scheduler_options(const ServeArgs& a, const LoadedModel& lm, const Draft& draft) {
  SchedulerOptions so;
  so.max_running = a.max_running;
  so.max_batch_tokens = a.batch_tokens;
  so.speculative = a.speculative.params();
  // Constrained requests (response_format, grammar, forced tool calls) mask tokens through
  // the vocabulary's trie: built once here (tens of ms), shared by every request.
  so.masker = grammar::TokenMasker::for_tokenizer(*lm.tokenizer, lm.tokenizer->vocab().end_of_generation);
  if (draft.pool) so.draft_model = {draft.model.get(), draft.pool.get()};
  return so;
}

server::ServerOptions server_options(const ServeArgs& a, std::vector<std::string> keys, std::vector<std::string> operators) {
  server::ServerOptions opts;
  opts.host = a.host;
  opts.port = a.port;
  opts.api_keys = std::move(keys);
  opts.operator_keys = std::move(operators);
  opts.prefix_cache_scope = server::parse_prefix_cache_scope(a.prefix_cache_scope).value();
  opts.allowed_origins = a.allow_origin;
  opts.allowed_hosts = a.allow_host;
  opts.allow_special_in_messages = a.allow_special_in_messages;
  opts.tool_format = server::parse_tool_format_mode(a.tool_format).value();
  opts.responses_store_bytes = parse_bytes(a.responses_store).value();
  opts.limits.max_connections = a.max_connections;
  opts.limits.max_connections_per_peer = a.max_connections_per_client;
  opts.limits.reserved_connections = a.reserved_connections;
  opts.limits.header_timeout = ms(a.header_timeout);
  opts.limits.body_timeout = ms(a.body_timeout);
  opts.limits.idle_timeout = ms(a.idle_timeout);
  opts.limits.write_timeout = ms(a.write_timeout);
  opts.model_name = !a.name.empty() ? a.name : std::filesystem::path(a.load.model).stem().string();
  return opts;
}

// What the server runs with, on stderr: the address and the KV pool's sizes, the draft
// model's pool, and the choices a serving user would want to know of.
void print_serve_banner(const ServeArgs& a, const Model& model, const KvPool& kv, const BlockPool* draft_pool,
                        const server::ServerOptions& opts, int port) {
  const ModelConfig& c = model.config();
  const BlockPoolShape& ps = kv.shape;
  const BlockPool& pool = *kv.pool;
  fmt::print(stderr,
             "tandem serve: {} on http://{}:{} ; KV pool {} bytes ({}) = 2 x {} layers x {} kv heads x {} tokens x {} head dim x "
             "{} bytes ({}), {} blocks of {} tokens x {} layers\n",
             opts.model_name, opts.host, port, pool.bytes(), format_bytes((double)pool.bytes()), c.n_layer, ps.n_kv_head,
             ps.n_blocks * ps.block_tokens * pool.groups().group_layers / c.n_layer, c.head_dim, kv_element_bytes(ps.dtype),
             a.kv_dtype, ps.n_blocks, ps.block_tokens, pool.groups().group_layers);
  if (draft_pool)
    fmt::print(stderr, "tandem serve: draft model {} ; its KV pool {} bytes ({}) for as many positions, besides --kv-memory\n",
               a.speculative.draft_model, draft_pool->bytes(), format_bytes((double)draft_pool->bytes()));
  // The f32 head's cost grows with the rows a step samples (a compute-bound product, no
  // longer a read of the weights): say so where a serving user would look.
  const std::vector<std::string> exact = exact_products_for(a.load.exact_products, model.gguf());
  if (a.load.exact_products == "auto" && a.load.activations == "q8" && dynamic_cast<const CpuBackend*>(&model.backend()) &&
      std::find(exact.begin(), exact.end(), "output") != exact.end())
    fmt::print(stderr,
               "tandem serve: the output head keeps f32 activations (--exact-products auto, for this small model's "
               "accuracy); greedy requests without logprobs get its argmax from an 8-bit copy and a bound, others pay "
               "for f32 products on every row (with many streams, --exact-products none is faster)\n");
  const KvLayerGroups& groups = pool.groups();
  if (groups.n_groups() > 1)
    fmt::print(stderr,
               "tandem serve: window-only KV: {} layer groups of {} layers ({} with a {}-token window keep only its "
               "blocks; --swa-full keeps all)\n",
               groups.n_groups(), groups.group_layers, groups.n_window_groups(), groups.window.back());
  std::fflush(stderr);
}

// The first signal drains: no new work, running requests finish (up to --drain-timeout);
// a second one stops at once.
void drain_on_signal(const ServeArgs& a, server::HttpServer& http, const sigset_t& stop_signals) {
  int sig = 0;
  sigwait(&stop_signals, &sig);
  fmt::print(stderr, "tandem serve: draining ({}; up to {} s; a second signal stops at once)\n", sig == SIGINT ? "SIGINT" : "SIGTERM",
             a.drain_timeout);
  std::fflush(stderr);
  bool again = false;
  http.drain(ms(a.drain_timeout), [&] {
    if (again) return true;
    const timespec poll{0, 0};
    again = sigtimedwait(&stop_signals, nullptr, &poll) > 0;
    return again;
  });
  fmt::print(stderr, "tandem serve: stopping{}\n", again ? " at once (second signal)" : "");
  stopping = true;
  http.stop();
}

// --disaggregate: the job's split, checked before loading; every rank loads the whole model.
Result<std::optional<DisaggregationOptions>> disaggregation(ServeArgs& a) {
  if (a.disaggregate.empty()) return std::optional<DisaggregationOptions>();
  auto o = disaggregation_options({a.disaggregate, a.rank_timeout, a.load.tensor_parallel, !a.speculative.draft_model.empty()});
  if (!o.ok()) return o.error();
  a.load.split_over_ranks = false;
  return std::optional(o.value());
}

int run_serve(const ServeArgs& args) {
  const sigset_t stop_signals = block_stop_signals();
  ServeArgs a = args;
  auto disagg = disaggregation(a);
  if (!disagg.ok()) return fail(disagg.error().message);
  auto keys = api_keys(a.api_key, a.api_key_file);
  if (!keys.ok()) return fail(keys.error().message);
  auto operators = operator_keys(a);
  if (!operators.ok()) return fail(operators.error().message);
  auto lm = load_model(a.load);
  if (!lm.ok()) return fail(lm.error().message);
  Model& model = *lm->model;
  if (disagg.value())
    if (Status st = check_disaggregated_backend(model); !st.ok()) return fail(st.error().message);
  auto kv = kv_pool(a, model);
  if (!kv.ok()) return fail(kv.error().message);
  auto draft = load_draft(a, model, *kv->pool);
  if (!draft.ok()) return fail(draft.error().message);
  auto tmpl = serve_template(a, lm.value());
  if (!tmpl.ok() && !a.chat_template_file.empty()) return fail(tmpl.error().message);
  if (!tmpl.ok()) fmt::print(stderr, "warning: {}; /v1/chat/completions is disabled\n", tmpl.error().message);

  server::Metrics metrics;
  const SchedulerOptions so = scheduler_options(a, lm.value(), draft.value());
  // Every rank has loaded its model and pool: the link's communicator is made by all at once.
  std::unique_ptr<PeerLink> link = disagg.value() ? mpi_peer_link() : nullptr;
  if (link && link->rank() != 0) return run_role_rank(model, *kv->pool, *link, so, *disagg.value());
  server::Disaggregated routed;
  if (link) routed = {link.get(), *disagg.value()};
  server::ServingLoop loop(model, *kv->pool, so, metrics, routed);
  const server::ServerOptions opts = server_options(a, keys.value(), operators.value());
  server::HttpServer http(model, *lm->tokenizer, tmpl.ok() ? &tmpl.value() : nullptr, loop, metrics, opts);
  Status st = http.bind();
  if (!st.ok()) return fail(st.error().message);
  print_serve_banner(a, model, kv.value(), draft->pool.get(), opts, http.port());
  http.start();
  drain_on_signal(a, http, stop_signals);
  auto down = [](const auto& ranks) { return std::any_of(ranks.begin(), ranks.end(), [](const auto& r) { return !r.up; }); };
  if (auto rs = loop.router_stats(); rs && (down(rs->ranks) || down(rs->decoders))) {
    // MPI_Finalize at exit would wait for the dead rank; the live ones leave on their timeout.
    fmt::print(stderr, "tandem serve: a rank died: leaving without MPI_Finalize\n");
    std::fflush(stderr);
    std::_Exit(0);
  }
  return 0;
}

}  // namespace

Command add_serve_command(CLI::App& app) {
  return subcommand(app, "serve", "OpenAI-compatible HTTP server with continuous batching and a paged KV cache", add_serve_options,
                    run_serve);
}

}  // namespace tandem::apps
