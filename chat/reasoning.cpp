#include "chat/reasoning.h"

#include <algorithm>
#include <array>

#include <nlohmann/json.hpp>

namespace tandem {

namespace {

constexpr std::string_view kMessage = "<|message|>", kChannel = "<|channel|>", kStart = "<|start|>";
// What ends a Harmony message's body: its terminators, or the next header when the model
// skipped the terminator.
constexpr std::array<std::string_view, 5> kBodyEnds = {"<|end|>", "<|return|>", "<|call|>", kStart, kChannel};
constexpr std::string_view kThinkOpen = "<think>", kThinkClose = "</think>";

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

std::string_view ltrim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  return s;
}

// Where a suffix of `s` that may be the start of one of `markers` begins (s.size() if none).
template <typename Markers>
size_t partial_marker_start(std::string_view s, const Markers& markers) {
  for (size_t at = s.size() >= 16 ? s.size() - 16 : 0; at < s.size(); at++) {
    const std::string_view tail = s.substr(at);
    for (std::string_view m : markers)
      if (tail.size() < m.size() && m.substr(0, tail.size()) == tail) return at;
  }
  return s.size();
}

// The earliest of `markers` in `s`: its position and length (npos when none).
template <typename Markers>
std::pair<size_t, size_t> first_marker(std::string_view s, const Markers& markers) {
  std::pair<size_t, size_t> best{std::string_view::npos, 0};
  for (std::string_view m : markers) {
    const size_t at = s.find(m);
    if (at < best.first) best = {at, m.size()};
  }
  return best;
}

// The word after `key` in a Harmony header, up to whitespace or markup ("" when absent).
std::string header_word(std::string_view header, std::string_view key) {
  const size_t at = header.find(key);
  if (at == std::string_view::npos) return "";
  std::string_view rest = header.substr(at + key.size());
  size_t n = 0;
  while (n < rest.size() && !is_space(rest[n]) && rest[n] != '<') n++;
  return std::string(rest.substr(0, n));
}

}  // namespace

const char* reasoning_format_name(ReasoningFormat f) {
  switch (f) {
    case ReasoningFormat::Harmony: return "harmony";
    case ReasoningFormat::Think: return "think";
    case ReasoningFormat::None: break;
  }
  return "none";
}

ReasoningFormat detect_reasoning_format(std::string_view source) {
  if (source.find(kChannel) != std::string_view::npos) return ReasoningFormat::Harmony;
  if (source.find(kThinkOpen) != std::string_view::npos || source.find(kThinkClose) != std::string_view::npos)
    return ReasoningFormat::Think;
  return ReasoningFormat::None;
}

std::vector<std::string> reasoning_markers(ReasoningFormat f) {
  if (f == ReasoningFormat::Harmony)
    return {"<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|constrain|>", "<|return|>", "<|call|>"};
  if (f == ReasoningFormat::Think) return {"<think>", "</think>"};
  return {};
}

ReasoningStream::ReasoningStream(ReasoningFormat format, std::string_view prompt_tail) : format_(format) {
  std::string_view t = prompt_tail;
  while (!t.empty() && is_space(t.back())) t.remove_suffix(1);
  if (format_ == ReasoningFormat::Think && t.size() >= kThinkOpen.size() && t.substr(t.size() - kThinkOpen.size()) == kThinkOpen)
    think_state_ = 1;
}

ReasoningOutput ReasoningStream::push(std::string_view text) {
  ReasoningOutput out;
  buf_.append(text);
  run(false, &out);
  return out;
}

ReasoningOutput ReasoningStream::finish() {
  ReasoningOutput out;
  run(true, &out);
  return out;
}

void ReasoningStream::run(bool final, ReasoningOutput* out) {
  if (format_ == ReasoningFormat::Harmony) return run_harmony(final, out);
  if (format_ == ReasoningFormat::Think) return run_think(final, out);
  out->content += buf_;
  buf_.clear();
}

void ReasoningStream::harmony_header(const std::string& header) {
  const std::string to = header_word(header, "to=");
  const std::string channel = header_word(header, kChannel);
  call_name_.clear();
  call_args_.clear();
  if (to.rfind("functions.", 0) == 0) {
    sink_ = Sink::Call;
    call_name_ = to.substr(10);
  } else if (channel == "analysis" || !to.empty()) {
    sink_ = Sink::Reasoning;  // a built-in tool's call (browser, python) is the model's own work
  } else {
    sink_ = Sink::Content;  // final, commentary to the user, or no channel
  }
}

void ReasoningStream::end_message(ReasoningOutput* out) {
  if (sink_ == Sink::Call && !call_name_.empty()) {
    ToolCall c;
    c.name = call_name_;
    const auto j = nlohmann::ordered_json::parse(call_args_, nullptr, false);
    c.arguments = !j.is_discarded() && j.is_object() ? j.dump() : std::string(ltrim(call_args_));
    out->calls.push_back(std::move(c));
  }
  in_body_ = false;
  sink_ = Sink::Content;
  call_name_.clear();
  call_args_.clear();
}

void ReasoningStream::run_harmony(bool final, ReasoningOutput* out) {
  while (!buf_.empty()) {
    if (!in_body_) {
      // A header: "<|channel|>...", " to=..." or "<|start|>assistant...", up to <|message|>.
      // Anything else is an answer written without channels: content.
      std::string_view b = buf_;
      const auto starts = [&](std::string_view m) { return b.substr(0, m.size()) == m; };
      const auto prefix_of = [&](std::string_view m) { return b.size() < m.size() && m.substr(0, b.size()) == b; };
      const bool header = starts("<|") || starts(" to=");
      if (!header) {
        if (!final && (prefix_of("<|") || prefix_of(" to="))) return;
        in_body_ = true;
        sink_ = Sink::Content;
        continue;
      }
      const size_t m = b.find(kMessage);
      if (m == std::string_view::npos) {
        if (final) buf_.clear();  // a header cut short says nothing
        return;
      }
      harmony_header(std::string(b.substr(0, m)));
      buf_.erase(0, m + kMessage.size());
      in_body_ = true;
      continue;
    }
    std::string_view b = buf_;
    const auto [at, len] = first_marker(b, kBodyEnds);
    size_t emit = at != std::string_view::npos ? at : final ? b.size() : partial_marker_start(b, kBodyEnds);
    std::string piece(b.substr(0, emit));
    if (sink_ == Sink::Call) call_args_ += piece;
    else (sink_ == Sink::Reasoning ? out->reasoning : out->content) += piece;
    if (at != std::string_view::npos) {
      const std::string_view marker = b.substr(at, len);
      // The next header's own markup stays for the header.
      const bool keep = marker == kStart || marker == kChannel;
      buf_.erase(0, keep ? at : at + len);
      end_message(out);
      continue;
    }
    buf_.erase(0, emit);
    if (final) end_message(out);
    return;
  }
  if (final && in_body_) end_message(out);
}

void ReasoningStream::run_think(bool final, ReasoningOutput* out) {
  const std::array<std::string_view, 1> open{kThinkOpen}, close{kThinkClose};
  while (true) {
    if (think_state_ == 0) {
      const std::string_view t = ltrim(buf_);
      if (t.rfind(kThinkOpen, 0) == 0) {
        buf_.erase(0, buf_.size() - t.size() + kThinkOpen.size());
        think_state_ = 1;
        continue;
      }
      if (!final && (t.empty() || partial_marker_start(t, open) == 0)) return;
      think_state_ = 2;
      continue;
    }
    if (think_state_ == 1) {
      // Reasoning: whitespace next to the tags is dropped.
      if (!reasoning_started_) {
        buf_.erase(0, buf_.size() - ltrim(buf_).size());
        if (buf_.empty()) return;
        reasoning_started_ = true;
      }
      std::string_view b = buf_;
      const size_t close_at = b.find(kThinkClose);
      size_t emit = close_at != std::string_view::npos ? close_at : final ? b.size() : partial_marker_start(b, close);
      size_t keep_ws = emit;
      while (keep_ws > 0 && is_space(b[keep_ws - 1])) keep_ws--;
      if (close_at != std::string_view::npos || final) {
        out->reasoning += std::string(b.substr(0, keep_ws));
        if (close_at == std::string_view::npos) {
          buf_.clear();
          return;
        }
        buf_.erase(0, close_at + kThinkClose.size());
        think_state_ = 2;
        trim_content_start_ = true;
        continue;
      }
      out->reasoning += std::string(b.substr(0, keep_ws));
      buf_.erase(0, keep_ws);
      return;
    }
    if (trim_content_start_) {
      const std::string_view t = ltrim(buf_);
      if (t.empty()) {
        if (final) buf_.clear();
        return;
      }
      buf_.erase(0, buf_.size() - t.size());
      trim_content_start_ = false;
    }
    out->content += buf_;
    buf_.clear();
    return;
  }
}

ReasoningOutput parse_reasoning(ReasoningFormat format, std::string_view text, std::string_view prompt_tail) {
  ReasoningStream s(format, prompt_tail);
  ReasoningOutput a = s.push(text), b = s.finish();
  a.content += b.content;
  a.reasoning += b.reasoning;
  for (ToolCall& c : b.calls) a.calls.push_back(std::move(c));
  return a;
}

}  // namespace tandem
