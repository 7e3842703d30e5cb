#include "server/responses_api.h"

#include <fmt/format.h>

#include <ctime>
#include <random>

#include "server/access_policy.h"
#include "server/request_prompt.h"

namespace tandem::server {

namespace {

ojson message_item(const std::string& id, const std::string& text, const char* status) {
  return {{"type", "message"},
          {"id", id},
          {"status", status},
          {"role", "assistant"},
          {"content", ojson::array({{{"type", "output_text"}, {"text", text}, {"annotations", ojson::array()}, {"logprobs", ojson::array()}}})}};
}

ojson reasoning_item(const std::string& id, const std::string& text) {
  return {{"type", "reasoning"}, {"id", id}, {"summary", ojson::array()}, {"content", ojson::array({{{"type", "reasoning_text"}, {"text", text}}})}};
}

ojson usage_json(const TokenUsage& u) {
  return {{"input_tokens", u.prompt},
          {"input_tokens_details", {{"cached_tokens", u.cached}}},
          {"output_tokens", u.completion},
          {"output_tokens_details", {{"reasoning_tokens", 0}}},
          {"total_tokens", u.prompt + u.completion}};
}

// The answer as the assistant message a later request continues from.
ojson assistant_message(const Answer& a) {
  ojson m = {{"role", "assistant"}, {"content", a.text.empty() && !a.tool_calls.empty() ? ojson(nullptr) : ojson(a.text)}};
  if (!a.tool_calls.empty()) m["tool_calls"] = a.tool_calls;
  if (!a.reasoning.empty()) m["reasoning_content"] = a.reasoning;
  return m;
}

HttpResponse json_answer(int status, const ojson& body, HttpHeaders extra) {
  return {status, "application/json", dump_json(body), std::move(extra)};
}

}  // namespace

ResponsesWire::ResponsesWire(ResponsesRequest request, std::string model, ResponsesStore* store, std::string tenant)
    : req_(std::move(request)), model_(std::move(model)), tenant_(std::move(tenant)), store_(store),
      created_at_((int64_t)std::time(nullptr)) {}

std::string ResponsesWire::new_id(const char* prefix) { return fmt::format("{}_{:016x}{:016x}", prefix, rng_(), rng_()); }

void ResponsesWire::set_engine_id(int64_t) { id_ = new_id("resp"); }

ojson ResponsesWire::error(const std::string& message, const std::string& type, const std::string& param) const {
  return error_body(message, type, responses_param(param));
}

ojson ResponsesWire::response_object(const std::string& status, const ojson& output, const Answer* a) const {
  ojson r = {{"id", id_}, {"object", "response"}, {"created_at", created_at_}, {"status", status}, {"error", nullptr}};
  r["incomplete_details"] = status == "incomplete" ? ojson{{"reason", "max_output_tokens"}} : ojson(nullptr);
  r["model"] = model_;
  r["output"] = output;
  for (auto it = req_.echo.begin(); it != req_.echo.end(); ++it) r[it.key()] = it.value();
  r["usage"] = a ? usage_json(a->usage) : ojson(nullptr);
  return r;
}

// Keeps the answer for previous_response_id (and GET), when the request allows.
void ResponsesWire::keep(const ojson& response, const Answer& a) {
  if (!req_.store || !store_) return;
  ojson messages = req_.conversation;
  messages.push_back(assistant_message(a));
  store_->put(id_, StoredResponse{tenant_, std::move(messages), response});
}

ojson ResponsesWire::function_call_item(const ojson& call, const std::string& status) {
  return {{"type", "function_call"},      {"id", new_id("fc")},
          {"call_id", call["id"]},        {"name", call["function"]["name"]},
          {"arguments", call["function"]["arguments"]}, {"status", status}};
}

ojson ResponsesWire::whole(const Answer& a) {
  ojson output = ojson::array();
  if (!a.reasoning.empty()) output.push_back(reasoning_item(new_id("rs"), a.reasoning));
  if (!a.text.empty() || a.tool_calls.empty()) output.push_back(message_item(new_id("msg"), a.text, "completed"));
  for (const ojson& call : a.tool_calls) output.push_back(function_call_item(call, "completed"));
  const ojson r = response_object(a.finish == "length" ? "incomplete" : "completed", output, &a);
  keep(r, a);
  return r;
}

std::string ResponsesWire::event(const std::string& type, ojson fields) {
  ojson e = {{"type", type}, {"sequence_number", sequence_++}};
  for (auto it = fields.begin(); it != fields.end(); ++it) e[it.key()] = std::move(it.value());
  return sse_event(e, type);
}

std::string ResponsesWire::open() {
  const ojson r = response_object("in_progress", ojson::array(), nullptr);
  std::string out = event("response.created", {{"response", r}});  // (two statements: the events number in order)
  return out + event("response.in_progress", {{"response", r}});
}

// Starts an item of `kind` (closing another kind's first): its output_item.added and content_part.added.
std::string ResponsesWire::open_item(Open kind) {
  if (open_ == kind) return {};
  std::string out = close_item();
  open_ = kind;
  open_id_ = new_id(kind == Open::Message ? "msg" : "rs");
  open_text_.clear();
  ojson item = kind == Open::Message ? message_item(open_id_, "", "in_progress") : reasoning_item(open_id_, "");
  item["content"] = ojson::array();
  const ojson part = kind == Open::Message ? ojson{{"type", "output_text"}, {"text", ""}, {"annotations", ojson::array()}}
                                           : ojson{{"type", "reasoning_text"}, {"text", ""}};
  const size_t index = items_.size();
  out += event("response.output_item.added", {{"output_index", index}, {"item", item}});
  out += event("response.content_part.added", {{"item_id", open_id_}, {"output_index", index}, {"content_index", 0}, {"part", part}});
  return out;
}

// Ends the open item: its text's done event, content_part.done and output_item.done.
std::string ResponsesWire::close_item() {
  if (open_ == Open::None) return {};
  const bool message = open_ == Open::Message;
  const ojson item = message ? message_item(open_id_, open_text_, "completed") : reasoning_item(open_id_, open_text_);
  const size_t index = items_.size();
  const ojson where = {{"item_id", open_id_}, {"output_index", index}, {"content_index", 0}};
  ojson done = where;
  done["text"] = open_text_;
  if (message) done["logprobs"] = ojson::array();
  ojson part_done = where;
  part_done["part"] = item["content"][0];
  std::string out = event(message ? "response.output_text.done" : "response.reasoning_text.done", done);
  out += event("response.content_part.done", part_done);
  out += event("response.output_item.done", {{"output_index", index}, {"item", item}});
  items_.push_back(item);
  open_ = Open::None;
  return out;
}

std::string ResponsesWire::text(const std::string& text, const TokenLogprob*) {
  if (text.empty()) return {};
  std::string out = open_item(Open::Message);
  open_text_ += text;
  return out + event("response.output_text.delta", {{"item_id", open_id_}, {"output_index", items_.size()}, {"content_index", 0},
                                                     {"delta", text}, {"logprobs", ojson::array()}});
}

std::string ResponsesWire::reasoning(const std::string& text) {
  std::string out = open_item(Open::Reasoning);
  open_text_ += text;
  return out + event("response.reasoning_text.delta", {{"item_id", open_id_}, {"output_index", items_.size()}, {"content_index", 0}, {"delta", text}});
}

std::string ResponsesWire::calls(const std::vector<ojson>& added, size_t) {
  std::string out = close_item();
  for (const ojson& call : added) {
    ojson item = function_call_item(call, "in_progress");
    const ojson where = {{"item_id", item["id"]}, {"output_index", items_.size()}};
    const std::string arguments = item["arguments"];
    item["arguments"] = "";
    out += event("response.output_item.added", {{"output_index", items_.size()}, {"item", item}});
    ojson delta = where, done = where;
    delta["delta"] = arguments;
    done["name"] = item["name"];
    done["arguments"] = arguments;
    out += event("response.function_call_arguments.delta", delta);
    out += event("response.function_call_arguments.done", done);
    item["arguments"] = arguments;
    item["status"] = "completed";
    out += event("response.output_item.done", {{"output_index", items_.size()}, {"item", item}});
    items_.push_back(std::move(item));
  }
  return out;
}

std::string ResponsesWire::close(const Answer& a) {
  std::string out = close_item();
  if (items_.empty()) {  // an empty answer is an empty message
    out += open_item(Open::Message);
    out += close_item();
  }
  const bool incomplete = a.finish == "length";
  const ojson r = response_object(incomplete ? "incomplete" : "completed", items_, &a);
  keep(r, a);
  return out + event(incomplete ? "response.incomplete" : "response.completed", {{"response", r}});
}

std::string ResponsesWire::stream_error(const ojson& error_body) {
  const ojson& e = error_body["error"];
  return event("error", {{"code", e.value("type", ojson())}, {"message", e["message"]}, {"param", e["param"]}});
}

void run_responses(EndpointContext& ctx, ResponsesStore& store, const HttpRequest& req, std::shared_ptr<ResponseWriter> w,
                   HttpHeaders extra) {
  const std::string tenant = ctx.access ? ctx.access->match_key(req).tenant : std::string();
  auto refuse = [&](int status, const std::string& message, const std::string& param) {
    ctx.metrics.request_rejected(tenant);
    w->respond(json_answer(status, error_body(message, "invalid_request_error", param), extra));
  };
  auto body = parse_json_body(req.body);
  if (!body.ok()) return refuse(400, body.error().message, "");
  std::string bad;
  auto parsed = parse_responses_request(body.value(), store, tenant, std::random_device{}(), &bad);
  if (!parsed.ok()) return refuse(400, parsed.error().message, bad);
  ResponsesRequest rr = std::move(parsed.value());
  auto prepared = prepare_parsed(ctx, std::move(rr.pr), req, tenant);
  if (auto* no = std::get_if<Rejection>(&prepared)) return refuse(no->status, no->message, responses_param(no->param));
  auto wire = std::make_unique<ResponsesWire>(std::move(rr), ctx.model_name, &store, tenant);
  start_completion(ctx, std::move(std::get<PreparedRequest>(prepared)), std::move(wire), std::move(w), std::move(extra), tenant);
}

HttpResponse stored_response(EndpointContext& ctx, ResponsesStore& store, const HttpRequest& req, HttpHeaders extra) {
  const std::string tenant = ctx.access ? ctx.access->match_key(req).tenant : std::string();
  const std::string id(req.path().substr(std::string_view("/v1/responses/").size()));
  const std::string missing = fmt::format("no stored response '{}' (unknown, deleted, evicted, or another API key's)", id);
  if (req.method == "DELETE") {
    if (!store.erase(id, tenant)) return json_answer(404, error_body(missing, "invalid_request_error", "id"), std::move(extra));
    return json_answer(200, {{"id", id}, {"object", "response.deleted"}, {"deleted", true}}, std::move(extra));
  }
  auto r = store.get(id, tenant);
  if (!r) return json_answer(404, error_body(missing, "invalid_request_error", "id"), std::move(extra));
  return json_answer(200, r->response, std::move(extra));
}

}  // namespace tandem::server
