// llama-server's tokenizer endpoints, with its request and response JSON, for tools written
// against it (token counters, prompt builders, logit-bias editors):
//   POST /tokenize        {content, add_special = false, parse_special = true, with_pieces = false}
//                         -> {tokens: [id, ...]}, or with pieces {tokens: [{id, piece}, ...]} where a
//                         piece is a string when its bytes are valid UTF-8, else a list of byte values
//   POST /detokenize      {tokens: [id, ...]} -> {content}
//   POST /apply-template  {messages, tools?, add_generation_prompt = true} -> {prompt}: the chat
//                         template's text, exactly what /v1/chat/completions would tokenize
// Every field is type-checked; an id outside the vocabulary is a 400 naming its position.
#pragma once

#include <string>

#include "chat/chat_template.h"
#include "core/error.h"
#include "server/completion_run.h"
#include "server/http_transport.h"
#include "server/openai_json.h"
#include "tokenizer/tokenizer.h"

namespace tandem::server {

// One answer holds at most this many tokens (more than any model's context); past it the caller
// sends the text in parts. It bounds the memory a 4 MiB body can make a worker spend on JSON.
constexpr size_t kMaxTokensPerAnswer = size_t{1} << 18;

enum class TokenEndpoint { Tokenize, Detokenize, ApplyTemplate };

// The JSON text of each answer, or an error naming the bad field in `bad_param` (a 400).
Result<std::string> tokenize_answer(const ojson& body, const Tokenizer& tok, std::string* bad_param);
Result<std::string> detokenize_answer(const ojson& body, const Tokenizer& tok, std::string* bad_param);
// `chat` null: the model has no usable template (an error). Tools render in the format the
// server would use (`tool_format`).
Result<std::string> apply_template_answer(const ojson& body, const ChatTemplate* chat, std::string* bad_param,
                                          ToolFormatMode tool_format = ToolFormatMode::Auto);

// On a worker thread: the body parsed (depth-bounded), the answer or a 400. `extra` fields go on
// the response (CORS).
HttpResponse run_token_endpoint(TokenEndpoint which, EndpointContext& ctx, const HttpRequest& req, const HttpHeaders& extra);

}  // namespace tandem::server
