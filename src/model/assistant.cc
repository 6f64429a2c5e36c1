// Gemma 4 assistant drafter forward (spec §4): pre_projection of [target embedding, hidden], four Q-only layers
// over the target's published K/V (masks of spec §4.6 in clean mode), final norm, post_projection, LM head.
#include "model/assistant.h"

#include <algorithm>
#include <cmath>

#include "core/log.h"
#include "core/strings.h"

namespace tandem {

const char* draft_head_name(DraftHeadKind k) {
  switch (k) {
    case DraftHeadKind::kTiedDense: return "tied dense";
    case DraftHeadKind::kUntiedDense: return "untied dense";
    case DraftHeadKind::kCentroid: return "centroid-routed masked embedder";
  }
  return "?";
}

struct Gemma4Assistant::Workspace {
  Buffer u;                        // [1, 2 * backbone]: [target embedding | hidden]
  Buffer z, zn, o, f;              // [1, d_model]
  Buffer q, attn;                  // [1, n_heads * max_head_dim]
  Buffer gate, up;                 // [1, d_ff]
  Buffer logits;                   // [1, n_vocab]
  Buffer tok, pos, amax, kv_end;   // i32 [1]
  Buffer centroid_logits;          // [1, n_centroids]
  Buffer cand_ids;                 // i32 [top_k * vocab_per_centroid]
  Buffer cand_emb;                 // [top_k * vocab_per_centroid, d_model]
  Buffer cand_logits;              // [1, top_k * vocab_per_centroid]
  Buffer ordering;                 // i32 [n_vocab]: token_ordering_ on the device
  std::vector<float> host_cand, host_full;
  std::vector<int32_t> host_cand_ids;
  int32_t host_kv_end = 0;
};

Gemma4Assistant::Gemma4Assistant(Gemma4Model& target) : target_(target), backend_(target.backend()) {}
Gemma4Assistant::~Gemma4Assistant() { drop_graphs(); }

void Gemma4Assistant::drop_graphs() {
  for (const auto& [cache, id] : graphs_) backend_.release_graph(id);
  graphs_.clear();
  seen_.clear();
}

Status Gemma4Assistant::check_compatible(const std::string& dir) const {
  Status s = check_assistant_compatible(target_.config(), cfg_);
  if (!s.ok()) return invalid_argument("drafter " + dir + " does not match the target: " + s.message());
  return ok_status();
}

Result<std::unique_ptr<Gemma4Assistant>> Gemma4Assistant::load(const std::string& dir, Gemma4Model& target,
                                                               const LoadOptions& opts) {
  TANDEM_ASSIGN_OR_RETURN(ModelConfig cfg, load_model_config(dir));
  if (!cfg.is_assistant())
    return invalid_argument(dir + " is not a Gemma 4 assistant checkpoint (model_type " + cfg.model_type +
                            "); --draft expects a *-assistant model");
  TANDEM_ASSIGN_OR_RETURN(WeightStore store, WeightStore::open(dir));
  return load_from(std::move(cfg), std::move(store), dir, target, opts);
}

Result<std::unique_ptr<Gemma4Assistant>> Gemma4Assistant::load_from(ModelConfig cfg, WeightStore store,
                                                                    const std::string& dir, Gemma4Model& target,
                                                                    const LoadOptions& opts) {
  std::unique_ptr<Gemma4Assistant> m(new Gemma4Assistant(target));
  Backend& backend = target.backend();
  m->cfg_ = std::move(cfg);
  if (!m->cfg_.is_assistant()) return invalid_argument(dir + " is not an assistant configuration");
  TANDEM_TRY(m->check_compatible(dir));
  m->store_ = std::move(store);
  auto bound = bind_assistant_weights(m->cfg_, m->store_.safetensors());
  if (!bound.ok()) return Status(bound.status()).with_context(dir);
  m->w_ = std::move(bound).value();

  m->layer_scalar_ = host_layer_scalars(m->w_.layers);
  const AssistantConfig& ac = *m->cfg_.assistant;
  if (ac.use_ordered_embeddings) {
    m->head_ = DraftHeadKind::kCentroid;
    const Tensor& ord = m->w_.token_ordering;
    m->token_ordering_.resize(static_cast<size_t>(ord.numel()));
    for (int64_t i = 0; i < ord.numel(); ++i) {
      int64_t v = ord.dtype == DType::kI64 ? ord.ptr<const int64_t>()[i] : ord.ptr<const int32_t>()[i];
      if (v < 0 || v >= m->cfg_.text.n_vocab)
        return corrupt(strfmt("%s: masked_embedding.token_ordering[%lld] = %lld is not a token id", dir.c_str(),
                              static_cast<long long>(i), static_cast<long long>(v)));
      m->token_ordering_[static_cast<size_t>(i)] = static_cast<int32_t>(v);
    }
  } else {
    m->head_ = m->w_.lm_head.empty() ? DraftHeadKind::kTiedDense : DraftHeadKind::kUntiedDense;
  }

  ModelConfig* mcfg = &m->cfg_;
  AssistantWeights* w = &m->w_;
  TANDEM_TRY(m->store_.place(backend, [mcfg, w](const auto& fn) { for_each_tensor(*mcfg, *w, fn); }, opts.progress));
  const TextConfig& tc = m->cfg_.text;
  TANDEM_TRY(m->rope_.upload(backend, tc));

  // Workspace: every step has exactly one query row.
  auto ws = std::make_unique<Workspace>();
  const size_t act = dtype_size(backend.activation_dtype());
  const int max_hd = std::max(tc.head_dim, tc.global_head_dim);
  int max_ff = 0;
  for (const LayerSpec& ls : tc.layers) max_ff = std::max(max_ff, ls.d_ff);
  auto alloc = [&](Buffer& b, size_t bytes) -> Status {
    TANDEM_ASSIGN_OR_RETURN(b, backend.alloc(std::max<size_t>(bytes, 64)));
    return ok_status();
  };
  TANDEM_TRY(alloc(ws->u, 2 * static_cast<size_t>(ac.backbone_d_model) * act));
  for (Buffer* b : {&ws->z, &ws->zn, &ws->o, &ws->f}) TANDEM_TRY(alloc(*b, tc.d_model * act));
  TANDEM_TRY(alloc(ws->q, static_cast<size_t>(tc.n_heads) * max_hd * act));
  TANDEM_TRY(alloc(ws->attn, static_cast<size_t>(tc.n_heads) * max_hd * act));
  TANDEM_TRY(alloc(ws->gate, static_cast<size_t>(max_ff) * act));
  TANDEM_TRY(alloc(ws->up, static_cast<size_t>(max_ff) * act));
  TANDEM_TRY(alloc(ws->logits, static_cast<size_t>(tc.n_vocab) * act));
  for (Buffer* b : {&ws->tok, &ws->pos, &ws->amax, &ws->kv_end}) TANDEM_TRY(alloc(*b, sizeof(int32_t)));
  if (m->head_ == DraftHeadKind::kCentroid) {
    const size_t n_cand = static_cast<size_t>(ac.centroid_top_k) * (tc.n_vocab / ac.n_centroids);
    TANDEM_TRY(alloc(ws->centroid_logits, static_cast<size_t>(ac.n_centroids) * act));
    TANDEM_TRY(alloc(ws->cand_ids, n_cand * sizeof(int32_t)));
    TANDEM_TRY(alloc(ws->cand_emb, n_cand * tc.d_model * act));
    TANDEM_TRY(alloc(ws->cand_logits, n_cand * act));
    TANDEM_TRY(alloc(ws->ordering, m->token_ordering_.size() * sizeof(int32_t)));
    TANDEM_TRY(backend.copy(ws->ordering.data(), m->token_ordering_.data(), m->token_ordering_.size() * sizeof(int32_t),
                            CopyKind::kHostToDevice));
  }
  m->ws_ = std::move(ws);
  TANDEM_TRY(backend.synchronize());
  return m;
}

Status Gemma4Assistant::step(const DraftStepArgs& a, DraftStepResult* out) {
  const TextConfig& tc = cfg_.text;
  const DType act = backend_.activation_dtype();
  const int64_t Ht = cfg_.assistant->backbone_d_model;
  Workspace& ws = *ws_;
  if (!a.cache || a.kv_end <= 0 || a.kv_end > a.cache->length())
    return invalid_argument("draft step: the target cache must hold positions [0, kv_end)");
  if (a.token < 0 || a.token >= tc.n_vocab) return invalid_argument(strfmt("draft step: token id %d", a.token));

  const Tensor u_hid = ws.u.view(act, {1, Ht}, static_cast<size_t>(Ht) * dtype_size(act));
  const int32_t q_pos = static_cast<int32_t>(a.q_pos);
  ws.host_kv_end = static_cast<int32_t>(a.kv_end);
  TANDEM_TRY(backend_.copy(ws.tok.data(), &a.token, sizeof(int32_t), CopyKind::kHostToDevice));
  TANDEM_TRY(backend_.copy(ws.pos.data(), &q_pos, sizeof(int32_t), CopyKind::kHostToDevice));
  TANDEM_TRY(backend_.copy(ws.kv_end.data(), &ws.host_kv_end, sizeof(int32_t), CopyKind::kHostToDevice));
  if (a.g_in) TANDEM_TRY(backend_.copy(u_hid.data, a.g_in->data, u_hid.nbytes(), CopyKind::kDeviceToDevice));

  // The step's device work replays a CUDA graph per target cache once seen (it reads P and Pq from the device).
  if (!target_.graphs_enabled() || graphs_failed_) {
    if (!graphs_.empty()) drop_graphs();
    TANDEM_TRY(run_step(a));
  } else {
    const uint64_t key = a.cache->storage_id();
    auto it = graphs_.find(key);
    if (it == graphs_.end() && seen_.count(key)) {
      Result<Backend::GraphId> g = backend_.capture([&] { return run_step(a); });
      if (g.ok()) {
        it = graphs_.emplace(key, *g).first;
      } else {
        graphs_failed_ = true;  // eager from now on
        if (g.status().code() != StatusCode::kUnsupported)
          TANDEM_LOG_WARN("CUDA graphs off for the drafter: %s", g.status().to_string().c_str());
      }
    }
    if (it != graphs_.end()) {
      TANDEM_TRY(backend_.replay(it->second));
    } else {
      seen_.insert(key);
      TANDEM_TRY(run_step(a));
    }
  }
  out->g_out = u_hid;
  TANDEM_TRY(backend_.copy(&out->argmax, ws.amax.data(), sizeof(int32_t), CopyKind::kDeviceToHost));
  if (head_ == DraftHeadKind::kCentroid) {
    out->logits = Tensor();
    if (a.full_logits) return centroid_full_logits(out);
    return backend_.last_error();
  }
  out->logits = a.full_logits ? ws.logits.view(act, {1, tc.n_vocab}) : Tensor();
  return backend_.last_error();
}

// Embedding, the four Q-only layers, the final norm, post_projection and (dense heads) the LM head + argmax.
Status Gemma4Assistant::run_step(const DraftStepArgs& a) {
  const TextConfig& tc = cfg_.text;
  const DType act = backend_.activation_dtype();
  const int64_t Ht = cfg_.assistant->backbone_d_model, d = tc.d_model;
  Workspace& ws = *ws_;
  const Tensor u = ws.u.view(act, {1, 2 * Ht});
  const Tensor u_emb = ws.u.view(act, {1, Ht});
  const Tensor u_hid = ws.u.view(act, {1, Ht}, static_cast<size_t>(Ht) * dtype_size(act));
  // Input = [target's scaled embedding of t, hidden] (spec §4.2: the TARGET table and scale, not the drafter's).
  target_.embed(ws.tok.view(DType::kI32, {1}), u_emb);

  const Tensor z = ws.z.view(act, {1, d});
  const Tensor zn = ws.zn.view(act, {1, d});
  const Tensor o = ws.o.view(act, {1, d});
  const Tensor f = ws.f.view(act, {1, d});
  const Tensor pos = ws.pos.view(DType::kI32, {1});
  backend_.linear({.out = z, .x = u, .w = w_.pre_projection});
  // zn = input_norm(z) of layer 0 here, of every later layer (and the final norm) in the op that ends the layer
  // before.
  backend_.rms_norm(
      {.out = zn, .x = z, .weight = tc.n_layers > 0 ? w_.layers[0].input_norm : w_.final_norm, .eps = tc.rms_eps});
  for (int k = 0; k < tc.n_layers; ++k) {
    const LayerSpec& ls = tc.layer(k);
    const LayerWeights& lw = w_.layers[static_cast<size_t>(k)];
    const int64_t nh = tc.n_heads, hd = ls.head_dim;
    const Tensor inv_freq = rope_.for_layer(ls.attn, ls.head_dim);
    const Tensor q = ws.q.view(act, {1, nh, hd});
    backend_.linear({.out = q.reshape({1, nh * hd}), .x = zn, .w = lw.attn.q_proj});
    backend_.rms_norm(  // q = RoPE(q_norm(q)), one op (ops.h)
        {.out = q, .x = q, .weight = lw.attn.q_norm, .eps = tc.rms_eps, .rope_pos = pos, .rope_inv_freq = inv_freq});
    // The query at Pq = P sees target keys [0, P): all of them on the full layer, the newest W+1 on sliding
    // layers (drafter_sliding_window).
    const int src = target_.text().shared_kv_layer(ls.attn);
    const Tensor attn = ws.attn.view(act, {1, nh, hd});
    backend_.attention({.out = attn, .q = q, .kv = a.cache->view(src, a.kv_end), .q_pos = pos,
                        .kv_end = ws.kv_end.view(DType::kI32, {1}),
                        .window = ls.attn == AttnType::kSliding ? drafter_sliding_window(ls.window) : 0,
                        .causal = true, .scale = 1.f});
    // z = z + norm(o_proj(attn)), then the GeGLU MLP of pre_ffn_norm(z) into f, as one composite op (ops.h
    // AttnOutMlpArgs; four launches on CUDA: the o product, both norms in one, the GeGLU and the down product).
    const Tensor gate = ws.gate.view(act, {1, ls.d_ff});
    const Tensor up = ws.up.view(act, {1, ls.d_ff});
    backend_.attn_out_mlp({.attn = attn.reshape({1, nh * hd}),
                           .o_proj = lw.attn.o_proj,
                           .o = o,
                           .x = z,
                           .post_attn_norm = lw.post_attn_norm,
                           .xn = zn,
                           .pre_ffn_norm = lw.pre_ffn_norm,
                           .eps = tc.rms_eps,
                           .gate = lw.mlp.gate,
                           .up = lw.mlp.up,
                           .g = gate,
                           .u = up,
                           .down = lw.mlp.down,
                           .f = f});
    // z = (z + norm(f)) * layer_scalar: the scalar multiplies the whole output, residual included (spec §1.5);
    // then zn = the next layer's input norm of z, or the final norm.
    const Tensor& next_norm = k + 1 < tc.n_layers ? w_.layers[static_cast<size_t>(k) + 1].input_norm : w_.final_norm;
    backend_.rms_norm_then({.out = z,
                            .x = f,
                            .weight = lw.post_ffn_norm,
                            .eps = tc.rms_eps,
                            .residual = z,
                            .out_scale = layer_scalar_[static_cast<size_t>(k)]},
                           {.out = zn, .x = z, .weight = next_norm, .eps = tc.rms_eps});
  }
  // Next step's hidden = post_projection(normed output), written straight into the input slot it feeds.
  backend_.linear({.out = u_hid, .x = zn, .w = w_.post_projection});
  if (head_ == DraftHeadKind::kCentroid) {
    centroid_head_ops(zn);
    return ok_status();
  }
  const Tensor logits = ws.logits.view(act, {1, tc.n_vocab});
  backend_.linear({.out = logits, .x = zn, .w = head_ == DraftHeadKind::kUntiedDense ? w_.lm_head : w_.embed});
  backend_.argmax({.out = ws.amax.view(DType::kI32, {1}), .x = logits});
  return ok_status();
}

void Gemma4Assistant::centroid_head_ops(const Tensor& zf) {
  // Masked embedder (spec §4.7), on the device: score the clusters, keep the top-k, score only their tokens, and
  // the argmax over them with ties to the lowest token id (HF's argmax over the scattered vocabulary).
  const TextConfig& tc = cfg_.text;
  const AssistantConfig& ac = *cfg_.assistant;
  const DType act = backend_.activation_dtype();
  Workspace& ws = *ws_;
  const int C = ac.n_centroids, K = ac.centroid_top_k, M = tc.n_vocab / ac.n_centroids;
  const int64_t n_cand = static_cast<int64_t>(K) * M;
  const Tensor cl = ws.centroid_logits.view(act, {1, C});
  backend_.linear({.out = cl, .x = zf, .w = w_.centroids});
  const Tensor ids = ws.cand_ids.view(DType::kI32, {n_cand});
  backend_.centroid_candidates(
      {.ids = ids, .logits = cl, .ordering = ws.ordering.view(DType::kI32, {tc.n_vocab}), .k = K});
  const Tensor head = head_ == DraftHeadKind::kUntiedDense ? w_.lm_head : w_.embed;
  const Tensor emb = ws.cand_emb.view(act, {n_cand, tc.d_model});
  backend_.embedding({.out = emb, .table = head, .ids = ids, .scale = 1.f});
  const Tensor sel = ws.cand_logits.view(act, {1, n_cand});
  backend_.linear({.out = sel, .x = zf, .w = emb, .w_fresh = true});
  backend_.argmax({.out = ws.amax.view(DType::kI32, {1}), .x = sel, .ids = ids});
}

Status Gemma4Assistant::centroid_full_logits(DraftStepResult* out) {
  // Sampled drafts need the whole distribution: the candidates' logits come back and are scattered over the
  // vocabulary on the host, unselected tokens at min(selected) - 1 (a Python float, then cast to the activation
  // dtype), as HF's masked embedder fills them.
  const TextConfig& tc = cfg_.text;
  const AssistantConfig& ac = *cfg_.assistant;
  const DType act = backend_.activation_dtype();
  Workspace& ws = *ws_;
  const int64_t n_cand = static_cast<int64_t>(ac.centroid_top_k) * (tc.n_vocab / ac.n_centroids);
  std::vector<uint8_t> raw(static_cast<size_t>(n_cand) * dtype_size(act));
  ws.host_cand_ids.resize(static_cast<size_t>(n_cand));
  TANDEM_TRY(backend_.copy(raw.data(), ws.cand_logits.data(), raw.size(), CopyKind::kDeviceToHost));
  TANDEM_TRY(backend_.copy(ws.host_cand_ids.data(), ws.cand_ids.data(), ws.host_cand_ids.size() * sizeof(int32_t),
                           CopyKind::kDeviceToHost));
  TANDEM_TRY(backend_.synchronize());
  ws.host_cand.resize(static_cast<size_t>(n_cand));
  float lo = INFINITY;
  for (int64_t i = 0; i < n_cand; ++i) {
    const float v = load_as_f32(raw.data(), act, i);
    ws.host_cand[static_cast<size_t>(i)] = v;
    lo = std::min(lo, v);
  }
  const float fill = round_to_dtype(static_cast<float>(static_cast<double>(lo) - 1.0), act);
  ws.host_full.assign(static_cast<size_t>(tc.n_vocab), fill);
  for (int64_t i = 0; i < n_cand; ++i)
    ws.host_full[static_cast<size_t>(ws.host_cand_ids[static_cast<size_t>(i)])] = ws.host_cand[static_cast<size_t>(i)];
  std::vector<uint8_t> packed(static_cast<size_t>(tc.n_vocab) * dtype_size(act));
  for (int i = 0; i < tc.n_vocab; ++i) {
    float v = ws.host_full[static_cast<size_t>(i)];
    if (act == DType::kF32)
      reinterpret_cast<float*>(packed.data())[i] = v;
    else
      reinterpret_cast<uint16_t*>(packed.data())[i] = act == DType::kBF16 ? f32_to_bf16(v) : f32_to_f16(v);
  }
  const Tensor logits = ws.logits.view(act, {1, tc.n_vocab});
  TANDEM_TRY(backend_.copy(logits.data, packed.data(), packed.size(), CopyKind::kHostToDevice));
  TANDEM_TRY(backend_.synchronize());
  out->logits = logits;
  return backend_.last_error();
}

}  // namespace tandem
