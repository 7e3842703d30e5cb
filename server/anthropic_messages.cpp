#include "server/anthropic_messages.h"

#include <fmt/format.h>

#include <random>

#include "server/access_policy.h"
#include "server/anthropic_request.h"
#include "server/request_prompt.h"

namespace tandem::server {

namespace {

std::string stop_reason(const Answer& a) {
  if (a.finish == "length") return "max_tokens";
  if (a.finish == "tool_calls") return "tool_use";
  return a.stop_sequence.empty() ? "end_turn" : "stop_sequence";
}

// Anthropic counts input_tokens apart from those read from its cache.
ojson usage_json(const TokenUsage& u) {
  return {{"input_tokens", u.prompt - u.cached},
          {"output_tokens", u.completion},
          {"cache_creation_input_tokens", 0},
          {"cache_read_input_tokens", u.cached}};
}

// A call's arguments (a JSON object as text) as tool_use's input object.
ojson call_input(const ojson& call) {
  ojson input = ojson::parse(call["function"]["arguments"].get<std::string>(), nullptr, false);
  return input.is_object() ? input : ojson::object();
}

std::string event(const ojson& data) { return sse_event(data, data["type"].get<std::string>()); }

}  // namespace

ojson anthropic_error(const std::string& message, const std::string& openai_type) {
  std::string type = openai_type;
  if (type == "server_error") type = "api_error";
  else if (type == "service_unavailable") type = "overloaded_error";
  return {{"type", "error"}, {"error", {{"type", type}, {"message", message}}}};
}

void AnthropicWire::set_engine_id(int64_t) {
  std::mt19937_64 rng{std::random_device{}()};
  id_ = fmt::format("msg_{:016x}{:08x}", rng(), (uint32_t)rng());
}

ojson AnthropicWire::error(const std::string& message, const std::string& type, const std::string&) const {
  return anthropic_error(message, type);
}

ojson AnthropicWire::whole(const Answer& a) {
  ojson content = ojson::array();
  if (!a.reasoning.empty()) content.push_back({{"type", "thinking"}, {"thinking", a.reasoning}, {"signature", ""}});
  if (!a.text.empty() || a.tool_calls.empty()) content.push_back({{"type", "text"}, {"text", a.text}});
  for (const ojson& call : a.tool_calls)
    content.push_back({{"type", "tool_use"}, {"id", call["id"]}, {"name", call["function"]["name"]}, {"input", call_input(call)}});
  return {{"id", id_},
          {"type", "message"},
          {"role", "assistant"},
          {"model", model_},
          {"content", std::move(content)},
          {"stop_reason", stop_reason(a)},
          {"stop_sequence", a.stop_sequence.empty() ? ojson(nullptr) : ojson(a.stop_sequence)},
          {"usage", usage_json(a.usage)}};
}

std::string AnthropicWire::open() {
  const ojson message = {{"id", id_},
                         {"type", "message"},
                         {"role", "assistant"},
                         {"model", model_},
                         {"content", ojson::array()},
                         {"stop_reason", nullptr},
                         {"stop_sequence", nullptr},
                         {"usage", usage_json({n_prompt_, 0, 0})}};
  return event({{"type", "message_start"}, {"message", message}}) + event({{"type", "ping"}});
}

std::string AnthropicWire::open_block(Block kind) {
  if (open_ == kind) return {};
  std::string out = close_block();
  open_ = kind;
  const ojson block = kind == Block::Text ? ojson{{"type", "text"}, {"text", ""}} : ojson{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}};
  return out + event({{"type", "content_block_start"}, {"index", next_index_}, {"content_block", block}});
}

std::string AnthropicWire::close_block() {
  if (open_ == Block::None) return {};
  open_ = Block::None;
  return event({{"type", "content_block_stop"}, {"index", next_index_++}});
}

std::string AnthropicWire::text(const std::string& text, const TokenLogprob*) {
  if (text.empty()) return {};
  std::string out = open_block(Block::Text);
  return out + event({{"type", "content_block_delta"}, {"index", next_index_}, {"delta", {{"type", "text_delta"}, {"text", text}}}});
}

std::string AnthropicWire::reasoning(const std::string& text) {
  std::string out = open_block(Block::Thinking);
  return out + event({{"type", "content_block_delta"}, {"index", next_index_}, {"delta", {{"type", "thinking_delta"}, {"thinking", text}}}});
}

std::string AnthropicWire::calls(const std::vector<ojson>& added, size_t) {
  std::string out = close_block();
  for (const ojson& call : added) {
    const ojson block = {{"type", "tool_use"}, {"id", call["id"]}, {"name", call["function"]["name"]}, {"input", ojson::object()}};
    out += event({{"type", "content_block_start"}, {"index", next_index_}, {"content_block", block}});
    out += event({{"type", "content_block_delta"},
                  {"index", next_index_},
                  {"delta", {{"type", "input_json_delta"}, {"partial_json", dump_json(call_input(call))}}}});
    out += event({{"type", "content_block_stop"}, {"index", next_index_++}});
  }
  return out;
}

std::string AnthropicWire::close(const Answer& a) {
  std::string out = close_block();
  const ojson delta = {{"stop_reason", stop_reason(a)}, {"stop_sequence", a.stop_sequence.empty() ? ojson(nullptr) : ojson(a.stop_sequence)}};
  out += event({{"type", "message_delta"}, {"delta", delta}, {"usage", usage_json(a.usage)}});
  return out + event({{"type", "message_stop"}});
}

std::string AnthropicWire::stream_error(const ojson& error_body) { return event(error_body); }

void run_messages(EndpointContext& ctx, const HttpRequest& req, std::shared_ptr<ResponseWriter> w, HttpHeaders extra) {
  const std::string tenant = ctx.access ? ctx.access->match_key(req).tenant : std::string();
  auto refuse = [&](int status, const std::string& message) {
    ctx.metrics.request_rejected(tenant);
    w->respond({status, "application/json", dump_json(anthropic_error(message, "invalid_request_error")), extra});
  };
  auto body = parse_json_body(req.body);
  if (!body.ok()) return refuse(400, body.error().message);
  std::string bad;
  auto parsed = parse_anthropic_request(body.value(), std::random_device{}(), &bad);
  if (!parsed.ok()) return refuse(400, parsed.error().message);
  auto prepared = prepare_parsed(ctx, std::move(parsed.value()), req, tenant);
  if (auto* no = std::get_if<Rejection>(&prepared)) {
    const std::string param = anthropic_param(no->param);
    return refuse(no->status, param.empty() ? no->message : fmt::format("{} (parameter '{}')", no->message, param));
  }
  PreparedRequest& p = std::get<PreparedRequest>(prepared);
  auto wire = std::make_unique<AnthropicWire>(ctx.model_name, p.n_prompt);
  start_completion(ctx, std::move(p), std::move(wire), std::move(w), std::move(extra), tenant);
}

}  // namespace tandem::server
