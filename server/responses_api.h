// OpenAI's Responses API: POST /v1/responses (the request: responses_request.h; the answer
// from the same completion run as chat completions, written here as a response object or as
// its typed stream events), GET and DELETE /v1/responses/{id} over the store
// (responses_store.h).
//
// A stream is: response.created, response.in_progress; then per output item (a reasoning item,
// a message, function calls, in the order the model wrote them) response.output_item.added,
// its content (response.content_part.added, response.output_text.delta ... .done,
// response.content_part.done; response.reasoning_text.delta ... .done; or
// response.function_call_arguments.delta ... .done) and response.output_item.done; last
// response.completed (response.incomplete when max_output_tokens ended it). An error after the
// stream began is an "error" event. Every event has its sequence_number.
#pragma once

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "server/answer_wire.h"
#include "server/completion_run.h"
#include "server/responses_request.h"
#include "server/responses_store.h"

namespace tandem::server {

class ResponsesWire : public AnswerWire {
 public:
  // `store`: where the answer is kept when the request allows (request.store).
  ResponsesWire(ResponsesRequest request, std::string model, ResponsesStore* store, std::string tenant);
  void set_engine_id(int64_t engine_id) override;
  ojson error(const std::string& message, const std::string& type, const std::string& param) const override;
  ojson whole(const Answer& a) override;
  std::string open() override;
  std::string text(const std::string& text, const TokenLogprob* lp) override;
  std::string reasoning(const std::string& text) override;
  std::string calls(const std::vector<ojson>& added, size_t first_index) override;
  std::string close(const Answer& a) override;
  std::string stream_error(const ojson& error_body) override;
  const std::string& id() const { return id_; }

 private:
  enum class Open { None, Message, Reasoning };
  ojson response_object(const std::string& status, const ojson& output, const Answer* a) const;
  std::string event(const std::string& type, ojson fields);
  std::string open_item(Open kind);
  std::string close_item();
  ojson function_call_item(const ojson& call, const std::string& status);
  std::string new_id(const char* prefix);
  void keep(const ojson& response, const Answer& a);

  ResponsesRequest req_;
  std::string model_, tenant_;
  ResponsesStore* store_;
  std::string id_;
  int64_t created_at_;
  std::mt19937_64 rng_{std::random_device{}()};
  // A stream's state: the items done so far, the one open (its id and text), the next event's number.
  ojson items_ = ojson::array();
  Open open_ = Open::None;
  std::string open_id_, open_text_;
  int64_t sequence_ = 0;
};

// On a worker thread, for POST /v1/responses.
void run_responses(EndpointContext& ctx, ResponsesStore& store, const HttpRequest& req, std::shared_ptr<ResponseWriter> w,
                   HttpHeaders extra);
// GET /v1/responses/{id} (the stored response object) and DELETE (its removal), for the
// request's own API key only.
HttpResponse stored_response(EndpointContext& ctx, ResponsesStore& store, const HttpRequest& req, HttpHeaders extra);

}  // namespace tandem::server
