#include "server/completion_run.h"

#include <fmt/format.h>

#include <ctime>
#include <algorithm>
#include <deque>
#include <optional>
#include <mutex>
#include <random>
#include <variant>

#include "chat/reasoning.h"
#include "chat/tool_calls.h"
#include "core/timer.h"
#include "server/access_policy.h"
#include "server/openai_json.h"
#include "server/openai_request.h"
#include "server/openai_response.h"
#include "server/request_prompt.h"
#include "server/text_stream.h"

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

HttpResponse json_response(int status, const ojson& body, const HttpHeaders& extra) {
  return {status, "application/json", dump_json(body), extra};
}

// A request between submission and its last byte. Engine events (on the engine thread) are
// queued; drain() handles them in order on a worker thread.
class CompletionRun : public std::enable_shared_from_this<CompletionRun> {
 public:
  CompletionRun(EndpointContext& ctx, ParsedRequest pr, int n_prompt, std::unique_ptr<AnswerWire> wire, std::shared_ptr<ResponseWriter> w,
                HttpHeaders extra, std::string tenant, std::optional<ToolOutput> tools = std::nullopt)
      : ctx_(ctx), work_(ctx.work), pr_(std::move(pr)), n_prompt_(n_prompt), wire_(std::move(wire)), w_(std::move(w)),
        extra_(std::move(extra)), tenant_(std::move(tenant)), text_(pr_.stop), tool_output_(std::move(tools)) {
    const ReasoningFormat rf = pr_.chat && ctx.chat ? detect_reasoning_format(ctx.chat->source()) : ReasoningFormat::None;
    // Harmony's calls are messages to functions.NAME: its parser reads them, not the family's
    // (but for the generic format, whose calls are the constrained answer's JSON).
    harmony_ = rf == ReasoningFormat::Harmony && !(tool_output_ && tool_output_->family == ToolCallFamily::Generic);
    if (tool_output_ && !harmony_)
      tool_stream_ = std::make_unique<ToolCallStream>(tool_output_->family, pr_.parallel_tool_calls ? SIZE_MAX : 1);
    if (rf != ReasoningFormat::None) {
      for (const std::string& m : reasoning_markers(rf))
        if (int32_t id = ctx.tok.vocab().find(m); id >= 0) reasoning_markers_.push_back(id);
    }
    reasoning_format_ = rf;
  }

  void submit(RequestParams rp) {
    if (reasoning_format_ != ReasoningFormat::None) {
      // The prompt's last tokens say whether the template opened the reasoning ("<think>").
      std::string tail;
      for (size_t k = rp.prompt.size() > 4 ? rp.prompt.size() - 4 : 0; k < rp.prompt.size(); k++)
        tail += ctx_.tok.token_to_piece(rp.prompt[k], true);
      reasoning_ = std::make_unique<ReasoningStream>(reasoning_format_, tail);
    }
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
    const std::string piece = ctx_.tok.token_to_piece(e.token, is_tool_marker(e.token) || is_reasoning_marker(e.token));
    std::string text = text_.push(piece);
    if (text_.stopped()) ctx_.loop.cancel(id_);
    std::vector<ToolCall> calls;
    std::string reasoning;
    if (reasoning_) split_reasoning(reasoning_->push(text), &text, &reasoning, &calls);
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
    answer_.text += text;
    answer_.reasoning += reasoning;
    if (!pr_.stream) {
      add_calls(std::move(calls));
      if (pr_.logprobs) answer_.logprobs.push_back(std::move(lp));
      return;
    }
    if (!reasoning.empty()) send(wire_->reasoning(reasoning));
    if (!text.empty() || pr_.logprobs) send(wire_->text(text, pr_.logprobs ? &lp : nullptr));
    send_calls(std::move(calls));
  }

  bool is_reasoning_marker(int32_t token) const {
    return std::find(reasoning_markers_.begin(), reasoning_markers_.end(), token) != reasoning_markers_.end();
  }

  // The reasoning parser's output: its content replaces `text`; Harmony's calls count only when
  // the request offered tools (parallel_tool_calls false: the first one ends the answer).
  void split_reasoning(ReasoningOutput o, std::string* text, std::string* reasoning, std::vector<ToolCall>* calls) {
    *text = std::move(o.content);
    *reasoning = std::move(o.reasoning);
    if (!tool_output_ || !harmony_) return;
    for (ToolCall& c : o.calls) {
      if (!pr_.parallel_tool_calls && n_harmony_calls_ >= 1) break;
      n_harmony_calls_++;
      calls->push_back(std::move(c));
    }
    if (!pr_.parallel_tool_calls && n_harmony_calls_ >= 1 && !calls_complete_) {
      calls_complete_ = true;
      ctx_.loop.cancel(id_);
    }
  }

  bool is_tool_marker(int32_t token) const {
    return tool_output_ && std::find(tool_output_->marker_tokens.begin(), tool_output_->marker_tokens.end(), token) !=
                               tool_output_->marker_tokens.end();
  }

  void add_calls(std::vector<ToolCall> calls) {
    for (ToolCall& c : calls)
      answer_.tool_calls.push_back(tool_call_json(std::move(c), make_tool_call_id(tool_output_->family, id_rng_)));
  }

  void send_calls(std::vector<ToolCall> calls) {
    if (calls.empty()) return;
    const size_t first = answer_.tool_calls.size();
    add_calls(std::move(calls));
    const std::vector<ojson> added(answer_.tool_calls.begin() + (ptrdiff_t)first, answer_.tool_calls.end());
    send(wire_->calls(added, first));
  }

  void on_accepted(Result<int64_t>& id) {
    if (!id.ok()) {
      ctx_.metrics.request_rejected(tenant_);
      done_ = true;
      return w_->respond(json_response(400, wire_->error(id.error().message, "invalid_request_error", ""), extra_));
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
    wire_->set_engine_id(id_);
    if (!pr_.stream) return;
    HttpHeaders h = extra_;
    h.emplace_back("Cache-Control", "no-cache");
    w_->begin_stream(200, "text/event-stream", std::move(h));
    send(wire_->open());
  }

  void on_finish(const SeqEvent& e) {
    done_ = true;
    n_cached_ = e.n_cached;
    std::string reason = finish_name(e.finish, text_.stopped() || calls_complete_);
    ctx_.metrics.request_finished(reason, tenant_, e.n_prompt, e.n_cached, e.n_generated);
    if (e.finish == FinishReason::Error) return fail(e.error, e.over_budget);
    std::string rest = text_.flush();
    std::vector<ToolCall> calls;
    std::string reasoning;
    if (reasoning_) {
      ReasoningOutput o = reasoning_->push(rest), end = reasoning_->finish();
      o.content += end.content;
      o.reasoning += end.reasoning;
      for (ToolCall& c : end.calls) o.calls.push_back(std::move(c));
      split_reasoning(std::move(o), &rest, &reasoning, &calls);
      if (reason == "stop" && n_harmony_calls_ > 0) reason = "tool_calls";
    }
    if (tool_stream_) {
      ToolCallOutput o = tool_stream_->push(rest);
      ToolCallOutput end = tool_stream_->finish();
      rest = o.content + end.content;
      calls = std::move(o.calls);
      for (ToolCall& c : end.calls) calls.push_back(std::move(c));
      if (reason == "stop" && tool_stream_->calls_so_far() > 0) reason = "tool_calls";
    }
    answer_.finish = reason;
    answer_.stop_sequence = text_.matched_stop();
    answer_.usage = {n_prompt_, completion_tokens_, n_cached_};
    answer_.text += rest;
    answer_.reasoning += reasoning;
    if (!pr_.stream) {
      add_calls(std::move(calls));
      return w_->respond(json_response(200, wire_->whole(answer_), extra_));
    }
    if (!reasoning.empty()) send(wire_->reasoning(reasoning));
    if (!rest.empty()) send(wire_->text(rest, nullptr));
    send_calls(std::move(calls));
    send(wire_->close(answer_));
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
    const ojson err = over_budget ? wire_->error(message, "invalid_request_error", constraint_param(pr_.constraint.name))
                                  : wire_->error(message, shutdown ? "service_unavailable" : "server_error", "");
    if (!pr_.stream || !started_) {
      HttpResponse r = json_response(over_budget ? 400 : shutdown ? 503 : 500, err, extra_);
      if (shutdown) r.headers.emplace_back("Retry-After", "5");
      return w_->respond(std::move(r));
    }
    send(wire_->stream_error(err));
    w_->end_stream();
  }

  void send(std::string events) {
    if (!events.empty()) w_->write(std::move(events));
  }

  EndpointContext& ctx_;
  std::shared_ptr<WorkQueue> work_;
  const ParsedRequest pr_;
  const int n_prompt_;
  std::unique_ptr<AnswerWire> wire_;  // the API's JSON
  std::shared_ptr<ResponseWriter> w_;
  const HttpHeaders extra_;
  const std::string tenant_;  // the API key's tenant ("" without keys): metrics per key
  Timer since_arrival_;

  std::mutex mu_;  // guards the four below
  std::deque<Item> inbox_;
  bool drain_posted_ = false, gone_ = false;
  int64_t id_ = 0;

  // Worker-side state (one drain at a time).
  TextStream text_;
  Answer answer_;  // the text, reasoning and calls so far (and logprobs of a whole answer)
  int completion_tokens_ = 0, n_cached_ = 0;
  double last_token_s_ = -1;
  bool done_ = false, started_ = false;
  // Tools active: the parser of the answer, the source of the calls' ids.
  std::optional<ToolOutput> tool_output_;
  std::unique_ptr<ToolCallStream> tool_stream_;
  std::mt19937_64 id_rng_{std::random_device{}()};
  bool calls_complete_ = false;  // parallel_tool_calls false and the one call has come
  // A template with reasoning (chat/reasoning.h): its parser, the marker tokens rendered as
  // text for it.
  ReasoningFormat reasoning_format_ = ReasoningFormat::None;
  bool harmony_ = false;  // harmony, and its calls are read from its channels (not the generic format)
  std::unique_ptr<ReasoningStream> reasoning_;
  std::vector<int32_t> reasoning_markers_;
  size_t n_harmony_calls_ = 0;
};

}  // namespace

void start_completion(EndpointContext& ctx, PreparedRequest&& p, std::unique_ptr<AnswerWire> wire, std::shared_ptr<ResponseWriter> w,
                      HttpHeaders extra, const std::string& tenant) {
  extra.insert(extra.end(), p.headers.begin(), p.headers.end());
  auto run = std::make_shared<CompletionRun>(ctx, std::move(p.pr), p.n_prompt, std::move(wire), std::move(w), std::move(extra), tenant,
                                             std::move(p.tools));
  run->submit(std::move(p.params));
}

void run_completion(EndpointContext& ctx, bool chat, const HttpRequest& req, std::shared_ptr<ResponseWriter> w, HttpHeaders extra) {
  // The key's tenant: its metrics, and its fair share of the engine's admission and prefill.
  const std::string tenant = ctx.access ? ctx.access->match_key(req).tenant : std::string();
  auto prepared = prepare_request(ctx, chat, req, tenant);
  if (auto* no = std::get_if<Rejection>(&prepared)) {
    ctx.metrics.request_rejected(tenant);
    return w->respond(json_response(no->status, error_body(no->message, "invalid_request_error", no->param), extra));
  }
  PreparedRequest& p = std::get<PreparedRequest>(prepared);
  auto wire = std::make_unique<ChatCompletionsWire>(chat, ctx.model_name, p.pr.include_usage, p.pr.top_logprobs > 0);
  start_completion(ctx, std::move(p), std::move(wire), std::move(w), std::move(extra), tenant);
}

}  // namespace tandem::server
