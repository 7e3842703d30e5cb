#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <cctype>
#include <queue>
#include <span>
#include <unordered_map>

#include <fmt/format.h>

#include "tokenizer/utf8.h"

namespace tandem {

namespace {

// GPT-2's reversible map from bytes to printable code points: printable Latin-1 bytes stand
// for themselves, the other 68 bytes take code points from U+0100 on.
std::vector<uint32_t> gpt2_byte_code_points() {
  std::vector<uint32_t> cp(256, 0);
  std::vector<bool> direct(256, false);
  for (int b = 33; b <= 126; b++) direct[b] = true;
  for (int b = 161; b <= 172; b++) direct[b] = true;
  for (int b = 174; b <= 255; b++) direct[b] = true;
  uint32_t next = 256;
  for (int b = 0; b < 256; b++) cp[b] = direct[b] ? (uint32_t)b : next++;
  return cp;
}

struct Fragment {
  int32_t token = -1;     // >= 0: an already-matched special token
  std::string_view text;  // raw text otherwise
};

// One symbol of a word under merging: a byte range of the word, linked to its neighbours.
struct Symbol {
  int prev, next;
  size_t start, len;
};

struct Bigram {
  int left, right;
  double priority;  // lower merges first (BPE rank, or minus the SPM score)
  size_t size;      // combined length when queued: a later mismatch means it is stale
  bool operator>(const Bigram& o) const { return priority > o.priority || (priority == o.priority && left > o.left); }
};

// Merges adjacent symbols of `word` (starting from its characters `chars`) by lowest priority
// until no pair is mergeable.
// `priority_of(text)` gives a pair's priority or nothing. Returns the surviving symbols.
template <typename PriorityFn>
std::vector<std::string_view> merge_symbols(std::string_view word, std::span<const std::string_view> chars,
                                            PriorityFn priority_of) {
  std::vector<Symbol> sym;
  sym.reserve(chars.size());
  for (size_t i = 0; i < chars.size(); i++)
    sym.push_back({(int)i - 1, i + 1 < chars.size() ? (int)i + 1 : -1, (size_t)(chars[i].data() - word.data()),
                   chars[i].size()});
  std::priority_queue<Bigram, std::vector<Bigram>, std::greater<Bigram>> queue;
  auto add = [&](int l, int r) {
    if (l < 0 || r < 0) return;
    const std::string_view left = word.substr(sym[l].start, sym[l].len);
    const std::string_view right = word.substr(sym[r].start, sym[r].len);
    double p;
    if (priority_of(left, right, &p)) queue.push({l, r, p, left.size() + right.size()});
  };
  for (int i = 1; i < (int)sym.size(); i++) add(i - 1, i);
  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& L = sym[b.left];
    Symbol& R = sym[b.right];
    if (L.len == 0 || R.len == 0 || L.len + R.len != b.size) continue;
    L.len += R.len;
    R.len = 0;
    L.next = R.next;
    if (R.next >= 0) sym[R.next].prev = b.left;
    add(L.prev, b.left);
    add(b.left, L.next);
  }
  std::vector<std::string_view> out;
  for (int i = sym.empty() ? -1 : 0; i >= 0; i = sym[i].next)
    if (sym[i].len) out.push_back(word.substr(sym[i].start, sym[i].len));
  return out;
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_gguf(const GgufFile& f) {
  auto v = Vocab::from_gguf(f);
  if (!v.ok()) return v.error();
  return create(std::move(v.value()));
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::create(Vocab vocab) {
  std::unique_ptr<Tokenizer> t(new Tokenizer(std::move(vocab)));
  const Vocab& v = t->vocab_;
  if (v.kind == VocabKind::Bpe) {
    auto pre = PreTokenizer::create(v.pre);
    if (!pre.ok()) return pre.error();
    t->pre_ = std::move(pre.value());
    for (uint32_t cp : gpt2_byte_code_points()) t->byte_to_unicode_.push_back(utf8_encode(cp));
  } else {
    t->byte_tokens_.assign(256, -1);
    for (int b = 0; b < 256; b++) t->byte_tokens_[b] = v.find(fmt::format("<0x{:02X}>", b));
    const std::string_view space = "\xe2\x96\x81";
    t->spm_words_independent_ = std::none_of(v.tokens.begin(), v.tokens.end(), [&](const std::string& tok) {
      for (size_t at = tok.find(space, 1); at != std::string::npos; at = tok.find(space, at + 1))
        if (at < 3 || tok.compare(at - 3, 3, space) != 0) return true;  // a '▁' after another character
      return false;
    });
  }
  for (int32_t id = 0; id < v.size(); id++) {
    const TokenType ty = v.types[id];
    if ((ty == TokenType::Control || ty == TokenType::UserDefined || ty == TokenType::Unknown) && !v.tokens[id].empty())
      t->special_tokens_.push_back(id);
  }
  std::stable_sort(t->special_tokens_.begin(), t->special_tokens_.end(),
                   [&](int32_t a, int32_t b) { return v.tokens[a].size() > v.tokens[b].size(); });
  std::vector<std::string_view> texts;
  texts.reserve(t->special_tokens_.size());
  for (int32_t id : t->special_tokens_) texts.push_back(v.tokens[id]);
  t->special_trie_ = SpecialTrie(texts);
  return t;
}

std::vector<int32_t> Tokenizer::encode_chat(const RenderedPrompt& prompt, bool allow_special_in_messages) const {
  const ByteSpans* data = allow_special_in_messages || prompt.data_spans.empty() ? nullptr : &prompt.data_spans;
  std::vector<int32_t> ids = encode_text(prompt.text, vocab_.add_bos, true, data);
  if (vocab_.add_bos && ids.size() >= 2 && ids[0] == vocab_.bos && ids[1] == vocab_.bos) ids.erase(ids.begin());
  return ids;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  return encode_text(text, add_special, parse_special, nullptr);
}

namespace {

// True when [begin, end) shares a byte with one of the sorted, disjoint spans.
bool overlaps(const ByteSpans& spans, size_t begin, size_t end) {
  auto it = std::upper_bound(spans.begin(), spans.end(), begin,
                             [](size_t pos, const std::pair<size_t, size_t>& s) { return pos < s.second; });
  return it != spans.end() && it->first < end;
}

}  // namespace

std::vector<int32_t> Tokenizer::encode_text(std::string_view text, bool add_special, bool parse_special,
                                            const ByteSpans* data) const {
  // Special tokens first, longest first, so "<|im_start|>" is never split by the regexes. Only
  // whole special tokens are cut out: the text between them (template text and request data
  // alike) is pre-tokenized as one piece, exactly as without data spans.
  // The split is the same as trying every special token in turn; tokens absent from the
  // text (most of Gemma's 6,414) are skipped up front.
  std::vector<Fragment> frags;
  if (!text.empty()) frags.push_back({-1, text});  // empty text has no fragment (no lone space prefix)
  std::vector<bool> occurs(special_tokens_.size(), false);
  special_trie_.mark_occurring(text, occurs);
  for (size_t k = 0; k < special_tokens_.size(); k++) {
    if (!occurs[k]) continue;
    const int32_t id = special_tokens_[k];
    const TokenType ty = vocab_.types[id];
    if (!parse_special && ty != TokenType::UserDefined) continue;
    const std::string& st = vocab_.tokens[id];
    std::vector<Fragment> next;
    for (const Fragment& f : frags) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      // In request data only user-defined tokens match: a control token there is text.
      const bool check_data = data && ty != TokenType::UserDefined;
      size_t pos = 0;
      for (size_t hit, from = 0; (hit = f.text.find(st, from)) != std::string_view::npos;) {
        const size_t at = (size_t)(f.text.data() - text.data()) + hit;
        if (check_data && overlaps(*data, at, at + st.size())) {
          from = hit + 1;
          continue;
        }
        if (hit > pos) next.push_back({-1, f.text.substr(pos, hit - pos)});
        next.push_back({id, {}});
        pos = hit + st.size();
        if (vocab_.rstrip[id])  // the token swallows the whitespace after it
          while (pos < f.text.size() && std::isspace((unsigned char)f.text[pos])) pos++;
        from = pos;
      }
      if (pos < f.text.size()) next.push_back({-1, f.text.substr(pos)});
    }
    frags.swap(next);
  }

  std::vector<int32_t> out;
  if (add_special && vocab_.add_bos) out.push_back(vocab_.bos);
  bool prev_special = true;  // SentencePiece prefixes a space at the start and after special tokens
  for (const Fragment& f : frags) {
    if (f.token >= 0) {
      out.push_back(f.token);
      prev_special = true;
      continue;
    }
    if (vocab_.kind == VocabKind::Bpe) {
      encode_bpe(f.text, out);
    } else {
      std::string s = (vocab_.add_space_prefix && prev_special) ? " " : "";
      s.append(f.text);
      encode_spm(s, out);
    }
    prev_special = false;
  }
  if (add_special && vocab_.add_eos && vocab_.eos >= 0) out.push_back(vocab_.eos);
  return out;
}

void Tokenizer::encode_bpe(std::string_view raw, std::vector<int32_t>& out) const {
  std::string repaired;
  std::string_view text = raw;
  if (!utf8_valid(raw)) {
    repaired = utf8_replace_invalid(raw);
    text = repaired;
  }
  for (std::string_view piece : pre_->split(text)) {
    std::string word;  // the piece in the byte-level alphabet
    for (unsigned char c : piece) word += byte_to_unicode_[c];
    encode_bpe_word(word, out);
  }
}

void Tokenizer::encode_bpe_word(std::string_view word, std::vector<int32_t>& out) const {
  std::string key;
  auto rank = [&](std::string_view l, std::string_view r, double* p) {
    key.assign(l).append(" ").append(r);
    auto it = vocab_.merge_rank.find(key);
    if (it == vocab_.merge_rank.end()) return false;
    *p = it->second;
    return true;
  };
  for (std::string_view s : merge_symbols(word, utf8_chars(word), rank)) {
    const int32_t id = vocab_.find(s);
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    // Unmerged leftovers: one token per character, else per byte (as llama.cpp does). A
    // character the vocabulary cannot spell is dropped, not replaced by <unk>: some vocabs'
    // <unk> is <|endoftext|>, which would end the prompt.
    for (std::string_view ch : utf8_chars(s)) {
      const int32_t cid = vocab_.find(ch);
      if (cid >= 0) {
        out.push_back(cid);
        continue;
      }
      for (char b : ch) {
        const int32_t bid = vocab_.find(std::string_view(&b, 1));
        if (bid >= 0) out.push_back(bid);
      }
    }
  }
}

void Tokenizer::encode_spm(std::string_view text, std::vector<int32_t>& out) const {
  std::string escaped;  // spaces become U+2581 '▁'
  for (char c : text) {
    if (c == ' ')
      escaped += "\xe2\x96\x81";
    else
      escaped += c;
  }
  auto score = [&](std::string_view l, std::string_view r, double* p) {
    const std::string_view joined(l.data(), l.size() + r.size());  // neighbours are adjacent in `escaped`
    const int32_t id = vocab_.find(joined);
    if (id < 0) return false;
    *p = -(double)vocab_.scores[id];  // highest score merges first
    return true;
  };
  // Words start at a '▁' character that follows another character (a broken lead byte just
  // before a '▁' swallows its bytes, as in llama.cpp, so words are cut at characters).
  const std::vector<std::string_view> chars = utf8_chars_by_lead(escaped);
  const std::string_view space = "\xe2\x96\x81";
  size_t first = 0;
  for (size_t k = 0; k <= chars.size(); k++) {
    const bool cut = k == chars.size() ||
                     (spm_words_independent_ && k > 0 && chars[k] == space && chars[k - 1] != space);
    if (!cut || k == first) continue;
    const std::span<const std::string_view> word_chars(chars.data() + first, k - first);
    const std::string_view word(word_chars.front().data(),
                                word_chars.back().data() + word_chars.back().size() - word_chars.front().data());
    for (std::string_view sym : merge_symbols(word, word_chars, score)) encode_spm_symbol(sym, out);
    first = k;
  }
}

void Tokenizer::encode_spm_symbol(std::string_view s, std::vector<int32_t>& out) const {
  const int32_t id = vocab_.find(s);
  if (id >= 0) {
    out.push_back(id);
    return;
  }
  for (unsigned char b : s) {  // byte fallback
    const int32_t bid = byte_tokens_[b];
    if (bid >= 0) out.push_back(bid);
    else if (vocab_.unk >= 0) out.push_back(vocab_.unk);
  }
}

std::string Tokenizer::token_to_piece(int32_t id, bool special) const {
  if (id < 0 || id >= vocab_.size()) return {};
  const std::string& text = vocab_.tokens[id];
  switch (vocab_.types[id]) {
    case TokenType::Control:
    case TokenType::Unknown:
    case TokenType::Unused: return special ? text : std::string();
    case TokenType::UserDefined: return text;
    case TokenType::Byte:
      if (vocab_.kind == VocabKind::Spm && text.size() == 6)
        return std::string(1, (char)std::stoi(text.substr(3, 2), nullptr, 16));
      break;
    default: break;
  }
  if (vocab_.kind == VocabKind::Spm) {
    std::string s;
    for (size_t i = 0; i < text.size();) {
      if (text.compare(i, 3, "\xe2\x96\x81") == 0) {
        s += ' ';
        i += 3;
      } else {
        s += text[i++];
      }
    }
    return s;
  }
  // Byte-level BPE: map each stand-in code point back to its byte.
  static const std::unordered_map<uint32_t, unsigned char> unicode_to_byte = [] {
    std::unordered_map<uint32_t, unsigned char> m;
    auto cps = gpt2_byte_code_points();
    for (int b = 0; b < 256; b++) m[cps[b]] = (unsigned char)b;
    return m;
  }();
  std::string s;
  for (size_t i = 0; i < text.size();) {
    const size_t start = i;
    const uint32_t cp = utf8_decode(text, i);
    auto it = unicode_to_byte.find(cp);
    if (it != unicode_to_byte.end())
      s += (char)it->second;
    else
      s.append(text, start, i - start);
  }
  return s;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool special) const {
  std::string s;
  for (int32_t id : ids) s += token_to_piece(id, special);
  return s;
}

}  // namespace tandem
