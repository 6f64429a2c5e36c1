// Normalizer, pre-tokenizer and post-processor of tokenizer.json (see pipeline.h).
#include "tokenizer/pipeline.h"

#include <nlohmann/json.hpp>

#include "core/strings.h"

namespace tandem::tok {
namespace {

using nlohmann::json;

std::string type_of(const json& j) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) return "";
  return j["type"].get<std::string>();
}

// The literal of a {"String": "..."} pattern; kUnsupported for {"Regex": ...}.
Status literal_pattern(const json& j, const char* where, std::string* out) {
  if (!j.contains("pattern") || !j["pattern"].is_object()) return corrupt(strfmt("%s: missing \"pattern\"", where));
  const json& p = j["pattern"];
  if (p.contains("String") && p["String"].is_string()) {
    *out = p["String"].get<std::string>();
    if (out->empty()) return unsupported(strfmt("%s: empty pattern", where));
    return ok_status();
  }
  if (p.contains("Regex")) return unsupported(strfmt("%s: regex patterns are not supported", where));
  return corrupt(strfmt("%s: bad \"pattern\"", where));
}

Status string_field(const json& j, const char* key, const char* where, std::string* out) {
  if (!j.contains(key) || !j[key].is_string()) return corrupt(strfmt("%s: missing string \"%s\"", where, key));
  *out = j[key].get<std::string>();
  return ok_status();
}

}  // namespace

// ---- Normalizer ----

Result<Normalizer> Normalizer::from_json(const json& j) {
  Normalizer n;
  if (!j.is_null()) TANDEM_TRY(n.add(j));
  return n;
}

Status Normalizer::add(const json& j) {
  const std::string type = type_of(j);
  if (type == "Sequence") {
    if (!j.contains("normalizers") || !j["normalizers"].is_array()) {
      return corrupt("normalizer Sequence: missing \"normalizers\" array");
    }
    for (const json& s : j["normalizers"]) TANDEM_TRY(add(s));
    return ok_status();
  }
  if (type == "Replace") {
    Step s{false, "", ""};
    TANDEM_TRY(literal_pattern(j, "normalizer Replace", &s.pattern));
    TANDEM_TRY(string_field(j, "content", "normalizer Replace", &s.text));
    steps_.push_back(std::move(s));
    return ok_status();
  }
  if (type == "Prepend") {
    Step s{true, "", ""};
    TANDEM_TRY(string_field(j, "prepend", "normalizer Prepend", &s.text));
    steps_.push_back(std::move(s));
    return ok_status();
  }
  if (type.empty()) return corrupt("normalizer without a \"type\"");
  return unsupported(strfmt("normalizer type \"%s\" is not supported", type.c_str()));
}

void Normalizer::apply(std::string_view in, std::string* out) const {
  out->assign(in);
  std::string tmp;
  for (const Step& s : steps_) {
    if (s.prepend) {
      if (!out->empty()) out->insert(0, s.text);
      continue;
    }
    if (out->find(s.pattern) == std::string::npos) continue;
    tmp.clear();
    tmp.reserve(out->size() + out->size() / 2);
    size_t pos = 0;
    while (true) {
      const size_t hit = out->find(s.pattern, pos);
      if (hit == std::string::npos) break;
      tmp.append(*out, pos, hit - pos).append(s.text);
      pos = hit + s.pattern.size();
    }
    tmp.append(*out, pos, std::string::npos);
    out->swap(tmp);
  }
}

// ---- PreTokenizer ----

Result<PreTokenizer> PreTokenizer::from_json(const json& j) {
  PreTokenizer p;
  if (!j.is_null()) TANDEM_TRY(p.add(j));
  return p;
}

Status PreTokenizer::add(const json& j) {
  const std::string type = type_of(j);
  if (type == "Sequence") {
    if (!j.contains("pretokenizers") || !j["pretokenizers"].is_array()) {
      return corrupt("pre_tokenizer Sequence: missing \"pretokenizers\" array");
    }
    for (const json& s : j["pretokenizers"]) TANDEM_TRY(add(s));
    return ok_status();
  }
  if (type == "Split") {
    Step s{"", Behavior::kRemoved, false};
    TANDEM_TRY(literal_pattern(j, "pre_tokenizer Split", &s.pattern));
    std::string b;
    TANDEM_TRY(string_field(j, "behavior", "pre_tokenizer Split", &b));
    if (b == "Removed")
      s.behavior = Behavior::kRemoved;
    else if (b == "Isolated")
      s.behavior = Behavior::kIsolated;
    else if (b == "MergedWithPrevious")
      s.behavior = Behavior::kMergedWithPrevious;
    else if (b == "MergedWithNext")
      s.behavior = Behavior::kMergedWithNext;
    else if (b == "Contiguous")
      s.behavior = Behavior::kContiguous;
    else
      return corrupt(strfmt("pre_tokenizer Split: unknown behavior \"%s\"", b.c_str()));
    if (j.contains("invert")) {
      if (!j["invert"].is_boolean()) return corrupt("pre_tokenizer Split: \"invert\" is not a boolean");
      s.invert = j["invert"].get<bool>();
    }
    steps_.push_back(std::move(s));
    return ok_status();
  }
  if (type.empty()) return corrupt("pre_tokenizer without a \"type\"");
  return unsupported(strfmt("pre_tokenizer type \"%s\" is not supported", type.c_str()));
}

void PreTokenizer::split(std::string_view text, std::vector<std::pair<size_t, size_t>>* words) const {
  using Range = std::pair<size_t, size_t>;
  std::vector<Range> cur{{0, text.size()}}, next;
  struct Part {
    size_t b, e;
    bool match;
  };
  std::vector<Part> parts;
  std::vector<Range> merged;
  for (const Step& st : steps_) {
    next.clear();
    for (const Range& r : cur) {
      // Matches and the gaps between them, in order (HF's Pattern::find_matches).
      parts.clear();
      size_t pos = r.first;
      while (pos < r.second) {
        const size_t hit = text.substr(0, r.second).find(st.pattern, pos);
        if (hit == std::string_view::npos) break;
        if (hit > pos) parts.push_back({pos, hit, false});
        parts.push_back({hit, hit + st.pattern.size(), true});
        pos = hit + st.pattern.size();
      }
      if (pos < r.second || parts.empty()) parts.push_back({pos, r.second, false});
      if (st.invert) {
        for (Part& p : parts) p.match = !p.match;
      }
      merged.clear();
      switch (st.behavior) {
        case Behavior::kRemoved:
          for (const Part& p : parts) {
            if (!p.match) merged.push_back({p.b, p.e});
          }
          break;
        case Behavior::kIsolated:
          for (const Part& p : parts) merged.push_back({p.b, p.e});
          break;
        case Behavior::kMergedWithPrevious: {
          bool prev_match = false;
          for (const Part& p : parts) {
            if (p.match && !prev_match && !merged.empty()) {
              merged.back().second = p.e;
            } else {
              merged.push_back({p.b, p.e});
            }
            prev_match = p.match;
          }
          break;
        }
        case Behavior::kMergedWithNext: {
          bool prev_match = false;
          for (size_t k = parts.size(); k-- > 0;) {
            const Part& p = parts[k];
            if (p.match && !prev_match && !merged.empty()) {
              merged.back().first = p.b;
            } else {
              merged.push_back({p.b, p.e});
            }
            prev_match = p.match;
          }
          std::reverse(merged.begin(), merged.end());
          break;
        }
        case Behavior::kContiguous: {
          bool prev_match = false;
          for (const Part& p : parts) {
            if (p.match == prev_match && !merged.empty()) {
              merged.back().second = p.e;
            } else {
              merged.push_back({p.b, p.e});
            }
            prev_match = p.match;
          }
          break;
        }
      }
      for (const Range& m : merged) {
        if (m.second > m.first) next.push_back(m);
      }
    }
    cur.swap(next);
  }
  for (const Range& r : cur) {
    if (r.second > r.first) words->push_back(r);
  }
}

// ---- PostProcessor ----

Result<PostProcessor> PostProcessor::from_json(const json& j) {
  PostProcessor p;
  if (!j.is_null()) TANDEM_TRY(p.add(j));
  return p;
}

Status PostProcessor::add(const json& j) {
  const std::string type = type_of(j);
  if (type == "Sequence") {
    if (!j.contains("processors") || !j["processors"].is_array()) {
      return corrupt("post_processor Sequence: missing \"processors\" array");
    }
    for (const json& s : j["processors"]) TANDEM_TRY(add(s));
    return ok_status();
  }
  if (type == "ByteLevel") return ok_status();  // only adjusts offsets
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    for (const char* key : {"cls", "sep"}) {
      if (!j.contains(key) || !j[key].is_array() || j[key].size() != 2 || !j[key][1].is_number_integer()) {
        return corrupt(strfmt("post_processor %s: bad \"%s\"", type.c_str(), key));
      }
    }
    prefix_.insert(prefix_.begin(), j["cls"][1].get<int32_t>());
    suffix_.push_back(j["sep"][1].get<int32_t>());
    return ok_status();
  }
  if (type != "TemplateProcessing") {
    if (type.empty()) return corrupt("post_processor without a \"type\"");
    return unsupported(strfmt("post_processor type \"%s\" is not supported", type.c_str()));
  }
  if (!j.contains("single") || !j["single"].is_array()) return corrupt("post_processor: missing \"single\" template");
  const json specials = j.contains("special_tokens") ? j["special_tokens"] : json::object();
  if (!specials.is_object()) return corrupt("post_processor: \"special_tokens\" is not an object");
  std::vector<int32_t> before, after;
  bool seen_sequence = false;
  for (const json& piece : j["single"]) {
    if (piece.contains("Sequence")) {
      const json& s = piece["Sequence"];
      if (!s.contains("id") || s["id"] != "A") return corrupt("post_processor: the single template may only use $A");
      if (seen_sequence) return unsupported("post_processor: the single template repeats $A");
      seen_sequence = true;
      continue;
    }
    if (!piece.contains("SpecialToken") || !piece["SpecialToken"].contains("id") ||
        !piece["SpecialToken"]["id"].is_string()) {
      return corrupt("post_processor: bad piece in the single template");
    }
    const std::string name = piece["SpecialToken"]["id"].get<std::string>();
    if (!specials.contains(name) || !specials[name].contains("ids") || !specials[name]["ids"].is_array()) {
      return corrupt(strfmt("post_processor: special token \"%s\" is missing from \"special_tokens\"", name.c_str()));
    }
    for (const json& id : specials[name]["ids"]) {
      if (!id.is_number_integer()) return corrupt(strfmt("post_processor: bad id of \"%s\"", name.c_str()));
      (seen_sequence ? after : before).push_back(id.get<int32_t>());
    }
  }
  if (!seen_sequence) return corrupt("post_processor: the single template has no $A");
  // Processors of a Sequence wrap each other's output in order.
  prefix_.insert(prefix_.begin(), before.begin(), before.end());
  suffix_.insert(suffix_.end(), after.begin(), after.end());
  return ok_status();
}

void PostProcessor::apply_single(std::vector<int32_t>* ids) const {
  if (!prefix_.empty()) ids->insert(ids->begin(), prefix_.begin(), prefix_.end());
  ids->insert(ids->end(), suffix_.begin(), suffix_.end());
}

}  // namespace tandem::tok
