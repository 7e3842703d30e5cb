#include "server/embeddings.h"

#include <fmt/format.h>

#include <cstring>

#include "server/access_policy.h"
#include "server/request_checks.h"

namespace tandem::server {

namespace {

constexpr size_t kMaxInputs = 2048;  // OpenAI's own limit

struct EmbeddingsRequest {
  std::vector<std::vector<int32_t>> inputs;
  bool base64 = false;
};

// One input: a string (tokenized as a completions prompt is) or an array of token ids.
Status read_input(const FieldCheck& fc, EndpointContext& ctx, const ojson& v, const std::string& at, std::vector<int32_t>* out) {
  if (v.is_string()) {
    if (v.get_ref<const std::string&>().empty()) return fc.fail(at, "is empty");
    *out = ctx.tok.encode(v.get<std::string>(), true, true);
  } else {
    for (size_t k = 0; k < v.size(); k++) {
      if (!v[k].is_number_integer() || v[k].get<int64_t>() < 0 || v[k].get<int64_t>() >= ctx.model.config().n_vocab)
        return fc.fail(fmt::format("{}[{}]", at, k), fmt::format("must be a token id from 0 to {}", ctx.model.config().n_vocab - 1));
      out->push_back((int32_t)v[k].get<int64_t>());
    }
  }
  if (out->empty()) return fc.fail(at, "is empty");
  if ((int64_t)out->size() > ctx.model.config().n_ctx_train)
    return fc.fail(at, fmt::format("has {} tokens; the model's context is {} tokens", out->size(), ctx.model.config().n_ctx_train));
  return Status::Ok();
}

Result<EmbeddingsRequest> parse_embeddings(EndpointContext& ctx, const ojson& body, std::string* bad) {
  const FieldCheck fc{bad};
  if (!body.is_object()) return fc.fail("", "the request body must be a JSON object").error();
  TANDEM_TRY(fc.known(body, "", {"model", "input", "encoding_format", "dimensions", "user"}));
  for (const char* k : {"model", "user"})
    if (present(body, k) && !body[k].is_string()) return fc.fail(k, "must be a string").error();
  EmbeddingsRequest r;
  if (present(body, "encoding_format")) {
    if (body["encoding_format"] != "float" && body["encoding_format"] != "base64") return fc.fail("encoding_format", "must be \"float\" or \"base64\"").error();
    r.base64 = body["encoding_format"] == "base64";
  }
  if (present(body, "dimensions") && body["dimensions"] != ctx.model.config().n_embd)
    return fc.fail("dimensions", fmt::format("is not supported (this model's vectors have {} dimensions, and only that)", ctx.model.config().n_embd)).error();
  if (!body.contains("input")) return fc.fail("input", "is required").error();
  const ojson& in = body["input"];
  // One input (a string or one token array), or a list of them.
  const bool one = in.is_string() || (in.is_array() && !in.empty() && in[0].is_number());
  if (!one && (!in.is_array() || in.empty())) return fc.fail("input", "must be a string, a token array, or a non-empty list of either").error();
  if (!one && in.size() > kMaxInputs) return fc.fail("input", fmt::format("has more than {} inputs", kMaxInputs)).error();
  const size_t n = one ? 1 : in.size();
  r.inputs.resize(n);
  for (size_t i = 0; i < n; i++) {
    const ojson& v = one ? in : in[i];
    const std::string at = one ? "input" : fmt::format("input[{}]", i);
    if (!v.is_string() && !v.is_array()) return fc.fail(at, "must be a string or an array of token ids").error();
    TANDEM_TRY(read_input(fc, ctx, v, at, &r.inputs[i]));
  }
  return r;
}

std::string base64_of(const std::vector<float>& v) {
  static constexpr char kDigits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string bytes(v.size() * sizeof(float), '\0');
  std::memcpy(bytes.data(), v.data(), bytes.size());  // little-endian float32, as OpenAI's
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const uint32_t n = ((uint32_t)(uint8_t)bytes[i] << 16) | (i + 1 < bytes.size() ? (uint32_t)(uint8_t)bytes[i + 1] << 8 : 0) |
                       (i + 2 < bytes.size() ? (uint32_t)(uint8_t)bytes[i + 2] : 0);
    out += kDigits[(n >> 18) & 63];
    out += kDigits[(n >> 12) & 63];
    out += i + 1 < bytes.size() ? kDigits[(n >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kDigits[n & 63] : '=';
  }
  return out;
}

ojson answer(EndpointContext& ctx, const std::vector<std::vector<float>>& vectors, const EmbeddingsRequest& r) {
  ojson data = ojson::array();
  for (size_t i = 0; i < vectors.size(); i++)
    data.push_back({{"object", "embedding"}, {"index", i}, {"embedding", r.base64 ? ojson(base64_of(vectors[i])) : ojson(vectors[i])}});
  int64_t tokens = 0;
  for (const auto& in : r.inputs) tokens += (int64_t)in.size();
  return {{"object", "list"}, {"data", std::move(data)}, {"model", ctx.model_name}, {"usage", {{"prompt_tokens", tokens}, {"total_tokens", tokens}}}};
}

}  // namespace

void run_embeddings(EndpointContext& ctx, const HttpRequest& req, std::shared_ptr<ResponseWriter> w, HttpHeaders extra) {
  const std::string tenant = ctx.access ? ctx.access->match_key(req).tenant : std::string();
  auto refuse = [&](int status, const std::string& message, const std::string& param) {
    ctx.metrics.request_rejected(tenant);
    w->respond({status, "application/json", dump_json(error_body(message, "invalid_request_error", param)), extra});
  };
  auto body = parse_json_body(req.body);  // bounded first, whatever the model
  if (!body.ok()) return refuse(400, body.error().message, "");
  if (ctx.model.config().pooling == ModelConfig::Pooling::None)
    return refuse(400, fmt::format("this model is not an embedding model (its GGUF has no {}.pooling_type): /v1/embeddings needs one, "
                                   "e.g. Qwen3-Embedding", ctx.model.config().arch), "model");
  std::string bad;
  auto parsed = parse_embeddings(ctx, body.value(), &bad);
  if (!parsed.ok()) return refuse(400, parsed.error().message, bad);
  auto r = std::make_shared<EmbeddingsRequest>(std::move(parsed.value()));
  std::vector<std::vector<int32_t>> inputs = r->inputs;
  auto work = ctx.work;
  // The engine thread computes; the answer is formatted on a worker (it may be megabytes of JSON).
  ctx.loop.embed(std::move(inputs), [&ctx, r, w, extra, work](ServingLoop::Embeddings result) {
    auto shared = std::make_shared<ServingLoop::Embeddings>(std::move(result));
    const bool posted = work->post([&ctx, r, w, extra, shared] {
      if (!shared->ok()) return w->respond({503, "application/json", dump_json(error_body(shared->error().message, "server_error")), extra});
      w->respond({200, "application/json", dump_json(answer(ctx, shared->value(), *r)), extra});
    });
    if (!posted) w->respond({503, "application/json", dump_json(error_body("the server is shutting down", "service_unavailable")), extra});
  });
}

}  // namespace tandem::server
