#include "server/completion_run.h"

#include <fmt/format.h>

#include <ctime>
#include <algorithm>
#include <deque>
#include <optional>
#include <mutex>
#include <random>

#include "chat/tool_calls.h"
#include "core/timer.h"
#include "engine/grammar/gbnf_parser.h"
#include "engine/grammar/json_schema.h"
#include "server/access_policy.h"
#include "server/openai_json.h"
#include "server/openai_request.h"
#include "server/text_stream.h"
#include "server/tool_use.h"

namespace tandem::server {

Result<PrefixCacheScope> parse_prefix_cache_scope(std::string_view name) {
  if (name == "global") return PrefixCacheScope::Global;
  if (name == "key") return PrefixCacheScope::Key;
  if (name == "request") return PrefixCacheScope::Request;
  return make_error("the prefix cache scope must be global, key or request, not '{}'", name);
}

std::string cache_scope_for(PrefixCacheScope scope, std::string_view api_key, std::string_view salt) {
  if (scope == PrefixCacheScope::Request) {
    // Unique for the process's life; the pool hashes it under its secret key.
    static std::atomic<uint64_t> next{1};
    return fmt::format("request:{}", next++);
  }
  std::string name;
  if (scope == PrefixCacheScope::Key && !api_key.empty()) name = fmt::format("key:{}:{}", api_key.size(), api_key);
  if (!salt.empty()) name += fmt::format("salt:{}:{}", salt.size(), salt);
  return name;
}

size_t longest_token_bytes(const Tokenizer& tok) {
  size_t longest = 1;
  for (int32_t id = 0; id < tok.vocab().size(); id++) longest = std::max(longest, tok.token_to_piece(id, true).size());
  return longest;
}

namespace {

std::string finish_name(FinishReason r, bool stopped_by_string) {
  if (stopped_by_string || r == FinishReason::Stop) return "stop";
  // Length covers max_tokens, the context, and a request cut short because KV blocks ran out.
  return r == FinishReason::Length ? "length" : r == FinishReason::Error ? "error" : "cancelled";
}

// The request parameter a constraint came from (OutputConstraint::name: a schema's name,
// "json_object", "grammar" or "tool_choice").
std::string constraint_param(const std::string& name) {
  return name == "grammar" || name == "tool_choice" ? name : "response_format";
}

HttpResponse json_response(int status, const ojson& body, const HttpHeaders& extra) {
  return {status, "application/json", dump_json(body), extra};
}

// How a chat answer with tools active is read: the family's parser, and the marker tokens
// rendered as text for it.
struct ToolOutput {
  ToolCallFamily family = ToolCallFamily::Hermes;
  std::vector<int32_t> marker_tokens;
};

// A request between submission and its last byte. Engine events (on the engine thread) are
// queued; drain() handles them in order on a worker thread.
class CompletionRun : public std::enable_shared_from_this<CompletionRun> {
 public:
  CompletionRun(EndpointContext& ctx, bool chat, ParsedRequest pr, int n_prompt, std::shared_ptr<ResponseWriter> w, HttpHeaders extra,
                std::string tenant, std::optional<ToolOutput> tools = std::nullopt)
      : ctx_(ctx), work_(ctx.work), chat_(chat), pr_(std::move(pr)), n_prompt_(n_prompt), w_(std::move(w)), extra_(std::move(extra)),
        tenant_(std::move(tenant)), text_(pr_.stop), tool_output_(std::move(tools)) {
    if (tool_output_)
      tool_stream_ = std::make_unique<ToolCallStream>(tool_output_->family, pr_.parallel_tool_calls ? SIZE_MAX : 1);
  }

  void submit(RequestParams rp) {
    auto self = shared_from_this();
    w_->on_gone([self] { self->client_left(); });
    ctx_.loop.submit(
        std::move(rp), [self](const SeqEvent& e) { return self->enqueue(Item{false, make_error(""), e, self->since_arrival_.seconds()}); },
        [self](Result<int64_t> id) { self->enqueue(Item{true, std::move(id), {}, 0}); });
  }

 private:
  struct Item {
    bool accepted;
    Result<int64_t> id;
    SeqEvent e;
    double at_s;  // when the engine produced it
  };

  // Engine thread: must not block. False tells the engine to drop the sequence.
  bool enqueue(Item it) {
    bool post = false, gone = false;
    {
      std::lock_guard<std::mutex> l(mu_);
      inbox_.push_back(std::move(it));
      post = !drain_posted_;
      drain_posted_ = true;
      gone = gone_;
    }
    // Drained even when the client left: the finish event still counts in /metrics.
    if (post && !work_->post([self = shared_from_this()] { self->drain(); })) {
      std::lock_guard<std::mutex> l(mu_);
      gone_ = true;  // the server is stopping
      return false;
    }
    return !gone;
  }

  // io thread: the transport saw the client leave.
  void client_left() {
    int64_t id;
    {
      std::lock_guard<std::mutex> l(mu_);
      gone_ = true;
      id = id_;
    }
    if (id > 0) ctx_.loop.cancel(id);
  }

  void drain() {
    while (true) {
      std::deque<Item> items;
      {
        std::lock_guard<std::mutex> l(mu_);
        if (inbox_.empty()) {
          drain_posted_ = false;
          return;
        }
        items.swap(inbox_);
      }
      for (Item& it : items) {
        if (done_) continue;
        try {
          handle(it);
        } catch (const std::exception& e) {
          fail(fmt::format("internal error: {}", e.what()));
        }
      }
    }
  }

  void handle(Item& it) {
    if (it.accepted) return on_accepted(it.id);
    const SeqEvent& e = it.e;
    if (e.finish != FinishReason::None) return on_finish(e);
    if (last_token_s_ < 0) ctx_.metrics.observe_ttft(it.at_s, tenant_);
    else ctx_.metrics.observe_tpot(it.at_s - last_token_s_, tenant_);
    last_token_s_ = it.at_s;
    if (text_.stopped() || calls_complete_) return;  // tokens the engine made before it saw our cancel
    completion_tokens_++;
    const std::string piece = ctx_.tok.token_to_piece(e.token, is_tool_marker(e.token));
    std::string text = text_.push(piece);
    if (text_.stopped()) ctx_.loop.cancel(id_);
    std::vector<ToolCall> calls;
    if (tool_stream_) {
      ToolCallOutput o = tool_stream_->push(text);
      text = std::move(o.content);
      calls = std::move(o.calls);
      // parallel_tool_calls false: the answer ends with its first call.
      if (tool_stream_->saturated() && !calls_complete_) {
        calls_complete_ = true;
        ctx_.loop.cancel(id_);
      }
    }
    TokenLogprob lp;
    if (pr_.logprobs) {
      lp.bytes = piece;
      lp.logprob = e.logprob;
      for (const auto& [tid, l] : e.top_logprobs)
        if ((int)lp.top.size() < pr_.top_logprobs) lp.top.emplace_back(ctx_.tok.token_to_piece(tid), l);
    }
    if (!pr_.stream) {
      text_out_ += text;
      add_calls(std::move(calls));
      if (pr_.logprobs) logprobs_.push_back(std::move(lp));
      return;
    }
    if (!text.empty() || pr_.logprobs) {
      ojson lj = nullptr;
      if (pr_.logprobs) lj = chat_ ? chat_logprobs({lp}) : completion_logprobs({lp}, pr_.top_logprobs > 0, streamed_bytes_);
      streamed_bytes_ += lp.bytes.size();
      send(chunk(text, lj, nullptr, false));
    }
    send_calls(std::move(calls));
  }

  bool is_tool_marker(int32_t token) const {
    return tool_output_ && std::find(tool_output_->marker_tokens.begin(), tool_output_->marker_tokens.end(), token) !=
                               tool_output_->marker_tokens.end();
  }

  void add_calls(std::vector<ToolCall> calls) {
    for (ToolCall& c : calls) {
      ojson j = {{"id", make_tool_call_id(tool_output_->family, id_rng_)},
                 {"type", "function"},
                 {"function", {{"name", std::move(c.name)}, {"arguments", std::move(c.arguments)}}}};
      tool_calls_.push_back(std::move(j));
    }
  }

  // Each call as OpenAI streams one: its id, type and name with empty arguments, then the arguments.
  void send_calls(std::vector<ToolCall> calls) {
    const size_t first = tool_calls_.size();
    add_calls(std::move(calls));
    for (size_t i = first; i < tool_calls_.size(); i++) {
      const ojson& c = tool_calls_[i];
      ojson head = {{"index", i}, {"id", c["id"]}, {"type", "function"}, {"function", {{"name", c["function"]["name"]}, {"arguments", ""}}}};
      send(delta_chunk({{"tool_calls", ojson::array({head})}}, nullptr));
      ojson args = {{"index", i}, {"function", {{"arguments", c["function"]["arguments"]}}}};
      send(delta_chunk({{"tool_calls", ojson::array({args})}}, nullptr));
    }
  }

  void on_accepted(Result<int64_t>& id) {
    if (!id.ok()) {
      ctx_.metrics.request_rejected(tenant_);
      done_ = true;
      return w_->respond(json_response(400, error_body(id.error().message, "invalid_request_error"), extra_));
    }
    bool gone;
    {
      std::lock_guard<std::mutex> l(mu_);
      id_ = id.value();
      gone = gone_;
    }
    ctx_.metrics.request_started(tenant_);
    started_ = true;
    if (gone) ctx_.loop.cancel(id_);
    rid_ = fmt::format("{}-{}", chat_ ? "chatcmpl" : "cmpl", id_);
    if (!pr_.stream) return;
    HttpHeaders h = extra_;
    h.emplace_back("Cache-Control", "no-cache");
    w_->begin_stream(200, "text/event-stream", std::move(h));
    send(chunk("", nullptr, nullptr, true));  // the role chunk (chat), an empty text chunk (completions)
  }

  void on_finish(const SeqEvent& e) {
    done_ = true;
    n_cached_ = e.n_cached;
    std::string reason = finish_name(e.finish, text_.stopped() || calls_complete_);
    ctx_.metrics.request_finished(reason, tenant_, e.n_prompt, e.n_cached, e.n_generated);
    if (e.finish == FinishReason::Error) return fail(e.error, e.over_budget);
    std::string rest = text_.flush();
    std::vector<ToolCall> calls;
    if (tool_stream_) {
      ToolCallOutput o = tool_stream_->push(rest);
      ToolCallOutput end = tool_stream_->finish();
      rest = o.content + end.content;
      calls = std::move(o.calls);
      for (ToolCall& c : end.calls) calls.push_back(std::move(c));
      if (reason == "stop" && tool_stream_->calls_so_far() > 0) reason = "tool_calls";
    }
    if (!pr_.stream) {
      add_calls(std::move(calls));
      ojson choice = {{"index", 0}};
      if (chat_) {
        const std::string content = text_out_ + rest;
        // With calls and no text, content is null, as OpenAI answers.
        choice["message"] = {{"role", "assistant"}, {"content", content.empty() && !tool_calls_.empty() ? ojson(nullptr) : ojson(content)}};
        if (!tool_calls_.empty()) choice["message"]["tool_calls"] = tool_calls_;
      } else {
        choice["text"] = text_out_ + rest;
      }
      choice["logprobs"] = !pr_.logprobs ? ojson(nullptr) : chat_ ? chat_logprobs(logprobs_) : completion_logprobs(logprobs_, pr_.top_logprobs > 0);
      choice["finish_reason"] = reason;
      return w_->respond(json_response(200, envelope(chat_ ? "chat.completion" : "text_completion", ojson::array({choice}), true), extra_));
    }
    if (!rest.empty()) send(chunk(rest, nullptr, nullptr, false));
    send_calls(std::move(calls));
    send(chunk("", nullptr, reason, false));
    if (pr_.include_usage) send(envelope(chat_ ? "chat.completion.chunk" : "text_completion", ojson::array(), true));
    w_->write("data: [DONE]\n\n");
    w_->end_stream();
  }

  // Whatever went wrong, the client gets an answer: a 500, or an error event that ends the stream.
  // A stream ends with the error event, then [DONE], so that a client reading to [DONE] sees why.
  // While the server drains, an error is the shutdown's: 503 with Retry-After.
  // A grammar over its cost budget is the request's fault: 400 (invalid_request_error) naming
  // the constraint's parameter.
  void fail(const std::string& message, bool over_budget = false) {
    if (!done_ && started_) ctx_.loop.cancel(id_);
    done_ = true;
    const bool shutdown = ctx_.draining && ctx_.draining->load();
    const ojson err = over_budget ? error_body(message, "invalid_request_error", constraint_param(pr_.constraint.name))
                                  : error_body(message, shutdown ? "service_unavailable" : "server_error");
    if (!pr_.stream || !started_) {
      HttpResponse r = json_response(over_budget ? 400 : shutdown ? 503 : 500, err, extra_);
      if (shutdown) r.headers.emplace_back("Retry-After", "5");
      return w_->respond(std::move(r));
    }
    w_->write("data: " + dump_json(err) + "\n\n");
    w_->write("data: [DONE]\n\n");
    w_->end_stream();
  }

  ojson envelope(const char* object, ojson choices, bool usage) const {
    ojson j = {{"id", rid_}, {"object", object}, {"created", created_}, {"model", ctx_.model_name}, {"choices", std::move(choices)}};
    if (usage)
      // cached_tokens: prompt tokens the prefix cache gave, within this request's cache scope only.
      j["usage"] = {{"prompt_tokens", n_prompt_},
                    {"completion_tokens", completion_tokens_},
                    {"total_tokens", n_prompt_ + completion_tokens_},
                    {"prompt_tokens_details", {{"cached_tokens", n_cached_}}}};
    return j;
  }

  // A chat chunk with this delta (tool calls).
  ojson delta_chunk(ojson delta, const ojson& finish) const {
    ojson choice = {{"index", 0}, {"delta", std::move(delta)}, {"logprobs", nullptr}, {"finish_reason", finish}};
    return envelope("chat.completion.chunk", ojson::array({choice}), false);
  }

  ojson chunk(const std::string& text, const ojson& logprob, const ojson& finish, bool first) const {
    ojson choice = {{"index", 0}};
    if (chat_) {
      ojson delta = ojson::object();
      if (first) delta["role"] = "assistant";
      if (!text.empty() || first) delta["content"] = text;
      choice["delta"] = delta;
    } else {
      choice["text"] = text;
    }
    choice["logprobs"] = logprob;
    choice["finish_reason"] = finish;
    return envelope(chat_ ? "chat.completion.chunk" : "text_completion", ojson::array({choice}), false);
  }

  void send(const ojson& j) { w_->write("data: " + dump_json(j) + "\n\n"); }

  EndpointContext& ctx_;
  std::shared_ptr<WorkQueue> work_;
  const bool chat_;
  const ParsedRequest pr_;
  const int n_prompt_;
  std::shared_ptr<ResponseWriter> w_;
  const HttpHeaders extra_;
  const std::string tenant_;  // the API key's tenant ("" without keys): metrics per key
  Timer since_arrival_;
  const int64_t created_ = (int64_t)std::time(nullptr);

  std::mutex mu_;  // guards the four below
  std::deque<Item> inbox_;
  bool drain_posted_ = false, gone_ = false;
  int64_t id_ = 0;

  // Worker-side state (one drain at a time).
  TextStream text_;
  std::string rid_, text_out_;
  std::vector<TokenLogprob> logprobs_;
  int completion_tokens_ = 0, n_cached_ = 0;
  size_t streamed_bytes_ = 0;
  double last_token_s_ = -1;
  bool done_ = false, started_ = false;
  // Tools active: the parser of the answer, the calls so far (OpenAI's JSON), their ids' source.
  std::optional<ToolOutput> tool_output_;
  std::unique_ptr<ToolCallStream> tool_stream_;
  ojson tool_calls_ = ojson::array();
  std::mt19937_64 id_rng_{std::random_device{}()};
  bool calls_complete_ = false;  // parallel_tool_calls false and the one call has come
};

Result<std::shared_ptr<const grammar::Grammar>> compile_constraint(const ParsedRequest::OutputConstraint& c) {
  using Kind = ParsedRequest::OutputConstraint::Kind;
  switch (c.kind) {
    case Kind::JsonObject: return grammar::any_json_object_grammar();
    case Kind::JsonSchema: return grammar::grammar_from_json_schema(c.schema);
    case Kind::Gbnf: return grammar::parse_gbnf(c.gbnf);
    default: return make_error("no constraint");
  }
}

}  // namespace

void run_completion(EndpointContext& ctx, bool chat, const HttpRequest& req, std::shared_ptr<ResponseWriter> w, HttpHeaders extra) {
  const char* prompt_param = chat ? "messages" : "prompt";
  // The key's tenant: its metrics, and its fair share of the engine's admission and prefill.
  const std::string tenant = ctx.access ? ctx.access->match_key(req).tenant : std::string();
  auto reject = [&](int status, const std::string& message, const std::string& param = "") {
    ctx.metrics.request_rejected(tenant);
    w->respond(json_response(status, error_body(message, "invalid_request_error", param), extra));
  };
  auto body = parse_json_body(req.body);
  if (!body.ok()) return reject(400, body.error().message);
  std::string bad;
  auto parsed = parse_request(body.value(), chat, std::random_device{}(), &bad);
  if (!parsed.ok()) return reject(400, parsed.error().message, bad);
  ParsedRequest pr = std::move(parsed.value());
  if (chat && !ctx.chat) return reject(400, "this model has no usable chat template; use /v1/completions");
  RenderedPrompt rendered;  // chat: which bytes came from the request; completions: all the caller's
  std::optional<ToolOutput> tool_output;
  if (chat) {
    auto format = tool_format_for(pr, *ctx.chat, &ctx.tok.vocab(), ctx.tool_format);
    if (!format.ok()) return reject(400, format.error().message, "tools");
    if (pr.tools_active()) {
      tool_output = ToolOutput{format->family, tool_marker_tokens(ctx.tok.vocab(), format->family)};
      extra.emplace_back("X-Tandem-Tool-Format", tool_call_family_name(format->family));  // which format served the calls
    }
    const Status forced = add_tool_call_constraint(&pr, format->family, [](const ojson& schema, const std::string& prefix) {
      return grammar::json_schema_to_gbnf(schema, prefix);
    });
    if (!forced.ok()) return reject(400, forced.error().message, "tools");
    auto r = render_chat_prompt(*ctx.chat, pr, true, format->family);
    if (!r.ok()) return reject(400, r.error().message, "messages");
    rendered = std::move(r.value());
  } else {
    rendered.text = std::move(pr.prompt);
  }
  const std::string& text = rendered.text;
  const int64_t n_ctx = ctx.model.config().n_ctx_train;
  // Every token stands for at least one byte and at most the longest token's: a prompt this
  // long is past the context whatever it says, and is refused without tokenizing it.
  if (text.size() > ctx.longest_token_bytes * (size_t)n_ctx)
    return reject(400,
                  fmt::format("the prompt is {} bytes, more than the model's context of {} tokens can hold (tokens here are at "
                              "most {} bytes)",
                              text.size(), n_ctx, ctx.longest_token_bytes),
                  prompt_param);
  // The constraint (response_format, grammar, a forced tool call) becomes the request's
  // grammar here, on this worker thread: a large schema compiles without holding up the engine.
  std::shared_ptr<const grammar::Grammar> constraint;
  if (pr.constraint.kind != ParsedRequest::OutputConstraint::Kind::None) {
    auto g = compile_constraint(pr.constraint);
    const std::string& n = pr.constraint.name;
    // A grammar that compiles can still be unusable: its start past the grammar budget, or no
    // token of the vocabulary able to begin it. Both are the request's fault: a 400 here, not
    // an error once it runs (the check warms the mask cache for the first token).
    const auto masker = ctx.loop.masker();
    Status usable = g.ok() && masker ? masker->check_start(g.value()) : Status::Ok();
    if (!g.ok() || !usable.ok())
      return reject(400,
                    fmt::format("{}: {}", n == "grammar" || n == "tool_choice" ? "'" + n + "'" : "response_format",
                                !g.ok() ? g.error().message : usable.error().message),
                    constraint_param(n));
    constraint = g.value();
  }
  RequestParams rp;
  // The tokenizer is immutable and thread-safe: each worker encodes on its own, outside any lock.
  rp.prompt = chat ? ctx.tok.encode_chat(rendered, ctx.allow_special_in_messages) : ctx.tok.encode(text, true, true);
  if ((int64_t)rp.prompt.size() >= n_ctx)
    return reject(400, fmt::format("the prompt has {} tokens; the model's context is {} tokens", rp.prompt.size(), n_ctx), prompt_param);
  if (pr.max_tokens_given && (int64_t)rp.prompt.size() + pr.max_tokens > n_ctx)
    return reject(400,
                  fmt::format("prompt ({} tokens) + max_tokens ({}) exceeds the model's context of {} tokens", rp.prompt.size(),
                              pr.max_tokens, n_ctx),
                  "max_tokens");
  if (!pr.max_tokens_given && chat) pr.max_tokens = (int)(n_ctx - (int64_t)rp.prompt.size());
  rp.max_tokens = pr.max_tokens;
  rp.sampling = pr.sampling;
  if (!pr.ignore_eos) rp.stop_tokens = ctx.tok.vocab().end_of_generation;
  rp.want_logprobs = pr.logprobs;
  rp.top_logprobs = pr.logprobs ? pr.top_logprobs : 0;
  rp.speculative = pr.speculative;
  rp.grammar = constraint;
  rp.cache_scope = cache_scope_for(ctx.cache_scope, ctx.keyed ? bearer_token(req) : std::string_view(), pr.cache_salt);
  rp.tenant = tenant;
  const int n_prompt = (int)rp.prompt.size();
  auto run = std::make_shared<CompletionRun>(ctx, chat, std::move(pr), n_prompt, std::move(w), std::move(extra), tenant,
                                           std::move(tool_output));
  run->submit(std::move(rp));
}

}  // namespace tandem::server
