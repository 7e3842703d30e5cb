// POST /v1/embeddings (OpenAI's): `input` as a string, a list of strings, a token array or a
// list of token arrays; `encoding_format` "float" or "base64" (little-endian float32);
// `dimensions` only at the model's own size. The vectors come from the engine's embedder
// (engine/embedder.h) on the serving loop's thread; a generation-only model is a 400 saying so.
#pragma once

#include <memory>

#include "server/completion_run.h"

namespace tandem::server {

// On a worker thread.
void run_embeddings(EndpointContext& ctx, const HttpRequest& req, std::shared_ptr<ResponseWriter> w, HttpHeaders extra);

}  // namespace tandem::server
