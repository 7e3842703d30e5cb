#include "server/request_prompt.h"

#include <fmt/format.h>

#include <random>

#include "chat/harmony_tools.h"
#include "chat/reasoning.h"
#include "engine/grammar/gbnf_parser.h"
#include "engine/grammar/json_schema.h"
#include "engine/grammar/token_terminal.h"
#include "server/access_policy.h"
#include "server/openai_json.h"
#include "server/tool_use.h"

namespace tandem::server {

namespace {

using ojson = nlohmann::ordered_json;

Result<std::shared_ptr<const grammar::Grammar>> compile_constraint(const ParsedRequest::OutputConstraint& c) {
  using Kind = ParsedRequest::OutputConstraint::Kind;
  switch (c.kind) {
    case Kind::JsonObject: return grammar::any_json_object_grammar();
    case Kind::JsonSchema: return grammar::grammar_from_json_schema(c.schema);
    case Kind::Gbnf: return grammar::parse_gbnf(c.gbnf);
    default: return make_error("no constraint");
  }
}

// Chat: the tools' format and constraint, then the template's text. Completions: the prompt.
std::optional<Rejection> render_prompt(EndpointContext& ctx, bool chat, PreparedRequest& out, RenderedPrompt* rendered) {
  ParsedRequest& pr = out.pr;
  if (!chat) {
    rendered->text = std::move(pr.prompt);
    return std::nullopt;
  }
  if (!ctx.chat) return Rejection{400, "this model has no usable chat template; use /v1/completions", ""};
  if (Status s = check_template_fields(*ctx.chat, pr); !s.ok()) return Rejection{400, s.error().message, "reasoning_effort"};
  auto format = tool_format_for(pr, *ctx.chat, &ctx.tok.vocab(), ctx.tool_format);
  if (!format.ok()) return Rejection{400, format.error().message, "tools"};
  // gpt-oss's harmony calls are parsed from its channels (chat/reasoning.h); a forced one is
  // written by a grammar of harmony's control tokens (chat/harmony_tools.h), which the
  // vocabulary must have (a gpt-oss template on another model's vocabulary has not).
  const bool harmony = pr.tools_active() && format->family != ToolCallFamily::Generic &&
                       detect_reasoning_format(ctx.chat->source()) == ReasoningFormat::Harmony;
  if (harmony && pr.tool_call_forced()) {
    if (const std::string missing = missing_harmony_call_token(ctx.tok.vocab()); !missing.empty())
      return Rejection{400,
                       fmt::format("tool_choice 'required' or a named function writes the call in the harmony (gpt-oss) "
                                   "format, whose control token {} this model's vocabulary lacks; use 'auto', or serve "
                                   "with --tool-format generic",
                                   missing),
                       "tool_choice"};
  }
  if (pr.tools_active()) {
    out.tools = ToolOutput{format->family, tool_marker_tokens(ctx.tok.vocab(), format->family)};
    // which format served the calls
    out.headers.emplace_back("X-Tandem-Tool-Format", harmony ? "harmony" : tool_call_family_name(format->family));
  }
  const Status forced = add_tool_call_constraint(
      &pr, format->family,
      [](const ojson& schema, const std::string& prefix) { return grammar::json_schema_to_gbnf(schema, prefix); }, harmony);
  if (!forced.ok()) return Rejection{400, forced.error().message, "tools"};
  auto r = render_chat_prompt(*ctx.chat, pr, true, format->family);
  if (!r.ok()) return Rejection{400, r.error().message, "messages"};
  *rendered = std::move(r.value());
  return std::nullopt;
}

// The constraint (response_format, grammar, a forced tool call) becomes the request's grammar
// here, on this worker thread: a large schema compiles without holding up the engine.
std::optional<Rejection> compile_request_constraint(EndpointContext& ctx, PreparedRequest& out) {
  const ParsedRequest& pr = out.pr;
  if (pr.constraint.kind == ParsedRequest::OutputConstraint::Kind::None) return std::nullopt;
  auto g = compile_constraint(pr.constraint);
  const std::string& n = pr.constraint.name;
  // A grammar that compiles can still be unusable: a token it names that the vocabulary lacks,
  // its start past the grammar budget, or no token of the vocabulary able to begin it. All are
  // the request's fault: a 400 here, not an error once it runs (the check warms the mask cache
  // for the first token).
  const auto masker = ctx.loop.masker();
  Status usable = g.ok() ? grammar::check_token_terminals(*g.value(), ctx.tok) : Status::Ok();
  if (g.ok() && usable.ok() && masker) usable = masker->check_start(g.value());
  if (!g.ok() || !usable.ok())
    return Rejection{400,
                     fmt::format("{}: {}", n == "grammar" || n == "tool_choice" ? "'" + n + "'" : "response_format",
                                 !g.ok() ? g.error().message : usable.error().message),
                     constraint_param(n)};
  out.params.grammar = g.value();
  return std::nullopt;
}

// The tokens, checked against the context, and the rest of what the scheduler runs.
std::optional<Rejection> tokenize_and_fill(EndpointContext& ctx, bool chat, const HttpRequest& req, const RenderedPrompt& rendered,
                                           PreparedRequest& out) {
  ParsedRequest& pr = out.pr;
  RequestParams& rp = out.params;
  const int64_t n_ctx = ctx.model.config().n_ctx_train;
  const char* prompt_param = chat ? "messages" : "prompt";
  // The tokenizer is immutable and thread-safe: each worker encodes on its own, outside any lock.
  rp.prompt = chat ? ctx.tok.encode_chat(rendered, ctx.allow_special_in_messages) : ctx.tok.encode(rendered.text, true, true);
  if ((int64_t)rp.prompt.size() >= n_ctx)
    return Rejection{400, fmt::format("the prompt has {} tokens; the model's context is {} tokens", rp.prompt.size(), n_ctx),
                     prompt_param};
  if (pr.max_tokens_given && (int64_t)rp.prompt.size() + pr.max_tokens > n_ctx)
    return Rejection{400,
                     fmt::format("prompt ({} tokens) + max_tokens ({}) exceeds the model's context of {} tokens",
                                 rp.prompt.size(), pr.max_tokens, n_ctx),
                     "max_tokens"};
  if (!pr.max_tokens_given && chat) pr.max_tokens = (int)(n_ctx - (int64_t)rp.prompt.size());
  rp.max_tokens = pr.max_tokens;
  rp.sampling = pr.sampling;
  if (!pr.ignore_eos) rp.stop_tokens = ctx.tok.vocab().end_of_generation;
  rp.want_logprobs = pr.logprobs;
  rp.top_logprobs = pr.logprobs ? pr.top_logprobs : 0;
  rp.speculative = pr.speculative;
  rp.cache_scope = cache_scope_for(ctx.cache_scope, ctx.keyed ? presented_key(req) : std::string_view(), pr.cache_salt);
  out.n_prompt = (int)rp.prompt.size();
  return std::nullopt;
}

}  // namespace

std::string constraint_param(const std::string& name) {
  return name == "grammar" || name == "tool_choice" ? name : "response_format";
}

std::variant<PreparedRequest, Rejection> prepare_request(EndpointContext& ctx, bool chat, const HttpRequest& req,
                                                         const std::string& tenant) {
  auto body = parse_json_body(req.body);
  if (!body.ok()) return Rejection{400, body.error().message, ""};
  std::string bad;
  auto parsed = parse_request(body.value(), chat, std::random_device{}(), &bad);
  if (!parsed.ok()) return Rejection{400, parsed.error().message, bad};
  return prepare_parsed(ctx, std::move(parsed.value()), req, tenant);
}

std::variant<PreparedRequest, Rejection> prepare_parsed(EndpointContext& ctx, ParsedRequest pr, const HttpRequest& req,
                                                        const std::string& tenant) {
  const bool chat = pr.chat;
  PreparedRequest out;
  out.pr = std::move(pr);
  out.params.tenant = tenant;
  RenderedPrompt rendered;  // chat: which bytes came from the request; completions: all the caller's
  if (auto no = render_prompt(ctx, chat, out, &rendered)) return *no;
  // Every token stands for at least one byte and at most the longest token's: a prompt this
  // long is past the context whatever it says, and is refused without tokenizing it.
  const int64_t n_ctx = ctx.model.config().n_ctx_train;
  if (rendered.text.size() > ctx.longest_token_bytes * (size_t)n_ctx)
    return Rejection{400,
                     fmt::format("the prompt is {} bytes, more than the model's context of {} tokens can hold (tokens here "
                                 "are at most {} bytes)",
                                 rendered.text.size(), n_ctx, ctx.longest_token_bytes),
                     chat ? "messages" : "prompt"};
  if (auto no = compile_request_constraint(ctx, out)) return *no;
  if (auto no = tokenize_and_fill(ctx, chat, req, rendered, out)) return *no;
  return out;
}

}  // namespace tandem::server
