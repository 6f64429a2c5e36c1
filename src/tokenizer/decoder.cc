// Decoder configuration and the streaming decoder (see decoder.h).
#include "tokenizer/decoder.h"

#include <nlohmann/json.hpp>

#include "core/strings.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace tandem::tok {
namespace {

using nlohmann::json;

constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The byte of a "<0xXX>" token (HF: six bytes, "<0x" prefix, '>' suffix, u8::from_str_radix of the middle two
// characters, which also accepts "+X"), or -1.
int byte_token_value(std::string_view t) {
  if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
  if (t[3] == '+') return hex_digit(t[4]);
  const int hi = hex_digit(t[3]), lo = hex_digit(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

void replace_all(std::string* s, std::string_view pattern, std::string_view content) {
  if (s->find(pattern) == std::string::npos) return;
  std::string r;
  size_t pos = 0;
  while (true) {
    const size_t hit = s->find(pattern, pos);
    if (hit == std::string::npos) break;
    r.append(*s, pos, hit - pos).append(content);
    pos = hit + pattern.size();
  }
  r.append(*s, pos, std::string::npos);
  s->swap(r);
}

// HF's Strip decoder on one token: up to `start` leading and `stop` trailing copies of the character `c`.
std::string strip_token(std::string_view t, std::string_view c, int start, int stop) {
  size_t b = 0, e = t.size();
  for (int i = 0; i < start && t.substr(b, c.size()) == c; ++i) b += c.size();
  for (int i = 0; i < stop && e >= b + c.size() && t.substr(e - c.size(), c.size()) == c; ++i) e -= c.size();
  return std::string(t.substr(b, e - b));
}

}  // namespace

// ---- DecoderConfig ----

Result<DecoderConfig> DecoderConfig::from_json(const json& j) {
  DecoderConfig d;
  if (j.is_null()) {
    d.join_with_spaces_ = true;
    return d;
  }
  TANDEM_TRY(d.add(j));
  d.fuse_index_ = d.steps_.size();
  for (size_t k = 0; k < d.steps_.size(); ++k) {
    if (d.steps_[k].kind == DecoderStep::Kind::kFuse) {
      d.fuse_index_ = k;
      break;
    }
  }
  for (size_t k = d.fuse_index_; k < d.steps_.size(); ++k) {
    if (d.steps_[k].kind == DecoderStep::Kind::kByteFallback) {
      return unsupported("decoder: ByteFallback after Fuse is not supported");
    }
  }
  return d;
}

Status DecoderConfig::add(const json& j) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) return corrupt("decoder without a \"type\"");
  const std::string type = j["type"].get<std::string>();
  DecoderStep s;
  if (type == "Sequence") {
    if (!j.contains("decoders") || !j["decoders"].is_array()) return corrupt("decoder Sequence: missing \"decoders\"");
    for (const json& d : j["decoders"]) TANDEM_TRY(add(d));
    return ok_status();
  }
  if (type == "Replace") {
    s.kind = DecoderStep::Kind::kReplace;
    if (!j.contains("pattern") || !j["pattern"].is_object()) return corrupt("decoder Replace: missing \"pattern\"");
    if (j["pattern"].contains("Regex")) return unsupported("decoder Replace: regex patterns are not supported");
    if (!j["pattern"].contains("String") || !j["pattern"]["String"].is_string() || !j.contains("content") ||
        !j["content"].is_string()) {
      return corrupt("decoder Replace: bad \"pattern\" or \"content\"");
    }
    s.pattern = j["pattern"]["String"].get<std::string>();
    s.content = j["content"].get<std::string>();
    if (s.pattern.empty()) return unsupported("decoder Replace: empty pattern");
  } else if (type == "ByteFallback") {
    s.kind = DecoderStep::Kind::kByteFallback;
  } else if (type == "Fuse") {
    s.kind = DecoderStep::Kind::kFuse;
  } else if (type == "Strip") {
    s.kind = DecoderStep::Kind::kStrip;
    if (!j.contains("content") || !j["content"].is_string() || !j.contains("start") ||
        !j["start"].is_number_unsigned() || !j.contains("stop") || !j["stop"].is_number_unsigned()) {
      return corrupt("decoder Strip: bad \"content\", \"start\" or \"stop\"");
    }
    s.content = j["content"].get<std::string>();
    if (s.content.empty() ||
        static_cast<size_t>(utf8_seq_len(static_cast<uint8_t>(s.content[0]))) != s.content.size()) {
      return corrupt("decoder Strip: \"content\" must be one character");
    }
    s.start = static_cast<int>(std::min<uint64_t>(j["start"].get<uint64_t>(), 1u << 20));
    s.stop = static_cast<int>(std::min<uint64_t>(j["stop"].get<uint64_t>(), 1u << 20));
  } else {
    return unsupported(strfmt("decoder type \"%s\" is not supported", type.c_str()));
  }
  steps_.push_back(std::move(s));
  return ok_status();
}

// ---- StreamDecoder ----

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tok_(&tokenizer), skip_special_(skip_special_tokens) {
  reset();
}

void StreamDecoder::reset() {
  const size_t n = tok_->decoder_config().steps().size();
  held_.assign(n, std::string());
  lead_cut_.assign(n, 0);
  started_.assign(n, false);
  n_tokens_ = 0;
}

void StreamDecoder::push(int32_t id, std::string* out) {
  const std::optional<std::string_view> t = tok_->id_to_token(id);
  if (!t) return;
  if (skip_special_ && tok_->is_special(id)) return;
  if (tok_->decoder_config().join_with_spaces()) {
    if (n_tokens_ > 0) out->push_back(' ');
    out->append(*t);
  } else {
    run(0, std::string(*t), out);
  }
  ++n_tokens_;
}

void StreamDecoder::run(size_t step, std::string token, std::string* out) {
  const DecoderConfig& cfg = tok_->decoder_config();
  const std::vector<DecoderStep>& steps = cfg.steps();
  for (size_t k = step; k < cfg.fuse_index(); ++k) {
    const DecoderStep& s = steps[k];
    switch (s.kind) {
      case DecoderStep::Kind::kReplace:
        replace_all(&token, s.pattern, s.content);
        break;
      case DecoderStep::Kind::kStrip:
        token = strip_token(token, s.content, s.start, s.stop);
        break;
      case DecoderStep::Kind::kByteFallback: {
        const int b = byte_token_value(token);
        if (b >= 0) {
          held_[k].push_back(static_cast<char>(b));
          return;
        }
        flush_bytes(k, out);
        break;
      }
      case DecoderStep::Kind::kFuse:
        break;
    }
  }
  emit_text(token, out);
}

void StreamDecoder::flush_bytes(size_t step, std::string* out) {
  if (held_[step].empty()) return;
  std::string bytes;
  bytes.swap(held_[step]);
  if (utf8_invalid_offset(bytes) == bytes.size()) {
    run(step + 1, std::move(bytes), out);
  } else {
    for (size_t i = 0; i < bytes.size(); ++i) run(step + 1, std::string(kReplacementChar), out);
  }
}

void StreamDecoder::emit_text(std::string_view text, std::string* out) {
  post_fuse(tok_->decoder_config().fuse_index(), text, false, out);
}

void StreamDecoder::post_fuse(size_t k, std::string_view text, bool final, std::string* out) {
  const std::vector<DecoderStep>& steps = tok_->decoder_config().steps();
  if (k >= steps.size()) {
    out->append(text);
    return;
  }
  const DecoderStep& s = steps[k];
  if (s.kind == DecoderStep::Kind::kFuse) {
    post_fuse(k + 1, text, final, out);
    return;
  }
  std::string buf = held_[k];
  buf.append(text);
  held_[k].clear();
  if (s.kind == DecoderStep::Kind::kReplace) {
    std::string done;
    size_t pos = 0;
    while (true) {
      const size_t hit = buf.find(s.pattern, pos);
      if (hit == std::string::npos) break;
      done.append(buf, pos, hit - pos).append(s.content);
      pos = hit + s.pattern.size();
    }
    size_t keep = 0;  // longest tail that may still become a match
    if (!final) {
      for (size_t l = std::min(s.pattern.size() - 1, buf.size() - pos); l > 0; --l) {
        if (buf.compare(buf.size() - l, l, s.pattern, 0, l) == 0) {
          keep = l;
          break;
        }
      }
    }
    done.append(buf, pos, buf.size() - pos - keep);
    held_[k] = buf.substr(buf.size() - keep);
    post_fuse(k + 1, done, final, out);
    return;
  }
  // Strip over the whole text.
  const std::string& c = s.content;
  size_t b = 0;
  while (!started_[k] && b < buf.size()) {
    if (lead_cut_[k] < s.start && buf.compare(b, c.size(), c) == 0) {
      b += c.size();
      ++lead_cut_[k];
    } else {
      started_[k] = true;
    }
  }
  size_t e = buf.size();
  int run = 0;
  while (run < s.stop && e >= b + c.size() && buf.compare(e - c.size(), c.size(), c) == 0) {
    e -= c.size();
    ++run;
  }
  if (!final) held_[k] = buf.substr(e);  // the tail may still be cut if the text ends here
  post_fuse(k + 1, std::string_view(buf).substr(b, e - b), final, out);
}

void StreamDecoder::finish(std::string* out) {
  const DecoderConfig& cfg = tok_->decoder_config();
  if (!cfg.join_with_spaces()) {
    for (size_t k = 0; k < cfg.fuse_index(); ++k) {
      if (cfg.steps()[k].kind == DecoderStep::Kind::kByteFallback) flush_bytes(k, out);
    }
    post_fuse(cfg.fuse_index(), "", true, out);
  }
  reset();
}

}  // namespace tandem::tok
