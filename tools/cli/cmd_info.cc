// `tandem info --model DIR [--json]`: loads config + safetensors, binds the weights, and prints the resolved
// architecture (spec §1.6-§1.10 per-layer table, §3 layout) with the memory accounting that bounds decode speed:
// weight bytes read per decoded token and KV-cache bytes per token.
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "commands.h"
#include "core/strings.h"
#include "io/safetensors.h"
#include "model/gemma4_config.h"
#include "model/gemma4_weights.h"

namespace tandem::cli {
namespace {

using nlohmann::json;

struct InfoOptions {
  std::string model;
  bool json = false;
};

struct Accounting {
  uint64_t params = 0, bytes = 0, bytes_per_token = 0;
  std::map<std::string, uint64_t> bytes_by_dtype;
  uint64_t tower_tensors = 0, tower_bytes = 0, tower_params = 0;
  uint64_t other_skipped_bytes = 0;  // unused k/v of shared layers, a stored tied lm_head
  uint64_t kv_bytes_per_token = 0;
  std::string lm_head;  // "tied", "untied", "centroid"
};

template <class W>
void account(const ModelConfig& c, W& w, const SafetensorsModel& st, Accounting* a) {
  uint64_t bound_bytes = 0;
  for_each_tensor(c, w, [&](const std::string& name, Tensor& t) {
    a->params += static_cast<uint64_t>(t.numel());
    a->bytes += t.nbytes();
    a->bytes_by_dtype[dtype_name(t.dtype)] += t.nbytes();
    bound_bytes += t.nbytes();
  });
  for (const TensorInfo& t : st.tensors()) {
    if (!is_multimodal_tower_tensor(t.name)) continue;
    ++a->tower_tensors;
    a->tower_bytes += t.nbytes;
    a->tower_params += static_cast<uint64_t>(t.numel());
  }
  a->other_skipped_bytes = st.total_tensor_bytes() - bound_bytes - a->tower_bytes;
  a->bytes_per_token = weight_bytes_per_token(c, w);
  for (const LayerSpec& l : c.text.layers) {
    if (l.owns_kv) a->kv_bytes_per_token += 2ull * l.n_kv_heads * l.head_dim * sizeof(float);
  }
}

std::string rope_str(const RopeSpec& r, int head_dim) {
  if (r.kind == RopeKind::kDefault) return strfmt("default theta %g", r.theta);
  return strfmt("proportional theta %g, %d of %d pairs rotated", r.theta, r.rotated_pairs(head_dim), head_dim / 2);
}

json layer_json(const LayerSpec& l) {
  return json{{"index", l.index},       {"type", attn_type_name(l.attn)},
              {"head_dim", l.head_dim}, {"kv_heads", l.n_kv_heads},
              {"window", l.window},     {"kv_source", l.kv_source},
              {"k_eq_v", l.k_eq_v},     {"d_ff", l.d_ff},
              {"moe", l.moe},           {"publishes_shared_kv", l.publishes_shared_kv}};
}

json to_json(const InfoOptions& o, const ModelConfig& c, const SafetensorsModel& st, const Accounting& a) {
  const TextConfig& t = c.text;
  json j;
  j["model"] = o.model;
  j["layout"] = layout_name(c.layout);
  j["model_type"] = c.model_type;
  j["weight_prefix"] = c.weight_prefix;
  j["files"] = st.files();
  j["dims"] = {{"n_vocab", t.n_vocab},
               {"d_model", t.d_model},
               {"n_layers", t.n_layers},
               {"n_heads", t.n_heads},
               {"head_dim", t.head_dim},
               {"n_kv_heads", t.n_kv_heads},
               {"global_head_dim", t.global_head_dim},
               {"n_global_kv_heads", t.n_global_kv_heads},
               {"d_ff", t.d_ff},
               {"sliding_window", t.sliding_window},
               {"n_kv_shared_layers", t.n_kv_shared_layers},
               {"ple_dim", t.ple_dim},
               {"n_experts", t.n_experts},
               {"top_k_experts", t.top_k_experts},
               {"moe_d_ff", t.moe_d_ff},
               {"max_position", t.max_position}};
  j["final_logit_softcap"] = t.final_logit_softcap ? json(*t.final_logit_softcap) : json(nullptr);
  j["bos_id"] = c.bos_id;
  j["pad_id"] = c.pad_id;
  j["eos_ids"] = c.eos_ids;
  j["layers"] = json::array();
  for (const LayerSpec& l : t.layers) j["layers"].push_back(layer_json(l));
  j["parameters"] = a.params;
  j["weight_bytes"] = a.bytes;
  j["weight_bytes_by_dtype"] = a.bytes_by_dtype;
  j["weight_bytes_per_token"] = a.bytes_per_token;
  j["skipped"] = {{"tower_tensors", a.tower_tensors},
                  {"tower_bytes", a.tower_bytes},
                  {"tower_parameters", a.tower_params},
                  {"other_bytes", a.other_skipped_bytes}};
  j["kv_cache_bytes_per_token"] = a.kv_bytes_per_token;
  j["kv_cache_dtype"] = "f32";
  j["lm_head"] = a.lm_head;
  if (c.is_assistant()) {
    const AssistantConfig& as = *c.assistant;
    j["assistant"] = {{"backbone_d_model", as.backbone_d_model},
                      {"use_ordered_embeddings", as.use_ordered_embeddings},
                      {"n_centroids", as.n_centroids},
                      {"centroid_top_k", as.centroid_top_k}};
  }
  return j;
}

void print_text(const InfoOptions& o, const ModelConfig& c, const SafetensorsModel& st, const Accounting& a) {
  const TextConfig& t = c.text;
  std::printf("model       %s\n", o.model.c_str());
  std::printf("layout      %s (model_type %s, text weights under \"%s\")\n", layout_name(c.layout),
              c.model_type.c_str(), c.weight_prefix.c_str());
  std::printf("files       %zu, %s of tensors\n", st.files().size(), human_bytes(st.total_tensor_bytes()).c_str());
  for (const std::string& f : st.files()) std::printf("            %s\n", f.c_str());
  std::printf("dims        d_model %d, layers %d, heads %d, vocab %d, d_ff %d, max positions %d\n", t.d_model,
              t.n_layers, t.n_heads, t.n_vocab, t.d_ff, t.max_position);
  std::printf("sliding     head_dim %d x %d KV heads, window %d, RoPE %s\n", t.head_dim, t.n_kv_heads, t.sliding_window,
              rope_str(t.rope_sliding, t.head_dim).c_str());
  std::printf("full        head_dim %d x %d KV heads, RoPE %s%s\n", t.global_head_dim, t.n_global_kv_heads,
              rope_str(t.rope_full, t.global_head_dim).c_str(), t.attention_k_eq_v ? ", K=V" : "");
  if (c.is_assistant()) {
    std::printf("KV sharing  every layer reads the target's shared K/V of its type\n");
  } else {
    std::printf("KV sharing  %d shared layers from layer %d; shared K/V published by layer %d (sliding), %d (full)\n",
                t.n_kv_shared_layers, t.first_shared_layer(), t.shared_kv_layer(AttnType::kSliding),
                t.shared_kv_layer(AttnType::kFull));
  }
  if (t.ple_dim > 0) std::printf("PLE         %d per layer, vocab %d\n", t.ple_dim, t.ple_vocab);
  if (t.moe) std::printf("MoE         %d experts, top %d, expert d_ff %d\n", t.n_experts, t.top_k_experts, t.moe_d_ff);
  std::printf("logits      %s LM head, %s\n", a.lm_head.c_str(),
              t.final_logit_softcap ? strfmt("soft-cap %g", *t.final_logit_softcap).c_str() : "no soft-cap");
  std::vector<std::string> eos;
  for (int id : c.eos_ids) eos.push_back(std::to_string(id));
  std::printf("special     bos %d, pad %d, eos [%s]\n", c.bos_id, c.pad_id, join(eos, ", ").c_str());
  if (c.is_assistant()) {
    const AssistantConfig& as = *c.assistant;
    if (as.use_ordered_embeddings) {
      std::printf("assistant   centroid LM head: %d centroids, top %d -> %d candidate tokens\n", as.n_centroids,
                  as.centroid_top_k, as.centroid_top_k * (t.n_vocab / as.n_centroids));
    }
    std::string req = strfmt("d_model %d, vocab %d", as.backbone_d_model, t.n_vocab);
    for (AttnType ty : {AttnType::kSliding, AttnType::kFull}) {
      for (const LayerSpec& l : t.layers) {
        if (l.attn != ty) continue;
        req += strfmt("; %s K/V %d heads x %d", attn_type_name(ty), l.n_kv_heads, l.head_dim);
        break;
      }
    }
    std::printf("target      requires %s\n", req.c_str());
  }
  std::printf("\n layer  type     head_dim  kv_heads  window  kv_src  K=V  d_ff    MoE  publishes\n");
  for (const LayerSpec& l : t.layers) {
    std::printf(" %5d  %-7s  %8d  %8d  %6d  %6d  %-3s  %-6d  %-3s  %s\n", l.index, attn_type_name(l.attn), l.head_dim,
                l.n_kv_heads, l.window, l.kv_source, l.k_eq_v ? "yes" : "-", l.d_ff, l.moe ? "yes" : "-",
                l.publishes_shared_kv ? "yes" : "-");
  }
  std::printf("\nparameters  %s text weights bound (%llu)", human_count(a.params).c_str(),
              static_cast<unsigned long long>(a.params));
  if (a.tower_tensors > 0) {
    std::printf("; skipped %llu tower tensors, %s params, %s", static_cast<unsigned long long>(a.tower_tensors),
                human_count(a.tower_params).c_str(), human_bytes(a.tower_bytes).c_str());
  }
  if (a.other_skipped_bytes > 0) {
    std::printf("; %s of unused k/v weights of KV-shared layers or stored tied lm_head",
                human_bytes(a.other_skipped_bytes).c_str());
  }
  std::printf("\nweights     %s", human_bytes(a.bytes).c_str());
  for (const auto& [dt, b] : a.bytes_by_dtype) std::printf(" (%s %s)", dt.c_str(), human_bytes(b).c_str());
  std::printf("\nper token   %s of weights read per %s token\n", human_bytes(a.bytes_per_token).c_str(),
              c.is_assistant() ? "drafted" : "decoded");
  std::printf("KV cache    %s per token (f32 CPU cache, %s)\n", human_bytes(a.kv_bytes_per_token).c_str(),
              c.is_assistant() ? "the assistant owns none" : "KV-owning layers x 2 x kv_heads x head_dim x 4 B");
}

Status run_info(const InfoOptions& o) {
  TANDEM_ASSIGN_OR_RETURN(ModelConfig cfg, load_model_config(o.model));
  TANDEM_ASSIGN_OR_RETURN(SafetensorsModel st, SafetensorsModel::open(o.model));
  Accounting a;
  if (cfg.is_assistant()) {
    TANDEM_ASSIGN_OR_RETURN(AssistantWeights w, bind_assistant_weights(cfg, st));
    a.lm_head = cfg.assistant->use_ordered_embeddings ? "centroid" : cfg.text.tie_word_embeddings ? "tied" : "untied";
    account(cfg, w, st, &a);
  } else {
    TANDEM_ASSIGN_OR_RETURN(TargetWeights w, bind_target_weights(cfg, st));
    a.lm_head = "tied";
    account(cfg, w, st, &a);
  }
  if (o.json) {
    std::printf("%s\n", to_json(o, cfg, st, a).dump(2).c_str());
  } else {
    print_text(o, cfg, st, a);
  }
  return ok_status();
}

}  // namespace

void add_info_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("info", "Print the resolved architecture of a checkpoint");
  auto opts = std::make_shared<InfoOptions>();
  cmd->add_option("--model", opts->model, "Checkpoint directory (config.json + safetensors)")->required();
  cmd->add_flag("--json", opts->json, "Print JSON instead of text");
  cmd->footer("Example: tandem info --model models/gemma-4-E2B-it");
  cmd->callback([&exit_code, opts] {
    Status s = run_info(*opts);
    if (!s.ok()) {
      std::fprintf(stderr, "tandem info: %s\n", s.to_string().c_str());
      exit_code = 1;
    }
  });
}

}  // namespace tandem::cli
