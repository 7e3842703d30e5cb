#include "server/text_stream.h"

#include <algorithm>

namespace tandem::server {

TextStream::TextStream(std::vector<std::string> stops) : stops_(std::move(stops)) {
  stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
  for (const auto& s : stops_) hold_ = std::max(hold_, s.size() - 1);
}

std::string TextStream::push(const std::string& piece) {
  if (stopped_) return {};
  // Complete sequences only; bytes that can never be UTF-8 become U+FFFD, so whatever the
  // model emits, the text is valid JSON.
  pending_ += utf8_replace_invalid(utf8_.push(piece));
  size_t cut = std::string::npos;
  for (const auto& s : stops_)
    if (const size_t at = pending_.find(s); at < cut) {
      cut = at;
      matched_ = s;
    }
  if (cut != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, cut);
    pending_.clear();
    return out;
  }
  // Keep back what could be the start of a stop string, cut at a character boundary.
  size_t keep = std::min(hold_, pending_.size());
  size_t send = pending_.size() - keep;
  while (send > 0 && send < pending_.size() && ((unsigned char)pending_[send] & 0xC0) == 0x80) send--;
  std::string out = pending_.substr(0, send);
  pending_.erase(0, send);
  return out;
}

std::string TextStream::flush() {
  if (stopped_) return {};
  // The generation ended inside a character: its bytes become U+FFFD (as a tokenizer's
  // decode(errors="replace") would), never a broken sequence.
  std::string out = pending_ + utf8_replace_invalid(utf8_.flush());
  pending_.clear();
  return out;
}

}  // namespace tandem::server
