#include "server/http_server.h"

#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <mutex>
#include <random>

#include <nlohmann/json.hpp>

#include "core/timer.h"
#include "server/openai_request.h"
#include "server/text_stream.h"

namespace tandem::server {

namespace {

using json = nlohmann::ordered_json;

json error_body(const std::string& message, const std::string& type, const std::string& param = "") {
  return {{"error", {{"message", message}, {"type", type}, {"param", param.empty() ? json(nullptr) : json(param)}, {"code", nullptr}}}};
}

void send_error(httplib::Response& res, int status, const std::string& message, const std::string& type,
                const std::string& param = "") {
  res.status = status;
  res.set_content(error_body(message, type, param).dump(), "application/json");
}

// One request's mailbox between the engine thread (which fills it) and its HTTP thread.
struct Mailbox {
  std::mutex mu;
  std::condition_variable cv;
  bool accepted = false;
  Result<int64_t> id = make_error("not accepted yet");
  std::deque<SeqEvent> events;
  bool client_gone = false;
  Timer since_arrival;
  double last_token_s = -1;

  // The engine holds these callbacks until the sequence is gone, which can be after the HTTP
  // handler gave up on it (a client that left): they share ownership of the mailbox.
  static SeqCallback callback(std::shared_ptr<Mailbox> self, Metrics& metrics) {
    return [self, &metrics](const SeqEvent& e) {
      Mailbox& m = *self;
      std::lock_guard<std::mutex> l(m.mu);
      if (e.finish == FinishReason::None) {
        const double now = m.since_arrival.seconds();
        if (m.last_token_s < 0) metrics.observe_ttft(now);
        else metrics.observe_tpot(now - m.last_token_s);
        m.last_token_s = now;
      }
      m.events.push_back(e);
      m.cv.notify_all();
      return !m.client_gone;
    };
  }
  static std::function<void(Result<int64_t>)> on_accept(std::shared_ptr<Mailbox> self) {
    return [self](Result<int64_t> r) {
      std::lock_guard<std::mutex> l(self->mu);
      self->id = std::move(r);
      self->accepted = true;
      self->cv.notify_all();
    };
  }
  // Waits up to `ms` for the next event.
  bool next(SeqEvent* out, int ms) {
    std::unique_lock<std::mutex> l(mu);
    if (!cv.wait_for(l, std::chrono::milliseconds(ms), [&] { return !events.empty(); })) return false;
    *out = events.front();
    events.pop_front();
    return true;
  }
};

// What a finished request produced, for the non-streaming response and the final chunk.
struct Outcome {
  std::string text;
  std::vector<std::string> pieces;
  std::vector<float> logprobs;
  int completion_tokens = 0;
  std::string finish_reason = "length";
};

std::string finish_name(FinishReason r, bool stopped_by_string) {
  if (stopped_by_string || r == FinishReason::Stop) return "stop";
  return r == FinishReason::Length ? "length" : r == FinishReason::Error ? "error" : "cancelled";
}

}  // namespace

HttpServer::HttpServer(const LlamaModel& model, const Tokenizer& tok, const ChatTemplate* chat, ServingLoop& loop, Metrics& metrics,
                       ServerOptions opts)
    : model_(model), tok_(tok), chat_(chat), loop_(loop), metrics_(metrics), opts_(std::move(opts)), http_(new httplib::Server()) {
  const int threads = opts_.http_threads;
  http_->new_task_queue = [threads] { return new httplib::ThreadPool((size_t)threads); };
  http_->set_payload_max_length(opts_.max_body_bytes);
  routes();
}

HttpServer::~HttpServer() { stop(); }

Status HttpServer::bind() {
  if (opts_.port == 0) {
    port_ = http_->bind_to_any_port(opts_.host);
    if (port_ <= 0) return make_error("cannot bind {}", opts_.host);
  } else {
    if (!http_->bind_to_port(opts_.host, opts_.port)) return make_error("cannot bind {}:{}", opts_.host, opts_.port);
    port_ = opts_.port;
  }
  return Status::Ok();
}

Status HttpServer::listen() {
  if (!http_->listen_after_bind()) return make_error("the HTTP server stopped with an error");
  return Status::Ok();
}

void HttpServer::stop() {
  if (http_) http_->stop();
}

void HttpServer::routes() {
  auto authorized = [this](const httplib::Request& req, httplib::Response& res) {
    if (opts_.api_key.empty()) return true;
    if (req.get_header_value("Authorization") == "Bearer " + opts_.api_key) return true;
    send_error(res, 401, "invalid or missing API key (Authorization: Bearer ...)", "authentication_error");
    metrics_.request_rejected();
    return false;
  };
  http_->set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 413) send_error(res, 413, "the request body is too large", "invalid_request_error");
    else if (res.status == 404) send_error(res, 404, "no such endpoint", "invalid_request_error");
    else send_error(res, res.status, "request failed", "invalid_request_error");
  });
  http_->set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, 500, what, "server_error");
  });
  http_->Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  http_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_.render(), "text/plain; version=0.0.4");
  });
  http_->Get("/v1/models", [this, authorized](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    json j = {{"object", "list"},
              {"data", json::array({{{"id", opts_.model_name}, {"object", "model"}, {"created", (int64_t)std::time(nullptr)},
                                     {"owned_by", "tandem"}}})}};
    res.set_content(j.dump(), "application/json");
  });

  auto serve = [this, authorized](bool chat) {
    return [this, authorized, chat](const httplib::Request& req, httplib::Response& res) {
      if (!authorized(req, res)) return;
      const json body = json::parse(req.body, nullptr, false);
      if (body.is_discarded()) {
        metrics_.request_rejected();
        return send_error(res, 400, "the request body is not valid JSON", "invalid_request_error");
      }
      std::string bad;
      auto parsed = parse_request(body, chat, std::random_device{}(), &bad);
      if (!parsed.ok()) {
        metrics_.request_rejected();
        return send_error(res, 400, parsed.error().message, "invalid_request_error", bad);
      }
      ParsedRequest pr = std::move(parsed.value());
      if (chat && !chat_) {
        metrics_.request_rejected();
        return send_error(res, 400, "this model has no usable chat template; use /v1/completions", "invalid_request_error");
      }
      std::vector<int32_t> prompt;
      if (chat) {
        const json extra = pr.tools.is_array() ? json{{"tools", pr.tools}} : json::object();
        auto text = chat_->render_json(pr.messages, true, &extra);
        if (!text.ok()) {
          metrics_.request_rejected();
          return send_error(res, 400, text.error().message, "invalid_request_error", "messages");
        }
        std::lock_guard<std::mutex> l(tokenizer_mu_);
        prompt = tok_.encode_chat(text.value());
      } else {
        std::lock_guard<std::mutex> l(tokenizer_mu_);
        prompt = tok_.encode(pr.prompt, true, true);
      }
      RequestParams rp;
      rp.prompt = std::move(prompt);
      const int64_t ctx = model_.config().n_ctx_train;
      if ((int64_t)rp.prompt.size() >= ctx) {
        metrics_.request_rejected();
        return send_error(res, 400,
                          fmt::format("the prompt has {} tokens; the model's context is {} tokens", rp.prompt.size(), ctx),
                          "invalid_request_error", chat ? "messages" : "prompt");
      }
      if (pr.max_tokens_given && (int64_t)rp.prompt.size() + pr.max_tokens > ctx) {
        metrics_.request_rejected();
        return send_error(res, 400,
                          fmt::format("prompt ({} tokens) + max_tokens ({}) exceeds the model's context of {} tokens",
                                      rp.prompt.size(), pr.max_tokens, ctx),
                          "invalid_request_error", "max_tokens");
      }
      if (!pr.max_tokens_given && chat) pr.max_tokens = (int)(ctx - (int64_t)rp.prompt.size());
      rp.max_tokens = pr.max_tokens;
      rp.sampling = pr.sampling;
      rp.stop_tokens = tok_.vocab().end_of_generation;
      rp.want_logprobs = pr.logprobs;
      const int n_prompt = (int)rp.prompt.size();

      auto box = std::make_shared<Mailbox>();
      loop_.submit(std::move(rp), Mailbox::callback(box, metrics_), Mailbox::on_accept(box));
      {
        std::unique_lock<std::mutex> l(box->mu);
        box->cv.wait(l, [&] { return box->accepted; });
      }
      if (!box->id.ok()) {
        metrics_.request_rejected();
        return send_error(res, 400, box->id.error().message, "invalid_request_error");
      }
      metrics_.request_started();
      const int64_t id = box->id.value();
      const std::string rid = fmt::format("{}-{}", chat ? "chatcmpl" : "cmpl", id);
      const int64_t created = (int64_t)std::time(nullptr);
      const std::string model_name = opts_.model_name;

      auto chunk = [chat, rid, created, model_name](const std::string& text, const json& logprob, const json& finish, bool first) {
        json choice = {{"index", 0}};
        if (chat) {
          json delta = json::object();
          if (first) delta["role"] = "assistant";
          if (!text.empty() || first) delta["content"] = text;
          choice["delta"] = delta;
          choice["logprobs"] = logprob;
        } else {
          choice["text"] = text;
          choice["logprobs"] = logprob;
        }
        choice["finish_reason"] = finish;
        return json{{"id", rid}, {"object", chat ? "chat.completion.chunk" : "text_completion"}, {"created", created},
                    {"model", model_name}, {"choices", json::array({choice})}};
      };
      auto logprob_json = [chat](const std::string& piece, float lp) -> json {
        if (chat) {
          json bytes = json::array();
          for (unsigned char ch : piece) bytes.push_back((int)ch);
          return {{"content", json::array({{{"token", piece}, {"logprob", lp}, {"bytes", bytes}, {"top_logprobs", json::array()}}})}};
        }
        return {{"tokens", json::array({piece})}, {"token_logprobs", json::array({lp})}, {"top_logprobs", nullptr},
                {"text_offset", json::array({0})}};
      };

      if (!pr.stream) {
        TextStream text(pr.stop);
        Outcome out;
        bool stopped = false;
        SeqEvent e;
        while (true) {
          if (!box->next(&e, 1000)) continue;
          if (e.finish != FinishReason::None) {
            out.finish_reason = finish_name(e.finish, stopped);
            if (e.finish == FinishReason::Error) {
              metrics_.request_finished("error");
              return send_error(res, 500, e.error, "server_error");
            }
            break;
          }
          const std::string piece = tok_.token_to_piece(e.token);
          out.completion_tokens++;
          out.text += text.push(piece);
          out.pieces.push_back(piece);
          out.logprobs.push_back(e.logprob);
          if (text.stopped() && !stopped) {
            stopped = true;
            loop_.cancel(id);
          }
        }
        out.text += text.flush();
        metrics_.request_finished(out.finish_reason);
        json choice = {{"index", 0}};
        json lp = nullptr;
        if (pr.logprobs) {
          if (chat) {
            json content = json::array();
            for (size_t k = 0; k < out.pieces.size(); k++) content.push_back(logprob_json(out.pieces[k], out.logprobs[k])["content"][0]);
            lp = {{"content", content}};
          } else {
            json toks = json::array(), lps = json::array(), offs = json::array();
            size_t off = 0;
            for (size_t k = 0; k < out.pieces.size(); k++) {
              toks.push_back(out.pieces[k]), lps.push_back(out.logprobs[k]), offs.push_back(off);
              off += out.pieces[k].size();
            }
            lp = {{"tokens", toks}, {"token_logprobs", lps}, {"top_logprobs", nullptr}, {"text_offset", offs}};
          }
        }
        if (chat) choice["message"] = {{"role", "assistant"}, {"content", out.text}};
        else choice["text"] = out.text;
        choice["logprobs"] = lp;
        choice["finish_reason"] = out.finish_reason;
        json j = {{"id", rid}, {"object", chat ? "chat.completion" : "text_completion"}, {"created", created}, {"model", model_name},
                  {"choices", json::array({choice})},
                  {"usage", {{"prompt_tokens", n_prompt}, {"completion_tokens", out.completion_tokens},
                             {"total_tokens", n_prompt + out.completion_tokens}}}};
        res.set_content(j.dump(), "application/json");
        return;
      }

      // Streaming: one SSE chunk per piece of text, a final chunk with the finish reason, [DONE].
      struct StreamState {
        TextStream text;
        bool first = true, stopped = false, done = false;
        int completion_tokens = 0;
      };
      auto st = std::make_shared<StreamState>(StreamState{TextStream(pr.stop)});
      const bool want_lp = pr.logprobs, include_usage = pr.include_usage;
      res.set_header("Cache-Control", "no-cache");
      res.set_chunked_content_provider(
          "text/event-stream",
          [this, box, st, id, chunk, logprob_json, want_lp, include_usage, n_prompt, rid, created, model_name, chat](
              size_t, httplib::DataSink& sink) {
            auto send = [&](const json& j) {
              const std::string s = "data: " + j.dump() + "\n\n";
              return sink.write(s.data(), s.size());
            };
            if (st->first) {  // the role chunk first (chat), an empty text chunk (completions)
              st->first = false;
              if (!send(chunk("", nullptr, nullptr, true))) return false;
            }
            SeqEvent e;
            while (!box->next(&e, 200))
              if (!sink.is_writable()) return false;  // the client left: the releaser cancels
            if (e.finish == FinishReason::None) {
              const std::string piece = tok_.token_to_piece(e.token);
              st->completion_tokens++;
              const std::string text = st->text.push(piece);
              if (st->text.stopped() && !st->stopped) {
                st->stopped = true;
                loop_.cancel(id);
              }
              if (!text.empty() || want_lp)
                if (!send(chunk(text, want_lp ? logprob_json(piece, e.logprob) : json(nullptr), nullptr, false))) return false;
              return true;
            }
            const std::string rest = st->text.flush();
            const std::string reason = finish_name(e.finish, st->stopped);
            metrics_.request_finished(reason);
            if (!rest.empty() && !send(chunk(rest, nullptr, nullptr, false))) return false;
            if (!send(chunk("", nullptr, reason, false))) return false;
            if (include_usage &&
                !send(json{{"id", rid}, {"object", chat ? "chat.completion.chunk" : "text_completion"}, {"created", created},
                           {"model", model_name}, {"choices", json::array()},
                           {"usage", {{"prompt_tokens", n_prompt}, {"completion_tokens", st->completion_tokens},
                                      {"total_tokens", n_prompt + st->completion_tokens}}}}))
              return false;
            const std::string done = "data: [DONE]\n\n";
            sink.write(done.data(), done.size());
            st->done = true;
            sink.done();
            return true;
          },
          [this, box, st, id](bool) {
            if (st->done) return;
            {
              std::lock_guard<std::mutex> l(box->mu);
              box->client_gone = true;  // the engine drops it at its next token
            }
            loop_.cancel(id);
            metrics_.request_finished("cancelled");
          });
    };
  };
  http_->Post("/v1/completions", serve(false));
  http_->Post("/v1/chat/completions", serve(true));
}

}  // namespace tandem::server
