// config.json (+ generation_config.json) -> ModelConfig with one resolved LayerSpec per layer (spec §1.6-§1.10,
// §2, §3). Defaults are those of transformers' Gemma4TextConfig / Gemma4AssistantConfig; both ways of giving the
// full-attention head dims (release global_head_dim / num_global_key_value_heads, or 5.x per_layer_config) resolve
// to the same LayerSpecs. Every error names the file and the field.
#include "model/gemma4_config.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/log.h"
#include "core/strings.h"
#include "io/json_util.h"
#include "io/mapped_file.h"

namespace tandem {

const char* attn_type_name(AttnType t) { return t == AttnType::kSliding ? "sliding" : "full"; }

const char* layout_name(CheckpointLayout l) {
  switch (l) {
    case CheckpointLayout::kConditionalGeneration: return "Gemma4ForConditionalGeneration";
    case CheckpointLayout::kCausalLM: return "Gemma4ForCausalLM";
    case CheckpointLayout::kAssistant: return "Gemma4AssistantForCausalLM";
  }
  return "?";
}

int RopeSpec::rotated_pairs(int head_dim) const {
  if (kind == RopeKind::kDefault) return head_dim / 2;
  // HF: int(partial_rotary_factor * head_dim // 2), Python float floor division.
  return static_cast<int>(std::floor(partial_rotary_factor * head_dim / 2.0));
}

std::vector<float> RopeSpec::inv_freq(int head_dim) const {
  // f32 arithmetic in HF's order: exponent = float(2j) / head_dim, base ** exponent, 1 / that, then / factor.
  const int half = head_dim / 2;
  const int rotated = std::min(rotated_pairs(head_dim), half);
  const float base = static_cast<float>(theta);
  std::vector<float> out(static_cast<size_t>(half), 0.0f);
  for (int j = 0; j < rotated; ++j) {
    const float e = static_cast<float>(2 * j) / static_cast<float>(head_dim);
    float f = 1.0f / std::pow(base, e);
    if (kind == RopeKind::kProportional) f /= static_cast<float>(factor);
    out[static_cast<size_t>(j)] = f;
  }
  return out;
}

int TextConfig::shared_kv_layer(AttnType t) const {
  for (int i = n_layers - 1; i >= 0; --i) {
    if (layers[static_cast<size_t>(i)].publishes_shared_kv && layers[static_cast<size_t>(i)].attn == t) return i;
  }
  return -1;
}

namespace {

using nlohmann::json;

constexpr const char* kSlidingName = "sliding_attention";
constexpr const char* kFullName = "full_attention";

// Where a field lives, for messages: "<file>: <prefix><key>: <problem>".
struct Ctx {
  const std::string* file;
  std::string prefix;  // "" or "text_config."

  Ctx(const std::string& f, std::string p) : file(&f), prefix(std::move(p)) {}
  [[nodiscard]] const std::string& source() const { return *file; }
  [[nodiscard]] std::string at(const std::string& key) const { return *file + ": " + prefix + key; }
  [[nodiscard]] Ctx sub(const std::string& key) const { return Ctx(*file, prefix + key + "."); }
  // "<file>: <prefix without its trailing dot>": the object this context reads.
  [[nodiscard]] std::string here() const {
    return *file + ": " + (prefix.empty() ? std::string("(root)") : prefix.substr(0, prefix.size() - 1));
  }
};

// The value of `key`, or nullptr when it is absent or null (HF treats both as "use the default").
const json* field(const json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

Status wrong_type(const Ctx& c, const char* key, const char* want, const json& v) {
  return corrupt(strfmt("%s: must be %s, got a %s", c.at(key).c_str(), want, json_kind(v)));
}

// Sizes above these are rejected as implausible, which also keeps every derived size (2 * d_ff, heads x
// head_dim, layers x ple_dim) far from integer overflow and every table sized by them small.
constexpr int kMaxSize = 1 << 24;
constexpr int kMaxLayers = 4096;

// Integer field with a default (nullopt = required) and bounds.
Status get_int(const Ctx& c, const json& obj, const char* key, std::optional<int> def, int min_value, int* out,
               int max_value = kMaxSize) {
  const json* v = field(obj, key);
  if (v == nullptr) {
    if (!def) return corrupt(strfmt("%s: missing required field", c.at(key).c_str()));
    *out = *def;
    return ok_status();
  }
  if (!v->is_number_integer()) return wrong_type(c, key, "an integer", *v);
  const bool neg = !v->is_number_unsigned();
  const int64_t x = neg ? v->get<int64_t>() : static_cast<int64_t>(std::min<uint64_t>(v->get<uint64_t>(), 1ull << 40));
  if (x > max_value) {
    return invalid_argument(
        strfmt("%s: %lld is too large (limit %d)", c.at(key).c_str(), static_cast<long long>(x), max_value));
  }
  if (x < min_value) {
    return invalid_argument(strfmt("%s: must be %s, got %lld", c.at(key).c_str(),
                                   min_value == 1 ? "a positive integer" : strfmt("at least %d", min_value).c_str(),
                                   static_cast<long long>(x)));
  }
  *out = static_cast<int>(x);
  return ok_status();
}

Status get_optional_int(const Ctx& c, const json& obj, const char* key, int min_value, std::optional<int>* out) {
  if (field(obj, key) == nullptr) {
    *out = std::nullopt;
    return ok_status();
  }
  int v = 0;
  TANDEM_TRY(get_int(c, obj, key, 0, min_value, &v));
  *out = v;
  return ok_status();
}

Status get_double(const Ctx& c, const json& obj, const char* key, double def, double* out) {
  const json* v = field(obj, key);
  if (v == nullptr) {
    *out = def;
    return ok_status();
  }
  if (!v->is_number()) return wrong_type(c, key, "a number", *v);
  *out = v->get<double>();
  if (!std::isfinite(*out)) return invalid_argument(strfmt("%s: must be finite", c.at(key).c_str()));
  return ok_status();
}

Status get_bool(const Ctx& c, const json& obj, const char* key, bool def, bool* out) {
  const json* v = field(obj, key);
  if (v == nullptr) {
    *out = def;
    return ok_status();
  }
  if (!v->is_boolean()) return wrong_type(c, key, "true or false", *v);
  *out = v->get<bool>();
  return ok_status();
}

Status get_string(const Ctx& c, const json& obj, const char* key, const std::string& def, std::string* out) {
  const json* v = field(obj, key);
  if (v == nullptr) {
    *out = def;
    return ok_status();
  }
  if (!v->is_string()) return wrong_type(c, key, "a string", *v);
  *out = v->get<std::string>();
  return ok_status();
}

// Appends the ids of an int-or-list-of-ints field (eos_token_id).
Status get_id_list(const Ctx& c, const json& obj, const char* key, std::vector<int>* out) {
  const json* v = field(obj, key);
  if (v == nullptr) return ok_status();
  auto add = [&](const json& x) -> Status {
    if (!x.is_number_integer() || !x.is_number_unsigned() || x.get<uint64_t>() > std::numeric_limits<int>::max()) {
      return invalid_argument(strfmt("%s: token ids must be non-negative integers", c.at(key).c_str()));
    }
    out->push_back(static_cast<int>(x.get<uint64_t>()));
    return ok_status();
  };
  if (v->is_array()) {
    for (const json& x : *v) TANDEM_TRY(add(x));
    return ok_status();
  }
  return add(*v);
}

// A single token id (bos/pad): set only when present.
Status get_id(const Ctx& c, const json& obj, const char* key, std::optional<int>* out) {
  if (field(obj, key) == nullptr) return ok_status();
  int v = 0;
  TANDEM_TRY(get_int(c, obj, key, 0, 0, &v));
  *out = v;
  return ok_status();
}

Result<AttnType> attn_type_from(const Ctx& c, const std::string& what, const std::string& s) {
  if (s == kSlidingName) return AttnType::kSliding;
  if (s == kFullName) return AttnType::kFull;
  return unsupported(strfmt("%s: layer type \"%s\" is not supported (sliding_attention, full_attention)",
                            c.at(what).c_str(), s.c_str()));
}

Status parse_layer_types(const Ctx& c, const json& t, int n_layers, std::vector<AttnType>* out) {
  out->clear();
  const json* v = field(t, "layer_types");
  if (v == nullptr) {
    // HF default: period 6, five sliding then one full.
    for (int i = 0; i < n_layers; ++i) out->push_back((i + 1) % 6 ? AttnType::kSliding : AttnType::kFull);
  } else {
    if (!v->is_array()) return wrong_type(c, "layer_types", "an array of strings", *v);
    if (static_cast<int>(v->size()) != n_layers) {
      return invalid_argument(
          strfmt("%s: has %zu entries but num_hidden_layers is %d", c.at("layer_types").c_str(), v->size(), n_layers));
    }
    for (size_t i = 0; i < v->size(); ++i) {
      const json& e = (*v)[i];
      const std::string what = strfmt("layer_types[%zu]", i);
      if (!e.is_string()) return wrong_type(c, what.c_str(), "a string", e);
      TANDEM_ASSIGN_OR_RETURN(AttnType a, attn_type_from(c, what, e.get<std::string>()));
      out->push_back(a);
    }
  }
  if (out->back() != AttnType::kFull) {  // HF forces the last layer to full attention (with a warning)
    TANDEM_LOG_WARN("%s: last layer must use full_attention; forcing it, as transformers does",
                    c.at("layer_types").c_str());
    out->back() = AttnType::kFull;
  }
  return ok_status();
}

Status parse_rope_entry(const Ctx& c, const json& e, RopeSpec* r) {
  if (!e.is_object()) return corrupt(strfmt("%s: must be an object, got a %s", c.here().c_str(), json_kind(e)));
  std::string type;
  TANDEM_TRY(get_string(c, e, "rope_type", "default", &type));
  if (type == "default") {
    r->kind = RopeKind::kDefault;
  } else if (type == "proportional") {
    r->kind = RopeKind::kProportional;
  } else {
    return unsupported(
        strfmt("%s: \"%s\" is not supported (default, proportional)", c.at("rope_type").c_str(), type.c_str()));
  }
  TANDEM_TRY(get_double(c, e, "rope_theta", 10000.0, &r->theta));
  if (r->theta <= 0) return invalid_argument(strfmt("%s: must be positive", c.at("rope_theta").c_str()));
  if (r->kind == RopeKind::kDefault) {
    // HF's default RoPE ignores partial_rotary_factor and factor; keep the spec honest about what happens.
    r->partial_rotary_factor = 1.0;
    r->factor = 1.0;
    return ok_status();
  }
  TANDEM_TRY(get_double(c, e, "partial_rotary_factor", 1.0, &r->partial_rotary_factor));
  if (r->partial_rotary_factor < 0 || r->partial_rotary_factor > 1) {
    return invalid_argument(strfmt("%s: must be in [0, 1]", c.at("partial_rotary_factor").c_str()));
  }
  TANDEM_TRY(get_double(c, e, "factor", 1.0, &r->factor));
  if (r->factor <= 0) return invalid_argument(strfmt("%s: must be positive", c.at("factor").c_str()));
  return ok_status();
}

Status parse_rope(const Ctx& c, const json& t, const std::vector<AttnType>& types, TextConfig* tc) {
  tc->rope_sliding = RopeSpec{RopeKind::kDefault, 10000.0, 1.0};
  tc->rope_full = RopeSpec{RopeKind::kProportional, 1000000.0, 0.25};
  const json* rp = field(t, "rope_parameters");
  if (rp == nullptr) return ok_status();
  if (!rp->is_object()) return wrong_type(c, "rope_parameters", "an object keyed by layer type", *rp);
  for (AttnType a : {AttnType::kSliding, AttnType::kFull}) {
    const char* name = a == AttnType::kSliding ? kSlidingName : kFullName;
    const json* e = field(*rp, name);
    const bool used = std::find(types.begin(), types.end(), a) != types.end();
    if (e == nullptr) {
      if (used) return corrupt(strfmt("%s: no entry for %s", c.at("rope_parameters").c_str(), name));
      continue;
    }
    RopeSpec* r = a == AttnType::kSliding ? &tc->rope_sliding : &tc->rope_full;
    *r = RopeSpec{};
    TANDEM_TRY(parse_rope_entry(c.sub("rope_parameters").sub(name), *e, r));
  }
  return ok_status();
}

struct HeadOverride {
  std::optional<int> head_dim, n_kv_heads;
};

// Head dim and KV-head count of every layer, from either config format (HF Gemma4TextConfig.__post_init__).
Status resolve_head_dims(const Ctx& c, const json& t, const std::vector<AttnType>& types, int head_dim, int n_kv,
                         bool k_eq_v, std::vector<int>* hd, std::vector<int>* kv) {
  const int n = static_cast<int>(types.size());
  std::vector<HeadOverride> by_layer(static_cast<size_t>(n));
  const json* plc = field(t, "per_layer_config");
  if (plc != nullptr) {
    // transformers 5.x: {"<layer index>": {"head_dim": .., "num_key_value_heads": ..}}; layer-type keys apply to
    // every layer of that type without an index entry. global_head_dim is not consulted (HF pops it).
    if (!plc->is_object()) return wrong_type(c, "per_layer_config", "an object", *plc);
    HeadOverride by_type[2];
    for (auto it = plc->begin(); it != plc->end(); ++it) {
      const std::string& key = it.key();
      const Ctx lc = c.sub("per_layer_config").sub(key);
      if (it->is_null()) continue;
      if (!it->is_object()) {
        return corrupt(strfmt("%s: must be an object, got a %s", lc.here().c_str(), json_kind(*it)));
      }
      HeadOverride o;
      TANDEM_TRY(get_optional_int(lc, *it, "head_dim", 1, &o.head_dim));
      TANDEM_TRY(get_optional_int(lc, *it, "num_key_value_heads", 1, &o.n_kv_heads));
      const bool numeric = !key.empty() && key.size() < 10 &&
                           std::all_of(key.begin(), key.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
      if (numeric) {
        const int idx = std::stoi(key);
        if (idx >= n) {
          return invalid_argument(
              strfmt("%s: layer index %d is past num_hidden_layers %d", c.at("per_layer_config").c_str(), idx, n));
        }
        by_layer[static_cast<size_t>(idx)] = o;
      } else if (key == kSlidingName) {
        by_type[0] = o;
      } else if (key == kFullName) {
        by_type[1] = o;
      } else {
        TANDEM_LOG_WARN("%s: ignoring per_layer_config entry \"%s\" (neither a layer index nor a layer type)",
                        c.source().c_str(), key.c_str());
      }
    }
    for (int i = 0; i < n; ++i) {
      HeadOverride& o = by_layer[static_cast<size_t>(i)];
      const HeadOverride& tdef = by_type[types[static_cast<size_t>(i)] == AttnType::kFull ? 1 : 0];
      if (!o.head_dim) o.head_dim = tdef.head_dim;
      if (!o.n_kv_heads) o.n_kv_heads = tdef.n_kv_heads;
    }
  } else {
    int global_head_dim = 0;
    std::optional<int> global_kv;
    TANDEM_TRY(get_int(c, t, "global_head_dim", 512, 1, &global_head_dim));
    TANDEM_TRY(get_optional_int(c, t, "num_global_key_value_heads", 1, &global_kv));
    for (int i = 0; i < n; ++i) {
      if (types[static_cast<size_t>(i)] != AttnType::kFull) continue;
      by_layer[static_cast<size_t>(i)].head_dim = global_head_dim;
      // The global KV-head count applies only when attention_k_eq_v is set (HF __post_init__).
      if (k_eq_v) by_layer[static_cast<size_t>(i)].n_kv_heads = global_kv;
    }
  }
  hd->assign(static_cast<size_t>(n), head_dim);
  kv->assign(static_cast<size_t>(n), n_kv);
  for (int i = 0; i < n; ++i) {
    const HeadOverride& o = by_layer[static_cast<size_t>(i)];
    if (o.head_dim) (*hd)[static_cast<size_t>(i)] = *o.head_dim;
    if (o.n_kv_heads) (*kv)[static_cast<size_t>(i)] = *o.n_kv_heads;
  }
  return ok_status();
}

// Parses the text-decoder fields of `t` (the root for gemma4_text, text_config otherwise) and resolves layers.
Status parse_text(const Ctx& c, const json& t, bool assistant, TextConfig* tc) {
  TANDEM_TRY(get_int(c, t, "vocab_size", std::nullopt, 1, &tc->n_vocab));
  TANDEM_TRY(get_int(c, t, "hidden_size", std::nullopt, 1, &tc->d_model));
  TANDEM_TRY(get_int(c, t, "intermediate_size", std::nullopt, 1, &tc->d_ff));
  TANDEM_TRY(get_int(c, t, "num_hidden_layers", std::nullopt, 1, &tc->n_layers, kMaxLayers));
  TANDEM_TRY(get_int(c, t, "num_attention_heads", std::nullopt, 1, &tc->n_heads));
  int head_dim = 0, n_kv = 0;
  TANDEM_TRY(get_int(c, t, "num_key_value_heads", 4, 1, &n_kv));
  TANDEM_TRY(get_int(c, t, "head_dim", 256, 1, &head_dim));
  TANDEM_TRY(get_int(c, t, "max_position_embeddings", 131072, 1, &tc->max_position, std::numeric_limits<int>::max()));
  double eps = 0;
  TANDEM_TRY(get_double(c, t, "rms_norm_eps", 1e-6, &eps));
  if (eps <= 0) return invalid_argument(strfmt("%s: must be positive", c.at("rms_norm_eps").c_str()));
  tc->rms_eps = static_cast<float>(eps);

  std::string act;
  TANDEM_TRY(get_string(c, t, "hidden_activation", "gelu_pytorch_tanh", &act));
  if (act != "gelu_pytorch_tanh") {
    return unsupported(
        strfmt("%s: \"%s\" is not supported (gelu_pytorch_tanh)", c.at("hidden_activation").c_str(), act.c_str()));
  }
  bool bias = false;
  TANDEM_TRY(get_bool(c, t, "attention_bias", false, &bias));
  if (bias) return unsupported(strfmt("%s: attention biases are not supported", c.at("attention_bias").c_str()));
  std::string bidir;
  TANDEM_TRY(get_string(c, t, "use_bidirectional_attention", "", &bidir));
  if (bidir == "all") {
    return unsupported(strfmt("%s: \"all\" (fully bidirectional text attention) is not supported",
                              c.at("use_bidirectional_attention").c_str()));
  }
  if (!bidir.empty() && bidir != "vision") {
    return invalid_argument(strfmt("%s: \"%s\" is not one of null, \"vision\", \"all\"",
                                   c.at("use_bidirectional_attention").c_str(), bidir.c_str()));
  }
  if (const json* cap = field(t, "final_logit_softcapping")) {
    if (!cap->is_number()) return wrong_type(c, "final_logit_softcapping", "a number or null", *cap);
    if (!(cap->get<double>() > 0)) {
      return invalid_argument(strfmt("%s: must be positive or null", c.at("final_logit_softcapping").c_str()));
    }
    tc->final_logit_softcap = static_cast<float>(cap->get<double>());
  }

  TANDEM_TRY(get_int(c, t, "vocab_size_per_layer_input", 262144, 0, &tc->ple_vocab));
  TANDEM_TRY(get_int(c, t, "hidden_size_per_layer_input", 256, 0, &tc->ple_dim));
  if (!assistant && tc->ple_dim > 0 && tc->ple_vocab == 0) {
    return invalid_argument(strfmt("%s: must be positive when hidden_size_per_layer_input is set",
                                   c.at("vocab_size_per_layer_input").c_str()));
  }
  TANDEM_TRY(get_bool(c, t, "attention_k_eq_v", false, &tc->attention_k_eq_v));
  TANDEM_TRY(get_int(c, t, "num_kv_shared_layers", 0, 0, &tc->n_kv_shared_layers));
  TANDEM_TRY(get_bool(c, t, "enable_moe_block", false, &tc->moe));
  TANDEM_TRY(get_bool(c, t, "use_double_wide_mlp", false, &tc->double_wide_mlp));
  TANDEM_TRY(get_bool(c, t, "tie_word_embeddings", true, &tc->tie_word_embeddings));
  if (tc->moe) {
    TANDEM_TRY(get_int(c, t, "num_experts", std::nullopt, 1, &tc->n_experts));
    TANDEM_TRY(get_int(c, t, "top_k_experts", std::nullopt, 1, &tc->top_k_experts));
    TANDEM_TRY(get_int(c, t, "moe_intermediate_size", std::nullopt, 1, &tc->moe_d_ff));
    if (tc->top_k_experts > tc->n_experts) {
      return invalid_argument(strfmt("%s: %d is more than num_experts %d", c.at("top_k_experts").c_str(),
                                     tc->top_k_experts, tc->n_experts));
    }
  }

  std::vector<AttnType> types;
  TANDEM_TRY(parse_layer_types(c, t, tc->n_layers, &types));
  TANDEM_TRY(get_int(c, t, "sliding_window", 512, 1, &tc->sliding_window));
  TANDEM_TRY(parse_rope(c, t, types, tc));

  if (assistant) {
    // Gemma4AssistantConfig: every layer reads the target's K/V; 0 means "all layers", anything else must say so.
    if (tc->n_kv_shared_layers == 0) tc->n_kv_shared_layers = tc->n_layers;
    if (tc->n_kv_shared_layers != tc->n_layers) {
      return invalid_argument(strfmt("%s: an assistant shares K/V in all %d layers, got %d",
                                     c.at("num_kv_shared_layers").c_str(), tc->n_layers, tc->n_kv_shared_layers));
    }
    if (tc->ple_dim != 0) {
      return invalid_argument(strfmt("%s: must be 0 for an assistant", c.at("hidden_size_per_layer_input").c_str()));
    }
    if (tc->ple_vocab != 0) {
      return invalid_argument(strfmt("%s: must be 0 for an assistant", c.at("vocab_size_per_layer_input").c_str()));
    }
    if (tc->moe) {
      return invalid_argument(strfmt("%s: must be false for an assistant", c.at("enable_moe_block").c_str()));
    }
    if (tc->double_wide_mlp) {
      return invalid_argument(strfmt("%s: must be false for an assistant", c.at("use_double_wide_mlp").c_str()));
    }
    tc->final_logit_softcap.reset();  // the drafter never soft-caps its logits (spec §4.2, §2.2)
  } else if (tc->n_kv_shared_layers > tc->n_layers) {
    return invalid_argument(strfmt("%s: %d is more than num_hidden_layers %d", c.at("num_kv_shared_layers").c_str(),
                                   tc->n_kv_shared_layers, tc->n_layers));
  }

  std::vector<int> hd, kv;
  TANDEM_TRY(resolve_head_dims(c, t, types, head_dim, n_kv, tc->attention_k_eq_v, &hd, &kv));
  // One head dim / KV-head count per attention type (RoPE tables and caches are per type).
  tc->head_dim = head_dim;
  tc->n_kv_heads = n_kv;
  tc->global_head_dim = 0;
  tc->n_global_kv_heads = 0;
  for (AttnType a : {AttnType::kSliding, AttnType::kFull}) {
    int* type_hd = a == AttnType::kSliding ? &tc->head_dim : &tc->global_head_dim;
    int* type_kv = a == AttnType::kSliding ? &tc->n_kv_heads : &tc->n_global_kv_heads;
    bool first = true;
    for (int i = 0; i < tc->n_layers; ++i) {
      if (types[static_cast<size_t>(i)] != a) continue;
      const int h = hd[static_cast<size_t>(i)], k = kv[static_cast<size_t>(i)];
      if (first) {
        *type_hd = h;
        *type_kv = k;
        first = false;
      } else if (h != *type_hd || k != *type_kv) {
        return unsupported(
            strfmt("%s: %s layers with different head dims or KV-head counts (layer %d: %d x %d, "
                   "earlier: %d x %d) are not supported",
                   c.at("per_layer_config").c_str(), attn_type_name(a), i, k, h, *type_kv, *type_hd));
      }
      if (h % 2 != 0) {
        return invalid_argument(strfmt("%s: head dim %d of layer %d is odd", c.at("head_dim").c_str(), h, i));
      }
      if (tc->n_heads % k != 0) {
        return invalid_argument(strfmt("%s: num_attention_heads %d is not a multiple of the %d KV heads of layer %d",
                                       c.at("num_attention_heads").c_str(), tc->n_heads, k, i));
      }
    }
  }

  const int first_shared = tc->n_layers - tc->n_kv_shared_layers;
  tc->layers.assign(static_cast<size_t>(tc->n_layers), LayerSpec{});
  for (int i = 0; i < tc->n_layers; ++i) {
    LayerSpec& l = tc->layers[static_cast<size_t>(i)];
    l.index = i;
    l.attn = types[static_cast<size_t>(i)];
    l.head_dim = hd[static_cast<size_t>(i)];
    l.n_kv_heads = kv[static_cast<size_t>(i)];
    l.window = l.attn == AttnType::kSliding ? tc->sliding_window : 0;
    l.k_eq_v = tc->attention_k_eq_v && l.attn == AttnType::kFull;
    l.owns_kv = i < first_shared;
    l.kv_source = -1;
    if (l.owns_kv) {
      l.kv_source = i;
    } else {
      for (int j = first_shared - 1; j >= 0; --j) {
        if (types[static_cast<size_t>(j)] == l.attn) {
          l.kv_source = j;
          break;
        }
      }
      if (l.kv_source < 0 && !assistant) {
        return invalid_argument(strfmt("%s: layer %d (%s) shares K/V but no earlier layer of its type owns any",
                                       c.at("num_kv_shared_layers").c_str(), i, attn_type_name(l.attn)));
      }
    }
    l.publishes_shared_kv = l.owns_kv;
    for (int j = i + 1; j < first_shared && l.publishes_shared_kv; ++j) {
      if (types[static_cast<size_t>(j)] == l.attn) l.publishes_shared_kv = false;
    }
    l.d_ff = tc->d_ff * ((tc->double_wide_mlp && i >= first_shared && first_shared > 0) ? 2 : 1);
    l.moe = tc->moe;
  }
  return ok_status();
}

struct SpecialIds {
  std::optional<int> pad, bos;
  std::vector<int> eos;
};

// `text_defaults`: obj is a Gemma4TextConfig, whose class default eos_token_id is 1 when the key is absent
// (an explicit null means none). pad/bos class defaults (0, 2) are applied by finish_ids.
Status read_special_ids(const Ctx& c, const json& obj, bool text_defaults, SpecialIds* ids) {
  std::optional<int> pad, bos;
  TANDEM_TRY(get_id(c, obj, "pad_token_id", &pad));
  TANDEM_TRY(get_id(c, obj, "bos_token_id", &bos));
  if (!ids->pad) ids->pad = pad;
  if (!ids->bos) ids->bos = bos;
  if (text_defaults && !obj.contains("eos_token_id")) ids->eos.push_back(1);
  return get_id_list(c, obj, "eos_token_id", &ids->eos);
}

Status finish_ids(const std::string& source, const SpecialIds& ids, ModelConfig* cfg) {
  cfg->pad_id = ids.pad.value_or(0);
  cfg->bos_id = ids.bos.value_or(2);
  cfg->eos_ids.clear();
  for (int id : ids.eos) {
    if (std::find(cfg->eos_ids.begin(), cfg->eos_ids.end(), id) == cfg->eos_ids.end()) cfg->eos_ids.push_back(id);
  }
  const int v = cfg->text.n_vocab;
  auto bad = [&](const char* what, int id) {
    return invalid_argument(strfmt("%s: %s %d is outside the vocabulary of %d tokens", source.c_str(), what, id, v));
  };
  if (cfg->pad_id >= v) return bad("pad_token_id", cfg->pad_id);
  if (cfg->bos_id >= v) return bad("bos_token_id", cfg->bos_id);
  for (int id : cfg->eos_ids) {
    if (id >= v) return bad("eos_token_id", id);
  }
  return ok_status();
}

Result<ModelConfig> parse_config_impl(std::string_view text, const std::string& source, SpecialIds* ids) {
  TANDEM_ASSIGN_OR_RETURN(json root, parse_json_strict(text, source));
  if (!root.is_object()) {
    return corrupt(strfmt("%s: is a JSON %s, expected an object", source.c_str(), json_kind(root)));
  }
  const Ctx top(source, "");
  ModelConfig cfg;
  const json* mt = field(root, "model_type");
  if (mt == nullptr) return corrupt(strfmt("%s: missing required field", top.at("model_type").c_str()));
  if (!mt->is_string()) return wrong_type(top, "model_type", "a string", *mt);
  cfg.model_type = mt->get<std::string>();

  const json* text_json = &root;
  Ctx tctx = top;
  if (cfg.model_type == "gemma4_text") {
    cfg.layout = CheckpointLayout::kCausalLM;
    cfg.weight_prefix = "model.";
  } else if (cfg.model_type == "gemma4" || cfg.model_type == "gemma4_assistant") {
    const bool assistant = cfg.model_type == "gemma4_assistant";
    cfg.layout = assistant ? CheckpointLayout::kAssistant : CheckpointLayout::kConditionalGeneration;
    cfg.weight_prefix = assistant ? "model." : "model.language_model.";
    text_json = field(root, "text_config");
    if (text_json == nullptr) return corrupt(strfmt("%s: missing required field", top.at("text_config").c_str()));
    if (!text_json->is_object()) return wrong_type(top, "text_config", "an object", *text_json);
    tctx = top.sub("text_config");
    std::string sub_type;
    TANDEM_TRY(get_string(tctx, *text_json, "model_type", "gemma4_text", &sub_type));
    if (sub_type != "gemma4_text") {
      return unsupported(
          strfmt("%s: \"%s\" is not supported (gemma4_text)", tctx.at("model_type").c_str(), sub_type.c_str()));
    }
  } else {
    return unsupported(strfmt("%s: \"%s\" is not a Gemma 4 text model (gemma4, gemma4_text, gemma4_assistant)",
                              top.at("model_type").c_str(), cfg.model_type.c_str()));
  }

  TANDEM_TRY(parse_text(tctx, *text_json, cfg.layout == CheckpointLayout::kAssistant, &cfg.text));
  if (text_json != &root) {
    // The wrapper's own tie_word_embeddings (Gemma4Config / Gemma4AssistantConfig) decides when present.
    TANDEM_TRY(get_bool(top, root, "tie_word_embeddings", cfg.text.tie_word_embeddings, &cfg.text.tie_word_embeddings));
  }

  if (cfg.layout == CheckpointLayout::kAssistant) {
    AssistantConfig a;
    TANDEM_TRY(get_int(top, root, "backbone_hidden_size", 1536, 1, &a.backbone_d_model));
    TANDEM_TRY(get_bool(top, root, "use_ordered_embeddings", false, &a.use_ordered_embeddings));
    TANDEM_TRY(get_int(top, root, "num_centroids", 2048, 1, &a.n_centroids));
    TANDEM_TRY(get_int(top, root, "centroid_intermediate_top_k", 32, 1, &a.centroid_top_k));
    if (a.use_ordered_embeddings) {
      if (a.centroid_top_k > a.n_centroids) {
        return invalid_argument(strfmt("%s: %d is more than num_centroids %d",
                                       top.at("centroid_intermediate_top_k").c_str(), a.centroid_top_k, a.n_centroids));
      }
      if (cfg.text.n_vocab % a.n_centroids != 0) {
        return invalid_argument(strfmt("%s: vocab_size %d is not a multiple of num_centroids %d",
                                       top.at("num_centroids").c_str(), cfg.text.n_vocab, a.n_centroids));
      }
    }
    cfg.assistant = a;
  } else if (!cfg.text.tie_word_embeddings) {
    return unsupported(strfmt("%s: false is not supported for Gemma 4 targets (the LM head is the embedding)",
                              top.at("tie_word_embeddings").c_str()));
  }

  TANDEM_TRY(read_special_ids(top, root, text_json == &root, ids));
  if (text_json != &root) TANDEM_TRY(read_special_ids(tctx, *text_json, true, ids));
  return cfg;
}

}  // namespace

Result<ModelConfig> parse_model_config(std::string_view config_json, const std::string& source) {
  SpecialIds ids;
  TANDEM_ASSIGN_OR_RETURN(ModelConfig cfg, parse_config_impl(config_json, source, &ids));
  TANDEM_TRY(finish_ids(source, ids, &cfg));
  return cfg;
}

Result<ModelConfig> load_model_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  TANDEM_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  SpecialIds ids;
  TANDEM_ASSIGN_OR_RETURN(ModelConfig cfg, parse_config_impl(text, path, &ids));
  TANDEM_TRY(finish_ids(path, ids, &cfg));
  const std::string gen_path = dir + "/generation_config.json";
  if (is_regular_file(gen_path)) {
    TANDEM_ASSIGN_OR_RETURN(std::string gen_text, read_text_file(gen_path));
    TANDEM_ASSIGN_OR_RETURN(json gen, parse_json_strict(gen_text, gen_path));
    if (!gen.is_object()) {
      return corrupt(strfmt("%s: is a JSON %s, expected an object", gen_path.c_str(), json_kind(gen)));
    }
    TANDEM_TRY(read_special_ids(Ctx(gen_path, ""), gen, false, &ids));
    TANDEM_TRY(finish_ids(gen_path, ids, &cfg));  // config.json's ids passed above: a failure here is this file's
  }
  return cfg;
}

Status check_assistant_compatible(const ModelConfig& target, const ModelConfig& assistant) {
  if (target.is_assistant()) return invalid_argument("the target checkpoint is itself an assistant");
  if (!assistant.is_assistant()) return invalid_argument("the assistant checkpoint is not a gemma4_assistant model");
  const TextConfig& t = target.text;
  const TextConfig& a = assistant.text;
  std::vector<std::string> problems;
  if (assistant.assistant->backbone_d_model != t.d_model) {
    problems.push_back(
        strfmt("backbone_hidden_size %d != target hidden_size %d", assistant.assistant->backbone_d_model, t.d_model));
  }
  if (a.n_vocab != t.n_vocab) problems.push_back(strfmt("vocab_size %d != target %d", a.n_vocab, t.n_vocab));
  for (AttnType type : {AttnType::kSliding, AttnType::kFull}) {
    bool used = false;
    for (const LayerSpec& l : a.layers) used = used || l.attn == type;
    if (!used) continue;
    const int src = t.shared_kv_layer(type);
    if (src < 0) {
      problems.push_back(strfmt("the target has no %s layer whose K/V the assistant could read", attn_type_name(type)));
      continue;
    }
    const LayerSpec& tl = t.layer(src);
    for (const LayerSpec& l : a.layers) {
      if (l.attn != type) continue;
      if (l.head_dim != tl.head_dim || l.n_kv_heads != tl.n_kv_heads) {
        problems.push_back(strfmt("%s layers: assistant %d KV heads x %d != target %d x %d", attn_type_name(type),
                                  l.n_kv_heads, l.head_dim, tl.n_kv_heads, tl.head_dim));
        break;
      }
      if (l.window != tl.window) {  // the drafter's window must be what the target's sliding cache keeps
        problems.push_back(strfmt("sliding_window %d != target %d", l.window, tl.window));
        break;
      }
    }
    const RopeSpec& ra = type == AttnType::kSliding ? a.rope_sliding : a.rope_full;
    const RopeSpec& rt = type == AttnType::kSliding ? t.rope_sliding : t.rope_full;
    if (ra.inv_freq(tl.head_dim) != rt.inv_freq(tl.head_dim)) {
      problems.push_back(strfmt("%s RoPE parameters differ from the target's", attn_type_name(type)));
    }
  }
  if (problems.empty()) return ok_status();
  return invalid_argument(join(problems, "; "));
}

}  // namespace tandem
