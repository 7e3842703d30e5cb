#include "tokenizer/vocab.h"

#include <cctype>

#include <algorithm>
#include <array>

namespace tandem {

int32_t Vocab::find(std::string_view text) const {
  return token_to_id.find(text);
}

int32_t Vocab::add_token(const std::string& text, TokenType type) {
  const int32_t id = size();
  tokens.push_back(text);
  types.push_back(type);
  if (!scores.empty()) scores.push_back(0);
  rstrip.push_back(false);
  token_to_id.insert(text, id);
  return id;
}

bool Vocab::is_eog(int32_t id) const {
  return std::find(end_of_generation.begin(), end_of_generation.end(), id) != end_of_generation.end();
}

namespace {

// tokenizer.ggml.model (gpt2: byte-level BPE, llama: SentencePiece) and the pre-tokenizer.
Status read_kind(const GgufFile& f, Vocab& v) {
  auto model = f.get_string("tokenizer.ggml.model");
  if (!model.ok()) return model.error();
  if (!model->has_value()) return make_error("missing metadata key 'tokenizer.ggml.model' (no vocabulary in this file)");
  if (**model == "gpt2")
    v.kind = VocabKind::Bpe;
  else if (**model == "llama")
    v.kind = VocabKind::Spm;
  else
    return make_error("tokenizer model '{}' is not supported (tandem reads gpt2 and llama)", **model);
  auto pre = f.get_string("tokenizer.ggml.pre");
  if (!pre.ok()) return pre.error();
  v.pre = pre->has_value() ? std::string(**pre) : "default";
  return Status::Ok();
}

// The tokens, their scores (SentencePiece needs them) and types, one of each per token.
Status read_tokens(const GgufFile& f, Vocab& v) {
  const GgufArray* toks = f.get_array("tokenizer.ggml.tokens");
  if (!toks || toks->elem_type != GgufType::STRING || toks->count == 0)
    return make_error("tokenizer.ggml.tokens is missing or not an array of strings");
  const size_t n = toks->count;
  v.tokens.reserve(n);
  for (size_t i = 0; i < n; i++) v.tokens.emplace_back(toks->strings[i]);
  v.token_to_id = TokenIndex(v.tokens);
  if (const GgufArray* sc = f.get_array("tokenizer.ggml.scores")) {
    if (sc->count != n || sc->strings.size() || sc->arrays.size())
      return make_error("tokenizer.ggml.scores has {} entries for {} tokens", sc->count, n);
    v.scores.resize(n);
    for (size_t i = 0; i < n; i++) v.scores[i] = (float)sc->number(i);
  } else if (v.kind == VocabKind::Spm) {
    return make_error("SentencePiece vocabulary without tokenizer.ggml.scores");
  }
  v.types.assign(n, TokenType::Normal);
  if (const GgufArray* ty = f.get_array("tokenizer.ggml.token_type")) {
    if (ty->count != n || ty->strings.size() || ty->arrays.size())
      return make_error("tokenizer.ggml.token_type has {} entries for {} tokens", ty->count, n);
    for (size_t i = 0; i < n; i++) {
      const int64_t t = ty->integer(i);
      if (t < 0 || t > 6) return make_error("token {} has unknown token_type {}", i, t);
      v.types[i] = static_cast<TokenType>(t);
    }
  }
  return Status::Ok();
}

// BPE's merges, ranked by their order.
Status read_merges(const GgufFile& f, Vocab& v) {
  if (v.kind != VocabKind::Bpe) return Status::Ok();
  const GgufArray* merges = f.get_array("tokenizer.ggml.merges");
  if (!merges || merges->elem_type != GgufType::STRING) return make_error("BPE vocabulary without tokenizer.ggml.merges");
  v.merge_rank.reserve(merges->count);
  for (size_t i = 0; i < merges->count; i++) v.merge_rank.emplace(std::string(merges->strings[i]), (int32_t)i);
  return Status::Ok();
}

// The special tokens' ids (each inside the vocabulary), and the flags for what encoding adds.
Status read_specials(const GgufFile& f, Vocab& v) {
  const size_t n = v.tokens.size();
  auto id_key = [&](const char* key, int32_t& dst) -> Status {
    auto r = f.get_uint(key);
    if (!r.ok()) return r.error();
    if (r->has_value()) {
      if (**r >= n) return make_error("{} = {} is outside the vocabulary of {} tokens", key, **r, n);
      dst = (int32_t)**r;
    }
    return Status::Ok();
  };
  TANDEM_TRY(id_key("tokenizer.ggml.bos_token_id", v.bos));
  TANDEM_TRY(id_key("tokenizer.ggml.eos_token_id", v.eos));
  TANDEM_TRY(id_key("tokenizer.ggml.eot_token_id", v.eot));
  TANDEM_TRY(id_key("tokenizer.ggml.unknown_token_id", v.unk));
  TANDEM_TRY(id_key("tokenizer.ggml.padding_token_id", v.pad));
  if (v.kind == VocabKind::Spm && v.unk < 0) v.unk = v.find("<unk>");

  auto flag = [&](const char* key, bool& dst) -> Status {
    auto r = f.get_bool(key);
    if (!r.ok()) return r.error();
    if (r->has_value()) dst = **r;
    return Status::Ok();
  };
  v.add_bos = v.kind == VocabKind::Spm;  // SentencePiece models add BOS unless told otherwise
  v.add_space_prefix = v.kind == VocabKind::Spm;
  TANDEM_TRY(flag("tokenizer.ggml.add_bos_token", v.add_bos));
  TANDEM_TRY(flag("tokenizer.ggml.add_eos_token", v.add_eos));
  // GPT-2 style byte-level BPE encodes spaces itself; the flag only applies to SentencePiece.
  if (v.kind == VocabKind::Spm) TANDEM_TRY(flag("tokenizer.ggml.add_space_prefix", v.add_space_prefix));
  else v.add_space_prefix = false;
  if (v.bos < 0) v.add_bos = false;
  return Status::Ok();
}

// End of generation: eos/eot plus the end markers chat templates use. Conversions often
// mislabel these as normal or user-defined; like llama.cpp, treat them as control tokens, so
// that text spelling "</s>" is not an end marker unless special tokens are parsed.
void mark_end_of_generation(Vocab& v) {
  for (int32_t id : {v.eos, v.eot})
    if (id >= 0) v.end_of_generation.push_back(id);
  constexpr std::array<std::string_view, 13> kEndMarkers = {
      "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|endoftext|>", "<|end_of_text|>", "<end_of_turn>", "<|end|>",
      "</s>",       "<EOT>",      "_<EOT>",     "<end_of_utterance>", "<|return|>", "<|call|>"};
  for (auto text : kEndMarkers) {
    const int32_t id = v.find(text);
    if (id < 0) continue;
    if (v.types[id] == TokenType::Normal || v.types[id] == TokenType::UserDefined) v.types[id] = TokenType::Control;
    if (v.types[id] == TokenType::Control && !v.is_eog(id)) v.end_of_generation.push_back(id);
  }
  // gpt-oss (o200k_harmony): <|end|> closes a message (the reasoning), not the answer, which
  // ends with <|return|> or <|call|>. As llama.cpp does, <|end|> is no end of generation
  // when both of those are.
  const int32_t end = v.find("<|end|>"), ret = v.find("<|return|>"), call = v.find("<|call|>");
  if (end >= 0 && ret >= 0 && call >= 0 && v.is_eog(ret) && v.is_eog(call))
    std::erase(v.end_of_generation, end);
}

// Which tokens swallow the whitespace after them (none, but for Phi-3's added tokens).
void mark_rstrip(const GgufFile& f, Vocab& v) {
  const size_t n = v.tokens.size();
  v.rstrip.assign(n, false);
  auto name = f.get_string("general.name");
  std::string model_name = name.ok() && name->has_value() ? std::string(**name) : "";
  for (char& c : model_name) c = (char)std::tolower((unsigned char)c);
  if (model_name.find("phi-3") != std::string::npos || model_name.find("phi3") != std::string::npos) {
    // Phi-3's tokenizer_config marks its added tokens rstrip, except <unk>, <s>, <|endoftext|>.
    for (int32_t id = 0; id < (int32_t)n; id++) {
      const TokenType ty = v.types[id];
      const std::string& t = v.tokens[id];
      v.rstrip[id] = (ty == TokenType::Control || ty == TokenType::UserDefined || ty == TokenType::Unknown || t == "</s>") &&
                     t != "<unk>" && t != "<s>" && t != "<|endoftext|>";
    }
  }
}

}  // namespace

Result<Vocab> Vocab::from_gguf(const GgufFile& f) {
  Vocab v;
  TANDEM_TRY(read_kind(f, v));
  TANDEM_TRY(read_tokens(f, v));
  TANDEM_TRY(read_merges(f, v));
  TANDEM_TRY(read_specials(f, v));
  mark_end_of_generation(v);
  mark_rstrip(f, v);
  return v;
}

}  // namespace tandem
