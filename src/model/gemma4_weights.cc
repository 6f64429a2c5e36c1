// Binding of Gemma 4 target and assistant weights through ONE table of HF tensor names (spec §3.2-§3.4).
// The table gives, per tensor: its name, when it exists (PLE, MoE, KV-owning layers, ...), its expected shape from
// the config, the dtypes allowed and the struct field it fills. Binding, for_each_tensor and the CLI's accounting
// all walk the same table, so a name is written exactly once.
#include "model/gemma4_weights.h"

#include <algorithm>
#include <type_traits>
#include <unordered_set>

#include "core/strings.h"

namespace tandem {
namespace {

using Shape = std::vector<int64_t>;

enum class Scope : uint8_t { kTarget, kAssistant, kLayer };
enum class When : uint8_t { kAlways, kPle, kMoe, kOwnsKv, kHasV, kOrdered, kUntiedHead };
enum class Kind : uint8_t { kFloat, kIndex };  // bf16/f16/f32, or i64/i32

// Shorthands for the table below (c = config, l = layer, t = c.text).
// clang-format off
#define T_ c.text
#define SHAPE(...) [](const ModelConfig& c, const LayerSpec& l) -> Shape { (void)c; (void)l; return {__VA_ARGS__}; }
#define TGT(field) Scope::kTarget, [](TargetWeights& w) -> Tensor& { return w.field; }, nullptr, nullptr
#define AST(field) Scope::kAssistant, nullptr, [](AssistantWeights& w) -> Tensor& { return w.field; }, nullptr
#define LYR(field) Scope::kLayer, nullptr, nullptr, [](LayerWeights& w) -> Tensor& { return w.field; }

struct Row {  // table row in reading order; converted to Entry by make_table()
  const char* name;
  bool prefixed;
  When when;
  Kind kind;
  Shape (*shape)(const ModelConfig&, const LayerSpec&);
  Scope scope;
  Tensor& (*target)(TargetWeights&);
  Tensor& (*assistant)(AssistantWeights&);
  Tensor& (*layer)(LayerWeights&);
};

constexpr bool kP = true;   // name follows weight_prefix
constexpr bool kAbs = false;

const Row kRows[] = {
    // Target, global (spec §3.2).
    {"embed_tokens.weight", kP, When::kAlways, Kind::kFloat, SHAPE(T_.n_vocab, T_.d_model), TGT(embed)},
    {"norm.weight", kP, When::kAlways, Kind::kFloat, SHAPE(T_.d_model), TGT(final_norm)},
    {"embed_tokens_per_layer.weight", kP, When::kPle, Kind::kFloat,
     SHAPE(T_.ple_vocab, int64_t{T_.n_layers} * T_.ple_dim), TGT(ple_embed)},
    {"per_layer_model_projection.weight", kP, When::kPle, Kind::kFloat,
     SHAPE(int64_t{T_.n_layers} * T_.ple_dim, T_.d_model), TGT(ple_model_proj)},
    {"per_layer_projection_norm.weight", kP, When::kPle, Kind::kFloat, SHAPE(T_.ple_dim), TGT(ple_proj_norm)},
    // Assistant, global (spec §3.4).
    {"pre_projection.weight", kAbs, When::kAlways, Kind::kFloat,
     SHAPE(T_.d_model, int64_t{2} * c.assistant->backbone_d_model), AST(pre_projection)},
    {"post_projection.weight", kAbs, When::kAlways, Kind::kFloat, SHAPE(c.assistant->backbone_d_model, T_.d_model),
     AST(post_projection)},
    {"embed_tokens.weight", kP, When::kAlways, Kind::kFloat, SHAPE(T_.n_vocab, T_.d_model), AST(embed)},
    {"norm.weight", kP, When::kAlways, Kind::kFloat, SHAPE(T_.d_model), AST(final_norm)},
    {"lm_head.weight", kAbs, When::kUntiedHead, Kind::kFloat, SHAPE(T_.n_vocab, T_.d_model), AST(lm_head)},
    {"masked_embedding.centroids.weight", kAbs, When::kOrdered, Kind::kFloat,
     SHAPE(c.assistant->n_centroids, T_.d_model), AST(centroids)},
    {"masked_embedding.token_ordering", kAbs, When::kOrdered, Kind::kIndex, SHAPE(T_.n_vocab), AST(token_ordering)},
    // Every decoder layer, target and assistant (spec §3.2; the assistant's layers own no k/v).
    {"input_layernorm.weight", kP, When::kAlways, Kind::kFloat, SHAPE(T_.d_model), LYR(input_norm)},
    {"post_attention_layernorm.weight", kP, When::kAlways, Kind::kFloat, SHAPE(T_.d_model), LYR(post_attn_norm)},
    {"pre_feedforward_layernorm.weight", kP, When::kAlways, Kind::kFloat, SHAPE(T_.d_model), LYR(pre_ffn_norm)},
    {"post_feedforward_layernorm.weight", kP, When::kAlways, Kind::kFloat, SHAPE(T_.d_model), LYR(post_ffn_norm)},
    {"layer_scalar", kP, When::kAlways, Kind::kFloat, SHAPE(1), LYR(layer_scalar)},
    {"self_attn.q_proj.weight", kP, When::kAlways, Kind::kFloat, SHAPE(int64_t{T_.n_heads} * l.head_dim, T_.d_model),
     LYR(attn.q_proj)},
    {"self_attn.q_norm.weight", kP, When::kAlways, Kind::kFloat, SHAPE(l.head_dim), LYR(attn.q_norm)},
    {"self_attn.k_proj.weight", kP, When::kOwnsKv, Kind::kFloat, SHAPE(int64_t{l.n_kv_heads} * l.head_dim, T_.d_model),
     LYR(attn.k_proj)},
    {"self_attn.v_proj.weight", kP, When::kHasV, Kind::kFloat, SHAPE(int64_t{l.n_kv_heads} * l.head_dim, T_.d_model),
     LYR(attn.v_proj)},
    {"self_attn.k_norm.weight", kP, When::kOwnsKv, Kind::kFloat, SHAPE(l.head_dim), LYR(attn.k_norm)},
    {"self_attn.o_proj.weight", kP, When::kAlways, Kind::kFloat, SHAPE(T_.d_model, int64_t{T_.n_heads} * l.head_dim),
     LYR(attn.o_proj)},
    {"mlp.gate_proj.weight", kP, When::kAlways, Kind::kFloat, SHAPE(l.d_ff, T_.d_model), LYR(mlp.gate)},
    {"mlp.up_proj.weight", kP, When::kAlways, Kind::kFloat, SHAPE(l.d_ff, T_.d_model), LYR(mlp.up)},
    {"mlp.down_proj.weight", kP, When::kAlways, Kind::kFloat, SHAPE(T_.d_model, l.d_ff), LYR(mlp.down)},
    {"per_layer_input_gate.weight", kP, When::kPle, Kind::kFloat, SHAPE(T_.ple_dim, T_.d_model), LYR(ple.gate)},
    {"per_layer_projection.weight", kP, When::kPle, Kind::kFloat, SHAPE(T_.d_model, T_.ple_dim), LYR(ple.proj)},
    {"post_per_layer_input_norm.weight", kP, When::kPle, Kind::kFloat, SHAPE(T_.d_model), LYR(ple.post_norm)},
    {"router.proj.weight", kP, When::kMoe, Kind::kFloat, SHAPE(T_.n_experts, T_.d_model), LYR(moe.router_proj)},
    {"router.scale", kP, When::kMoe, Kind::kFloat, SHAPE(T_.d_model), LYR(moe.router_scale)},
    {"router.per_expert_scale", kP, When::kMoe, Kind::kFloat, SHAPE(T_.n_experts), LYR(moe.per_expert_scale)},
    {"experts.gate_up_proj", kP, When::kMoe, Kind::kFloat, SHAPE(T_.n_experts, int64_t{2} * T_.moe_d_ff, T_.d_model),
     LYR(moe.gate_up)},
    {"experts.down_proj", kP, When::kMoe, Kind::kFloat, SHAPE(T_.n_experts, T_.d_model, T_.moe_d_ff), LYR(moe.down)},
    {"pre_feedforward_layernorm_2.weight", kP, When::kMoe, Kind::kFloat, SHAPE(T_.d_model), LYR(moe.pre_ffn_norm_2)},
    {"post_feedforward_layernorm_1.weight", kP, When::kMoe, Kind::kFloat, SHAPE(T_.d_model), LYR(moe.post_ffn_norm_1)},
    {"post_feedforward_layernorm_2.weight", kP, When::kMoe, Kind::kFloat, SHAPE(T_.d_model), LYR(moe.post_ffn_norm_2)},
};

#undef T_
#undef SHAPE
#undef TGT
#undef AST
#undef LYR
// clang-format on

bool applies(When when, const ModelConfig& c, const LayerSpec& l) {
  switch (when) {
    case When::kAlways: return true;
    case When::kPle: return c.text.ple_dim > 0;
    case When::kMoe: return l.moe;
    case When::kOwnsKv: return l.owns_kv;
    case When::kHasV: return l.owns_kv && !l.k_eq_v;
    case When::kOrdered: return c.assistant && c.assistant->use_ordered_embeddings;
    case When::kUntiedHead: return !c.text.tie_word_embeddings;
  }
  return false;
}

Tensor& global_slot(const Row& r, TargetWeights& w) { return r.target(w); }
Tensor& global_slot(const Row& r, AssistantWeights& w) { return r.assistant(w); }

// Calls fn(hf_name, row, expected shape, slot) for every tensor the config expects, globals first, then layers
// in order. `w.layers` must already have n_layers entries.
template <class W, class Fn>
void visit_table(const ModelConfig& c, W& w, Fn&& fn) {
  constexpr Scope kGlobal = std::is_same_v<W, TargetWeights> ? Scope::kTarget : Scope::kAssistant;
  const LayerSpec none{};
  for (const Row& r : kRows) {
    if (r.scope != kGlobal || !applies(r.when, c, none)) continue;
    fn(r.prefixed ? c.weight_prefix + r.name : std::string(r.name), r, r.shape(c, none), global_slot(r, w));
  }
  const size_t n = std::min(w.layers.size(), c.text.layers.size());
  for (size_t i = 0; i < n; ++i) {
    const LayerSpec& l = c.text.layers[i];
    const std::string base = c.weight_prefix + "layers." + std::to_string(i) + ".";
    for (const Row& r : kRows) {
      if (r.scope != Scope::kLayer || !applies(r.when, c, l)) continue;
      fn(base + r.name, r, r.shape(c, l), r.layer(w.layers[i]));
    }
  }
}

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// k/v weights of a KV-shared layer: present in some conversions, unused (HF _keys_to_ignore_on_load_unexpected).
bool is_unused_shared_kv(const ModelConfig& c, const std::string& name) {
  const std::string head = c.weight_prefix + "layers.";
  if (!starts_with(name, head)) return false;
  size_t p = head.size(), q = p;
  while (q < name.size() && q - p < 6 && name[q] >= '0' && name[q] <= '9') ++q;
  if (q == p || q >= name.size() || name[q] != '.') return false;
  const int idx = std::stoi(name.substr(p, q - p));
  if (idx >= c.text.n_layers || c.text.layer(idx).owns_kv) return false;
  const std::string rest = name.substr(q + 1);
  for (const char* k : {"self_attn.k_proj.", "self_attn.v_proj.", "self_attn.k_norm.", "self_attn.v_norm."}) {
    if (starts_with(rest, k)) return true;
  }
  return false;
}

bool is_known_extra(const ModelConfig& c, const std::string& name) {
  if (c.text.tie_word_embeddings && name == "lm_head.weight") return true;
  if (!c.is_assistant() && is_multimodal_tower_tensor(name)) return true;
  return is_unused_shared_kv(c, name);
}

std::string checkpoint_name(const SafetensorsModel& st) {
  if (st.files().empty()) return "(no files)";
  if (st.files().size() == 1) return st.files()[0];
  const std::string& f = st.files()[0];
  const size_t slash = f.find_last_of('/');
  return strfmt("%s (%zu shards)", slash == std::string::npos ? "." : f.substr(0, slash).c_str(), st.files().size());
}

// token_ordering feeds gather indices: it must be a permutation of [0, n_vocab).
std::string check_permutation(const Tensor& t, int64_t n_vocab) {
  std::vector<bool> seen(static_cast<size_t>(n_vocab), false);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const int64_t v = t.dtype == DType::kI64 ? t.ptr<const int64_t>()[i] : t.ptr<const int32_t>()[i];
    if (v < 0 || v >= n_vocab || seen[static_cast<size_t>(v)]) {
      return strfmt("masked_embedding.token_ordering is not a permutation of [0, %lld): value %lld at index %lld",
                    static_cast<long long>(n_vocab), static_cast<long long>(v), static_cast<long long>(i));
    }
    seen[static_cast<size_t>(v)] = true;
  }
  return {};
}

template <class W>
Result<W> bind(const ModelConfig& c, const SafetensorsModel& st) {
  W w;
  w.layers.resize(static_cast<size_t>(c.text.n_layers));
  std::unordered_set<std::string> used;
  std::vector<std::string> problems;
  visit_table(c, w, [&](const std::string& name, const Row& r, const Shape& shape, Tensor& slot) {
    const TensorInfo* ti = st.find(name);
    if (ti == nullptr) {
      problems.push_back(strfmt("missing %s %s", name.c_str(), shape_str(shape).c_str()));
      return;
    }
    used.insert(name);
    if (ti->shape != shape) {
      problems.push_back(
          strfmt("%s has shape %s, expected %s", name.c_str(), ti->shape_str().c_str(), shape_str(shape).c_str()));
      return;
    }
    const bool dtype_ok =
        r.kind == Kind::kFloat ? dtype_is_float(ti->dtype) : (ti->dtype == DType::kI64 || ti->dtype == DType::kI32);
    if (!dtype_ok) {
      problems.push_back(strfmt("%s has dtype %s, expected %s", name.c_str(), dtype_safetensors_name(ti->dtype),
                                r.kind == Kind::kFloat ? "BF16, F16 or F32" : "I64 or I32"));
      return;
    }
    slot = ti->view();
  });
  for (const TensorInfo& t : st.tensors()) {
    if (used.count(t.name) || is_known_extra(c, t.name)) continue;
    problems.push_back(strfmt("unexpected tensor %s %s", t.name.c_str(), t.shape_str().c_str()));
  }
  if constexpr (std::is_same_v<W, AssistantWeights>) {
    if (!w.token_ordering.empty()) {
      std::string p = check_permutation(w.token_ordering, c.text.n_vocab);
      if (!p.empty()) problems.push_back(std::move(p));
    }
  }
  if (problems.empty()) return w;
  constexpr size_t kMaxListed = 200;
  std::string msg =
      strfmt("%s: checkpoint does not match its config (%s, model_type %s): %zu problem%s", checkpoint_name(st).c_str(),
             layout_name(c.layout), c.model_type.c_str(), problems.size(), problems.size() == 1 ? "" : "s");
  for (size_t i = 0; i < problems.size() && i < kMaxListed; ++i) msg += "\n  " + problems[i];
  if (problems.size() > kMaxListed) msg += strfmt("\n  ... and %zu more", problems.size() - kMaxListed);
  return corrupt(std::move(msg));
}

}  // namespace

bool is_multimodal_tower_tensor(std::string_view name) {
  for (const char* p : {"model.vision_tower.", "model.audio_tower.", "model.embed_vision.", "model.embed_audio."}) {
    if (starts_with(name, p)) return true;
  }
  return false;
}

void for_each_tensor(const ModelConfig& cfg, TargetWeights& w, const TensorVisitor& fn) {
  visit_table(cfg, w, [&](const std::string& name, const Row&, const Shape&, Tensor& t) {
    if (!t.empty()) fn(name, t);
  });
}

void for_each_tensor(const ModelConfig& cfg, AssistantWeights& w, const TensorVisitor& fn) {
  visit_table(cfg, w, [&](const std::string& name, const Row&, const Shape&, Tensor& t) {
    if (!t.empty()) fn(name, t);
  });
}

Result<TargetWeights> bind_target_weights(const ModelConfig& cfg, const SafetensorsModel& st) {
  if (cfg.is_assistant()) {
    return invalid_argument(
        strfmt("%s: is an assistant (gemma4_assistant) checkpoint, not a target", checkpoint_name(st).c_str()));
  }
  return bind<TargetWeights>(cfg, st);
}

Result<AssistantWeights> bind_assistant_weights(const ModelConfig& cfg, const SafetensorsModel& st) {
  if (!cfg.is_assistant()) {
    return invalid_argument(
        strfmt("%s: is a %s target checkpoint, not an assistant", checkpoint_name(st).c_str(), cfg.model_type.c_str()));
  }
  return bind<AssistantWeights>(cfg, st);
}

std::vector<ExpectedTensor> expected_tensors(const ModelConfig& cfg) {
  std::vector<ExpectedTensor> out;
  auto collect = [&](auto& w) {
    w.layers.resize(static_cast<size_t>(cfg.text.n_layers));
    visit_table(cfg, w, [&](const std::string& name, const Row& r, const Shape& shape, Tensor&) {
      out.push_back({name, shape, r.kind == Kind::kIndex});
    });
  };
  if (cfg.is_assistant()) {
    AssistantWeights w;
    collect(w);
  } else {
    TargetWeights w;
    collect(w);
  }
  return out;
}

namespace {
uint64_t row_bytes(const Tensor& t) { return t.ndim == 0 ? t.nbytes() : t.nbytes() / static_cast<uint64_t>(t.dim(0)); }

template <class W>
uint64_t bytes_per_token(const ModelConfig& c, W& w) {
  const TextConfig& tc = c.text;
  uint64_t total = 0;
  for_each_tensor(c, w, [&](const std::string& name, Tensor& t) {
    if (ends_with(name, "experts.gate_up_proj") || ends_with(name, "experts.down_proj")) {
      total += t.nbytes() / static_cast<uint64_t>(tc.n_experts) * static_cast<uint64_t>(tc.top_k_experts);
      return;
    }
    if constexpr (std::is_same_v<W, TargetWeights>) {
      if (t.data == w.embed.data) return void(total += t.nbytes() + row_bytes(t));  // tied LM head + input row
      if (t.data == w.ple_embed.data) return void(total += row_bytes(t));
    } else {
      const AssistantConfig& a = *c.assistant;
      const uint64_t candidates =
          a.use_ordered_embeddings ? static_cast<uint64_t>(a.centroid_top_k) * (tc.n_vocab / a.n_centroids) : 0;
      if (t.data == w.embed.data) {
        // The drafter embeds its input with the target's table; its own table is only its LM head.
        if (!w.lm_head.empty()) return;
        return void(total += a.use_ordered_embeddings ? candidates * row_bytes(t) : t.nbytes());
      }
      if (t.data == w.lm_head.data && a.use_ordered_embeddings) return void(total += candidates * row_bytes(t));
      if (t.data == w.token_ordering.data) return void(total += candidates * dtype_size(t.dtype));
    }
    total += t.nbytes();
  });
  return total;
}
}  // namespace

uint64_t weight_bytes_per_token(const ModelConfig& cfg, TargetWeights& w) { return bytes_per_token(cfg, w); }
uint64_t weight_bytes_per_token(const ModelConfig& cfg, AssistantWeights& w) { return bytes_per_token(cfg, w); }

std::vector<float> host_layer_scalars(const std::vector<LayerWeights>& layers) {
  std::vector<float> out;
  for (const LayerWeights& lw : layers) out.push_back(load_as_f32(lw.layer_scalar.data, lw.layer_scalar.dtype, 0));
  return out;
}

}  // namespace tandem
