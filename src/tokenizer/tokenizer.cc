// Loading tokenizer.json and encoding/decoding with it (see tokenizer.h).
#include "tokenizer/tokenizer.h"

#include <cstdio>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>

#include <nlohmann/json.hpp>

#include "core/log.h"
#include "core/strings.h"
#include "tokenizer/json_scan.h"
#include "tokenizer/utf8.h"

namespace tandem::tok {
namespace {

using nlohmann::json;

Result<std::string> read_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return not_found(strfmt("%s: no such file", path.c_str()));
  if (!std::filesystem::is_regular_file(path, ec)) return invalid_argument(strfmt("%s: not a file", path.c_str()));
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return io_error(strfmt("%s: cannot open", path.c_str()));
  std::string data;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) data.append(buf, n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return io_error(strfmt("%s: read error", path.c_str()));
  return data;
}

// Parses a small section with nlohmann; errors name the source and the section.
Result<json> parse_section(std::string_view raw, const std::string& source, const char* name) {
  json j = json::parse(raw.begin(), raw.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return corrupt(strfmt("%s: \"%s\" is not valid JSON", source.c_str(), name));
  return j;
}

struct Sections {
  std::map<std::string, std::string_view> top;       // raw text of each top-level value but "model"
  std::map<std::string, std::string_view> model;     // raw text of each "model" field
  std::map<std::string, size_t> model_field_offset;  // byte offset of each "model" field, for messages
  bool have_model = false;
};

Status scan_object(JsonCursor& c, const std::string& what, std::map<std::string, std::string_view>* out,
                   std::map<std::string, size_t>* offsets, const std::function<Status(const std::string&)>& special) {
  TANDEM_TRY(c.expect('{'));
  if (c.consume('}')) return ok_status();
  std::string scratch;
  while (true) {
    std::string_view key_view;
    TANDEM_TRY(c.read_string(&key_view, &scratch));
    const std::string key(key_view);
    TANDEM_TRY(c.expect(':'));
    if (out->count(key) != 0) return c.error(strfmt("duplicate key \"%s\" in %s", key.c_str(), what.c_str()));
    if (special && key == "model") {
      TANDEM_TRY(special(key));
      (*out)[key] = std::string_view();
    } else {
      c.skip_ws();
      if (offsets != nullptr) (*offsets)[key] = c.pos();
      std::string_view raw;
      TANDEM_TRY(c.skip_value(&raw));
      (*out)[key] = raw;
    }
    if (c.consume(',')) continue;
    return c.expect('}');
  }
}

Status scan_sections(std::string_view text, const std::string& source, Sections* s) {
  JsonCursor c(text, source);
  std::map<std::string, std::string_view> top;
  auto model = [&](const std::string&) -> Status {
    s->have_model = true;
    c.skip_ws();
    if (c.peek() != '{') return c.error("\"model\" is not an object");
    return scan_object(c, "\"model\"", &s->model, &s->model_field_offset, nullptr);
  };
  TANDEM_TRY(scan_object(c, "the top-level object", &top, nullptr, model));
  if (!c.at_end()) return c.error("data after the top-level object");
  top.erase("model");
  s->top = std::move(top);
  return ok_status();
}

Status parse_vocab(std::string_view raw, size_t base, const std::string& source, BpeModel* bpe) {
  JsonCursor c(raw, source, base);
  TANDEM_TRY(c.expect('{'));
  // Roughly one entry per 12 bytes of JSON in real files; reserving avoids rehashing 262k entries.
  bpe->reserve(raw.size() / 12 + 16, raw.size(), 0);
  if (c.consume('}')) return ok_status();
  std::string scratch;
  while (true) {
    std::string_view token;
    TANDEM_TRY(c.read_string(&token, &scratch));
    TANDEM_TRY(c.expect(':'));
    int64_t id = 0;
    TANDEM_TRY(c.read_int(&id));
    if (id < 0 || id >= (1 << 24)) return c.error(strfmt("vocabulary id %lld out of range", (long long)id));
    if (!bpe->add_token(token, static_cast<int32_t>(id))) {
      return c.error(strfmt("token \"%.*s\" appears twice in the vocabulary", (int)token.size(), token.data()));
    }
    if (c.consume(',')) continue;
    return c.expect('}');
  }
}

Status parse_merges(std::string_view raw, size_t base, const std::string& source, BpeModel* bpe) {
  JsonCursor c(raw, source, base);
  TANDEM_TRY(c.expect('['));
  std::vector<BpeModel::MergeText> merges;
  merges.reserve(raw.size() / 16 + 16);
  std::deque<std::string> decoded;  // parts that had escapes (stable addresses)
  std::string scratch;
  auto keep = [&](std::string_view s) -> std::string_view {
    if (s.data() != scratch.data()) return s;  // a view of the file text
    decoded.push_back(scratch);
    return decoded.back();
  };
  if (!c.consume(']')) {
    while (true) {
      std::string_view a, b;
      if (c.peek() == '[') {  // ["a", "b"]
        TANDEM_TRY(c.expect('['));
        TANDEM_TRY(c.read_string(&a, &scratch));
        a = keep(a);
        TANDEM_TRY(c.expect(','));
        TANDEM_TRY(c.read_string(&b, &scratch));
        b = keep(b);
        TANDEM_TRY(c.expect(']'));
      } else {  // "a b": split at the first space
        std::string_view m;
        TANDEM_TRY(c.read_string(&m, &scratch));
        m = keep(m);
        const size_t sp = m.find(' ');
        if (sp == std::string_view::npos) {
          return c.error(strfmt("merge %zu has no space between its parts", merges.size()));
        }
        a = m.substr(0, sp);
        b = m.substr(sp + 1);
      }
      merges.push_back({a, b});
      if (c.consume(',')) continue;
      TANDEM_TRY(c.expect(']'));
      break;
    }
  }
  Status s = bpe->add_merges(merges);
  if (!s.ok()) return corrupt(strfmt("%s: %s", source.c_str(), s.message().c_str()));
  return ok_status();
}

template <class T>
Status optional_field(const Sections& s, const std::string& source, const char* key, T* out) {
  auto it = s.model.find(key);
  if (it == s.model.end()) return ok_status();
  TANDEM_ASSIGN_OR_RETURN(json j, parse_section(it->second, source, key));
  if (j.is_null()) return ok_status();
  try {
    *out = j.get<T>();
  } catch (const json::exception&) {
    return corrupt(strfmt("%s: model.%s has the wrong type (%s)", source.c_str(), key, j.type_name()));
  }
  return ok_status();
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::load(const std::string& path) {
  std::string file = path;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    file = (std::filesystem::path(path) / "tokenizer.json").string();
    if (!std::filesystem::exists(file, ec))
      return not_found(strfmt("%s: no tokenizer.json in this directory", path.c_str()));
  }
  TANDEM_ASSIGN_OR_RETURN(std::string text, read_file(file));
  return from_json_text(text, file);
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_json_text(std::string_view text, const std::string& source) {
  Sections sec;
  TANDEM_TRY(scan_sections(text, source, &sec));
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  t->source_ = source;
  auto fail = [&](Status s) { return s.with_context(source); };

  if (auto it = sec.top.find("version"); it != sec.top.end()) {
    TANDEM_ASSIGN_OR_RETURN(json v, parse_section(it->second, source, "version"));
    if (v != "1.0")
      return unsupported(strfmt("%s: unknown tokenizer.json version %s", source.c_str(), v.dump().c_str()));
  }
  if (!sec.have_model) return corrupt(strfmt("%s: missing \"model\"", source.c_str()));
  std::string type;
  TANDEM_TRY(optional_field(sec, source, "type", &type));
  if (type.empty()) return corrupt(strfmt("%s: model has no \"type\"", source.c_str()));
  if (type != "BPE")
    return unsupported(strfmt("%s: model type \"%s\" is not supported (only BPE)", source.c_str(), type.c_str()));

  BpeOptions opts;
  std::string unk;
  double dropout = 0;
  TANDEM_TRY(optional_field(sec, source, "dropout", &dropout));
  if (dropout > 0) return unsupported(strfmt("%s: BPE dropout is not supported", source.c_str()));
  TANDEM_TRY(optional_field(sec, source, "unk_token", &unk));
  if (!unk.empty()) opts.unk_token = unk;
  TANDEM_TRY(optional_field(sec, source, "continuing_subword_prefix", &opts.continuing_subword_prefix));
  TANDEM_TRY(optional_field(sec, source, "end_of_word_suffix", &opts.end_of_word_suffix));
  TANDEM_TRY(optional_field(sec, source, "fuse_unk", &opts.fuse_unk));
  TANDEM_TRY(optional_field(sec, source, "byte_fallback", &opts.byte_fallback));
  TANDEM_TRY(optional_field(sec, source, "ignore_merges", &opts.ignore_merges));
  t->bpe_.set_options(opts);

  auto vocab = sec.model.find("vocab");
  if (vocab == sec.model.end()) return corrupt(strfmt("%s: model has no \"vocab\"", source.c_str()));
  TANDEM_TRY(parse_vocab(vocab->second, sec.model_field_offset["vocab"], source, &t->bpe_));
  if (auto merges = sec.model.find("merges"); merges != sec.model.end()) {
    TANDEM_TRY(parse_merges(merges->second, sec.model_field_offset["merges"], source, &t->bpe_));
  }
  if (Status s = t->bpe_.finish(); !s.ok()) return fail(std::move(s));

  // Pipeline stages.
  auto section = [&](const char* key) -> Result<json> {
    auto it = sec.top.find(key);
    if (it == sec.top.end()) return json(nullptr);
    return parse_section(it->second, source, key);
  };
  {
    TANDEM_ASSIGN_OR_RETURN(json j, section("normalizer"));
    Result<Normalizer> n = Normalizer::from_json(j);
    if (!n.ok()) return fail(n.status());
    t->normalizer_ = std::move(n).value();
  }
  {
    TANDEM_ASSIGN_OR_RETURN(json j, section("pre_tokenizer"));
    Result<PreTokenizer> p = PreTokenizer::from_json(j);
    if (!p.ok()) return fail(p.status());
    t->pre_tokenizer_ = std::move(p).value();
  }
  {
    TANDEM_ASSIGN_OR_RETURN(json j, section("post_processor"));
    Result<PostProcessor> p = PostProcessor::from_json(j);
    if (!p.ok()) return fail(p.status());
    t->post_ = std::move(p).value();
  }
  {
    TANDEM_ASSIGN_OR_RETURN(json j, section("decoder"));
    Result<DecoderConfig> d = DecoderConfig::from_json(j);
    if (!d.ok()) return fail(d.status());
    t->decoder_ = std::move(d).value();
  }
  for (const char* key : {"truncation", "padding"}) {
    TANDEM_ASSIGN_OR_RETURN(json j, section(key));
    if (!j.is_null())
      TANDEM_LOG_DEBUG("%s: ignoring \"%s\" (a batching policy, not part of encoding)", source.c_str(), key);
  }

  // Added tokens, in file order, the way HF's deserializer adds them: a token already in the vocabulary keeps
  // that id, a new one takes the next id after the vocabulary and the added tokens so far.
  TANDEM_ASSIGN_OR_RETURN(json added, section("added_tokens"));
  if (!added.is_null() && !added.is_array())
    return corrupt(strfmt("%s: \"added_tokens\" is not an array", source.c_str()));
  const auto model_size = static_cast<int32_t>(t->bpe_.vocab_size());
  int32_t max_added = -1;
  std::vector<int32_t> order_special, order_plain;
  if (added.is_array()) {
    for (size_t k = 0; k < added.size(); ++k) {
      const json& a = added[k];
      if (!a.is_object() || !a.contains("content") || !a["content"].is_string() || !a.contains("id") ||
          !a["id"].is_number_integer()) {
        return corrupt(
            strfmt("%s: added_tokens[%zu] needs a string \"content\" and an integer \"id\"", source.c_str(), k));
      }
      AddedToken tok;
      tok.content = a["content"].get<std::string>();
      if (tok.content.empty()) continue;  // HF ignores empty added tokens
      auto flag = [&](const char* key, bool dflt) {
        return a.contains(key) && a[key].is_boolean() ? a[key].get<bool>() : dflt;
      };
      tok.special = flag("special", false);
      tok.normalized = flag("normalized", !tok.special);
      tok.lstrip = flag("lstrip", false);
      tok.rstrip = flag("rstrip", false);
      tok.single_word = flag("single_word", false);
      const int64_t file_id = a["id"].get<int64_t>();
      int64_t existing = t->added_by_content_.find(tok.content);
      if (existing >= 0) {
        // Same content again: HF re-registers it under the same id with the new flags.
        tok.id = t->added_[static_cast<size_t>(existing)].id;
        t->added_[static_cast<size_t>(existing)] = tok;
        continue;
      }
      const int32_t in_model = t->bpe_.token_to_id(tok.content);
      if (in_model != BpeModel::kNoId) {
        tok.id = in_model;
      } else if (max_added < 0) {
        tok.id = model_size;
      } else {
        tok.id = max_added >= model_size ? max_added + 1 : model_size;
      }
      if (tok.id != file_id) {
        TANDEM_LOG_WARN("%s: added token \"%s\" has id %lld in the file but %d by HF's rules; using %d", source.c_str(),
                        tok.content.c_str(), (long long)file_id, tok.id, tok.id);
      }
      max_added = std::max(max_added, tok.id);
      const auto index = static_cast<int32_t>(t->added_.size());
      (void)t->added_by_content_.add(tok.content, static_cast<uint32_t>(index));
      (tok.special ? order_special : order_plain).push_back(index);
      t->added_.push_back(std::move(tok));
    }
  }
  // Matchers: special tokens first, then the others (HF's trie order).
  for (const std::vector<int32_t>* order : {&order_special, &order_plain}) {
    for (int32_t index : *order) {
      const AddedToken& tok = t->added_[static_cast<size_t>(index)];
      if (!tok.normalized) {
        t->raw_matcher_.add(tok.content, index);
      } else {
        std::string norm;
        t->normalizer_.apply(tok.content, &norm);
        t->normalized_matcher_.add(norm, index);
      }
    }
  }

  // Id tables over every id any token has.
  int32_t limit = t->bpe_.id_limit();
  for (const AddedToken& tok : t->added_) limit = std::max(limit, tok.id + 1);
  t->added_of_id_.assign(static_cast<size_t>(limit), -1);
  for (size_t k = 0; k < t->added_.size(); ++k)
    t->added_of_id_[static_cast<size_t>(t->added_[k].id)] = static_cast<int32_t>(k);
  StringTable special_contents;
  for (const AddedToken& tok : t->added_) {
    if (tok.special) (void)special_contents.add(tok.content, 0);
  }
  t->special_.assign(static_cast<size_t>(limit), false);
  for (int32_t id = 0; id < limit; ++id) {
    const std::optional<std::string_view> s = t->id_to_token(id);
    t->special_[static_cast<size_t>(id)] = s && special_contents.find(*s) >= 0;
  }
  t->vocab_size_ = model_size;
  for (const AddedToken& tok : t->added_) {
    if (t->bpe_.token_to_id(tok.content) == BpeModel::kNoId) ++t->vocab_size_;
  }
  for (int32_t id : t->post_.prefix()) {
    if (!t->id_to_token(id))
      return corrupt(strfmt("%s: post_processor uses id %d, which has no token", source.c_str(), id));
  }
  for (int32_t id : t->post_.suffix()) {
    if (!t->id_to_token(id))
      return corrupt(strfmt("%s: post_processor uses id %d, which has no token", source.c_str(), id));
  }
  return t;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  const int64_t k = added_by_content_.find(token);
  if (k >= 0) return added_[static_cast<size_t>(added_by_content_.value(static_cast<size_t>(k)))].id;
  const int32_t id = bpe_.token_to_id(token);
  if (id == BpeModel::kNoId) return std::nullopt;
  return id;
}

Result<int32_t> Tokenizer::require_token(std::string_view token) const {
  std::optional<int32_t> id = token_to_id(token);
  if (!id) return not_found(strfmt("%s: no token \"%.*s\"", source_.c_str(), (int)token.size(), token.data()));
  return *id;
}

std::optional<std::string_view> Tokenizer::id_to_token(int32_t id) const {
  if (id >= 0 && static_cast<size_t>(id) < added_of_id_.size() && added_of_id_[static_cast<size_t>(id)] >= 0) {
    return std::string_view(added_[static_cast<size_t>(added_of_id_[static_cast<size_t>(id)])].content);
  }
  return bpe_.id_to_token(id);
}

Status Tokenizer::encode_piece(std::string_view normalized, std::vector<int32_t>* ids) const {
  thread_local std::vector<std::pair<size_t, size_t>> words;
  words.clear();
  pre_tokenizer_.split(normalized, &words);
  for (const auto& [b, e] : words) TANDEM_TRY(bpe_.encode_word(normalized.substr(b, e - b), ids));
  return ok_status();
}

Result<std::vector<int32_t>> Tokenizer::encode(std::string_view text, const EncodeOptions& opts) const {
  TANDEM_TRY(validate_utf8(text, "text to encode"));
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<SplitPiece> pieces, sub;
  if (raw_matcher_.empty()) {
    if (!text.empty()) pieces.push_back(SplitPiece{0, text.size(), -1});
  } else {
    raw_matcher_.split(text, added_, &pieces);
  }
  std::string norm;
  for (const SplitPiece& p : pieces) {
    if (p.token >= 0) {
      ids.push_back(added_[static_cast<size_t>(p.token)].id);
      continue;
    }
    std::string_view piece = text.substr(p.begin, p.end - p.begin);
    if (!normalizer_.empty()) {
      normalizer_.apply(piece, &norm);
      piece = norm;
    }
    if (normalized_matcher_.empty()) {
      TANDEM_TRY(encode_piece(piece, &ids));
      continue;
    }
    sub.clear();
    normalized_matcher_.split(piece, added_, &sub);
    for (const SplitPiece& q : sub) {
      if (q.token >= 0) {
        ids.push_back(added_[static_cast<size_t>(q.token)].id);
      } else {
        TANDEM_TRY(encode_piece(piece.substr(q.begin, q.end - q.begin), &ids));
      }
    }
  }
  if (opts.add_special_tokens) post_.apply_single(&ids);
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  StreamDecoder d(*this, skip_special_tokens);
  std::string out;
  for (int32_t id : ids) d.push(id, &out);
  d.finish(&out);
  return out;
}

}  // namespace tandem::tok
