// Gemma 4 target forward pass (spec §1): embedding (+ per-layer embeddings), decoder layers with sandwich norms,
// q/k/v norms, RoPE, sliding/full attention over the runtime's KV cache, GeGLU MLP (+ MoE), layer_scalar,
// final norm, tied LM head and soft-cap. Straight-line code over Backend ops; every numeric choice cites the spec.
#include "model/gemma4.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string_view>

#include "core/log.h"
#include "core/strings.h"

namespace tandem {

float round_to_dtype(float value, DType dtype) {
  switch (dtype) {
    case DType::kBF16: return round_bf16(value);
    case DType::kF16: return f16_to_f32(f32_to_f16(value));
    default: return value;
  }
}

// Preallocated activations, grown to the largest forward seen. Shapes for `rows` new tokens.
struct Gemma4Model::Workspace {
  int64_t rows = 0, out_rows = 0;
  Buffer x, xn;        // [rows, d_model]
  Buffer q, attn;      // [rows, n_heads * max_head_dim]
  Buffer k, v;         // [rows, max_kv_heads * max_head_dim]
  Buffer o, f, f2, y2; // [rows, d_model]
  Buffer z;            // [rows, d_model]: the router's input (MoE)
  Buffer g, u;         // [rows, max_d_ff]
  Buffer router;       // [rows, n_experts]
  Buffer moe_idx;      // i32 [rows, top_k]
  Buffer moe_w;        // f32 [rows, top_k]
  Buffer ple;          // [rows, n_layers, ple_dim]
  Buffer ple_tmp;      // [rows, n_layers * ple_dim]: the context part, then one layer's [rows, ple_dim] gate
  Buffer ids, pos;     // i32 [rows]
  Buffer kv_end;       // i32 [1]: cache length after this forward (attention reads it on the device)
  Buffer hidden;       // [out_rows, d_model]
  Buffer logits;       // [out_rows, n_vocab]
  std::vector<int32_t> host_ids, host_pos;
  int32_t host_kv_end = 0;
  // MoE layers on a backend with concurrent streams: the experts run here while the dense GeGLU runs on the
  // model's stream (-1: no second stream, everything in order on one).
  StreamId side = -1;
  bool side_tried = false;
};

namespace {
// Largest single-sequence forward replayed from a CUDA graph (decode, verify blocks, short prompt chunks).
constexpr int64_t kMaxGraphRows = 16;
}  // namespace

Gemma4Model::Gemma4Model(Backend& backend) : backend_(backend) {
  const char* env = std::getenv("TANDEM_GRAPHS");
  graphs_on_ = !(env && std::string_view(env) == "0");
}
Gemma4Model::~Gemma4Model() { drop_graphs(); }

void Gemma4Model::set_graphs(bool on) {
  if (!on) drop_graphs();
  graphs_on_ = on;
}

void Gemma4Model::drop_graphs() {
  for (const auto& [key, id] : graphs_) backend_.release_graph(id);
  graphs_.clear();
  seen_.clear();
}

Result<std::unique_ptr<Gemma4Model>> Gemma4Model::load(const std::string& dir, Backend& backend,
                                                       const LoadOptions& opts) {
  TANDEM_ASSIGN_OR_RETURN(ModelConfig cfg, load_model_config(dir));
  if (cfg.is_assistant())
    return invalid_argument(dir + " is a Gemma 4 assistant (drafter) checkpoint, not a target model");
  TANDEM_ASSIGN_OR_RETURN(WeightStore store, WeightStore::open(dir));
  return load_from(std::move(cfg), std::move(store), dir, backend, opts);
}

Result<std::unique_ptr<Gemma4Model>> Gemma4Model::load_from(ModelConfig cfg, WeightStore store, const std::string& dir,
                                                            Backend& backend, const LoadOptions& opts) {
  std::unique_ptr<Gemma4Model> m(new Gemma4Model(backend));
  m->cfg_ = std::move(cfg);
  if (m->cfg_.is_assistant()) return invalid_argument(dir + " is an assistant configuration, not a target model");
  const TextConfig& tc = m->cfg_.text;
  m->store_ = std::move(store);
  auto bound = bind_target_weights(m->cfg_, m->store_.safetensors());
  if (!bound.ok()) return Status(bound.status()).with_context(dir);
  m->w_ = std::move(bound).value();

  // Scalars the forward needs on the host, read before the weights move to the device.
  m->layer_scalar_ = host_layer_scalars(m->w_.layers);
  // HF casts sqrt(H) (a Python double -> f32 buffer) to the weight dtype before multiplying (spec §1.3).
  m->embed_scale_ = round_to_dtype(static_cast<float>(std::sqrt(static_cast<double>(tc.d_model))), m->w_.embed.dtype);
  if (tc.ple_dim > 0)
    m->ple_embed_scale_ =
        round_to_dtype(static_cast<float>(std::sqrt(static_cast<double>(tc.ple_dim))), m->w_.ple_embed.dtype);

  for (Op op : {Op::kEmbedding, Op::kLinear, Op::kRmsNorm, Op::kRope, Op::kKvWrite, Op::kAttention, Op::kGeluMul,
                Op::kAdd, Op::kScale, Op::kSoftcap}) {
    if (!backend.supports(op, m->w_.embed.dtype))
      return unsupported(strfmt("the %s backend cannot run %s with %s weights yet", backend.name(), op_name(op),
                                dtype_name(m->w_.embed.dtype)));
  }
  if (tc.moe && (!backend.supports(Op::kMoeRoute, m->w_.embed.dtype) || !backend.supports(Op::kMoeExperts, m->w_.embed.dtype)))
    return unsupported(strfmt("the %s backend cannot run mixture-of-experts layers yet", backend.name()));

  ModelConfig* mcfg = &m->cfg_;
  TargetWeights* w = &m->w_;
  TANDEM_TRY(m->store_.place(backend, [mcfg, w](const auto& fn) { for_each_tensor(*mcfg, *w, fn); }, opts.progress));

  TANDEM_TRY(m->rope_.upload(backend, tc));
  TANDEM_TRY(backend.synchronize());
  return m;
}

std::vector<KvLayerSpec> Gemma4Model::kv_layout() const {
  std::vector<KvLayerSpec> out;
  for (const LayerSpec& ls : cfg_.text.layers)
    out.push_back({.owns_kv = ls.owns_kv, .source = ls.kv_source, .n_kv_heads = ls.n_kv_heads,
                   .head_dim = ls.head_dim, .window = ls.attn == AttnType::kSliding ? ls.window : 0});
  return out;
}

Result<KvCache> Gemma4Model::new_cache(const KvCacheOptions& opts) const {
  if (opts.max_positions > cfg_.text.max_position && cfg_.text.max_position > 0)
    return invalid_argument(strfmt("context of %lld positions exceeds the model's max_position_embeddings %d",
                                   static_cast<long long>(opts.max_positions), cfg_.text.max_position));
  return KvCache::create(kv_layout(), backend_, opts);
}

void Gemma4Model::embed(const Tensor& ids, const Tensor& out) {
  backend_.embedding({.out = out, .table = w_.embed, .ids = ids, .scale = embed_scale_});
}

Status Gemma4Model::ensure_workspace(int64_t rows, int64_t out_rows) {
  if (!ws_) ws_ = std::make_unique<Workspace>();
  Workspace& ws = *ws_;
  const TextConfig& tc = cfg_.text;
  const size_t act = dtype_size(backend_.activation_dtype());
  auto grow = [&](Buffer& b, size_t bytes) -> Status {
    if (b.size() >= bytes && b.data()) return ok_status();
    drop_graphs();  // captured graphs point at the old buffers
    TANDEM_ASSIGN_OR_RETURN(b, backend_.alloc(std::max<size_t>(bytes, 64)));
    return ok_status();
  };
  if (rows > ws.rows) {
    int max_hd = std::max(tc.head_dim, tc.global_head_dim);
    int max_kv = std::max(tc.n_kv_heads, tc.n_global_kv_heads);
    int max_ff = 0;
    for (const LayerSpec& ls : tc.layers) max_ff = std::max(max_ff, ls.d_ff);
    const size_t r = static_cast<size_t>(rows);
    for (Buffer* b : {&ws.x, &ws.xn, &ws.o, &ws.f, &ws.f2, &ws.y2}) TANDEM_TRY(grow(*b, r * tc.d_model * act));
    if (tc.moe) TANDEM_TRY(grow(ws.z, r * tc.d_model * act));
    TANDEM_TRY(grow(ws.q, r * tc.n_heads * max_hd * act));
    TANDEM_TRY(grow(ws.attn, r * tc.n_heads * max_hd * act));
    TANDEM_TRY(grow(ws.k, r * max_kv * max_hd * act));
    TANDEM_TRY(grow(ws.v, r * max_kv * max_hd * act));
    TANDEM_TRY(grow(ws.g, r * max_ff * act));
    TANDEM_TRY(grow(ws.u, r * max_ff * act));
    if (tc.moe) {
      TANDEM_TRY(grow(ws.router, r * tc.n_experts * act));
      TANDEM_TRY(grow(ws.moe_idx, r * tc.top_k_experts * sizeof(int32_t)));
      TANDEM_TRY(grow(ws.moe_w, r * tc.top_k_experts * sizeof(float)));
    }
    if (tc.ple_dim > 0) {
      TANDEM_TRY(grow(ws.ple, static_cast<size_t>(tc.n_layers) * r * tc.ple_dim * act));
      TANDEM_TRY(grow(ws.ple_tmp, static_cast<size_t>(tc.n_layers) * r * tc.ple_dim * act));
    }
    TANDEM_TRY(grow(ws.ids, r * sizeof(int32_t)));
    TANDEM_TRY(grow(ws.pos, r * sizeof(int32_t)));
    TANDEM_TRY(grow(ws.kv_end, sizeof(int32_t)));
    ws.rows = rows;
  }
  if (tc.moe && !ws.side_tried) {
    ws.side_tried = true;
    if (backend_.concurrent_streams()) {
      Result<StreamId> side = backend_.create_stream();
      if (side.ok()) {
        ws.side = *side;
      } else {
        TANDEM_LOG_WARN("MoE experts stay on one stream: %s", side.status().to_string().c_str());
      }
    }
  }
  if (out_rows > ws.out_rows) {
    TANDEM_TRY(grow(ws.hidden, static_cast<size_t>(out_rows) * tc.d_model * act));
    TANDEM_TRY(grow(ws.logits, static_cast<size_t>(out_rows) * tc.n_vocab * act));
    ws.out_rows = out_rows;
  }
  return ok_status();
}

Status Gemma4Model::forward(std::span<const SequenceInput> batch, ForwardOutputs* out) {
  const TextConfig& tc = cfg_.text;
  int64_t total_out = 0;
  for (size_t s = 0; s < batch.size(); ++s) {
    const SequenceInput& in = batch[s];
    if (!in.cache) return invalid_argument("forward: sequence without a KV cache");
    const int64_t n = static_cast<int64_t>(in.tokens.size());
    if (in.n_outputs < 0 || in.n_outputs > n)
      return invalid_argument(strfmt("forward: %d outputs requested for %lld tokens", in.n_outputs,
                                     static_cast<long long>(n)));
    if (in.cache->length() + n > in.cache->max_positions())
      return out_of_range(strfmt("sequence of %lld tokens exceeds the context of %lld positions",
                                 static_cast<long long>(in.cache->length() + n),
                                 static_cast<long long>(in.cache->max_positions())));
    for (int32_t id : in.tokens)
      if (id < 0 || id >= tc.n_vocab || (tc.ple_dim > 0 && id >= tc.ple_vocab))
        return invalid_argument(strfmt("token id %d is outside the vocabulary of %d", id, tc.n_vocab));
    if (batch.size() > 1 && n > in.cache->max_tokens_per_forward())
      return invalid_argument("forward: in a batch of several sequences each must fit in one chunk");
    total_out += in.n_outputs;
  }
  TANDEM_TRY(ensure_workspace(1, total_out));

  if (batch.size() == 1 && static_cast<int64_t>(batch[0].tokens.size()) > batch[0].cache->max_tokens_per_forward()) {
    // Long prompt: chunks of at most max_tokens_per_forward; outputs are the last n_outputs tokens overall.
    const SequenceInput& in = batch[0];
    const int64_t n = static_cast<int64_t>(in.tokens.size());
    const int64_t chunk = in.cache->max_tokens_per_forward();
    const int64_t first_out = n - in.n_outputs;
    for (int64_t start = 0; start < n; start += chunk) {
      const int64_t cnt = std::min(chunk, n - start);
      const int64_t out_from = std::max(start, first_out);
      SequenceInput part{.cache = in.cache, .tokens = in.tokens.subspan(start, cnt),
                         .n_outputs = static_cast<int>(std::max<int64_t>(0, start + cnt - out_from))};
      TANDEM_TRY(forward_chunk(std::span<const SequenceInput>(&part, 1), std::max<int64_t>(0, out_from - first_out)));
    }
  } else {
    TANDEM_TRY(forward_chunk(batch, 0));
  }
  out->hidden = ws_->hidden.view(backend_.activation_dtype(), {total_out, tc.d_model});
  out->logits = ws_->logits.view(backend_.activation_dtype(), {total_out, tc.n_vocab});
  return backend_.last_error();
}

Status Gemma4Model::forward_chunk(std::span<const SequenceInput> batch, int64_t out_row0) {
  int64_t rows = 0, n_out = 0;
  for (const SequenceInput& in : batch) {
    rows += static_cast<int64_t>(in.tokens.size());
    n_out += in.n_outputs;
  }
  if (rows == 0) return ok_status();
  TANDEM_TRY(ensure_workspace(rows, out_row0 + n_out));
  Workspace& ws = *ws_;

  ws.host_ids.clear();
  ws.host_pos.clear();
  for (const SequenceInput& in : batch) {
    for (size_t j = 0; j < in.tokens.size(); ++j) {
      ws.host_ids.push_back(in.tokens[j]);
      ws.host_pos.push_back(static_cast<int32_t>(in.cache->length() + static_cast<int64_t>(j)));
    }
  }
  TANDEM_TRY(backend_.copy(ws.ids.data(), ws.host_ids.data(), rows * sizeof(int32_t), CopyKind::kHostToDevice));
  TANDEM_TRY(backend_.copy(ws.pos.data(), ws.host_pos.data(), rows * sizeof(int32_t), CopyKind::kHostToDevice));
  ws.host_kv_end = static_cast<int32_t>(batch[0].cache->length() + rows);
  TANDEM_TRY(backend_.copy(ws.kv_end.data(), &ws.host_kv_end, sizeof(int32_t), CopyKind::kHostToDevice));

  // Small single-sequence forwards replay a CUDA graph: everything below reads the cache length from the device.
  const bool graphable = graphs_on_ && batch.size() == 1 && out_row0 == 0 && rows <= kMaxGraphRows;
  if (!graphable) {
    TANDEM_TRY(run_chunk(batch, rows, n_out, out_row0));
  } else {
    const GraphKey key{rows, n_out, batch[0].cache->storage_id()};
    auto it = graphs_.find(key);
    if (it == graphs_.end() && seen_.count(key)) {
      Result<Backend::GraphId> g = backend_.capture([&] { return run_chunk(batch, rows, n_out, out_row0); });
      if (g.ok()) {
        it = graphs_.emplace(key, *g).first;
      } else if (g.status().code() == StatusCode::kUnsupported) {
        graphs_on_ = false;  // a backend without graphs: never try again
      } else {
        TANDEM_LOG_WARN("CUDA graphs off for this model: %s", g.status().to_string().c_str());
        drop_graphs();
        graphs_on_ = false;
      }
    }
    if (it != graphs_.end()) {
      TANDEM_TRY(backend_.replay(it->second));
    } else {
      seen_.insert(key);
      TANDEM_TRY(run_chunk(batch, rows, n_out, out_row0));
    }
  }
  for (const SequenceInput& in : batch) in.cache->commit(in.cache->length() + static_cast<int64_t>(in.tokens.size()));
  return backend_.last_error();
}

Status Gemma4Model::run_chunk(std::span<const SequenceInput> batch, int64_t rows, int64_t n_out, int64_t out_row0) {
  const TextConfig& tc = cfg_.text;
  const DType act = backend_.activation_dtype();
  Workspace& ws = *ws_;
  const Tensor ids = ws.ids.view(DType::kI32, {rows});
  const Tensor x = ws.x.view(act, {rows, tc.d_model});

  backend_.embedding({.out = x, .table = w_.embed, .ids = ids, .scale = embed_scale_});

  if (tc.ple_dim > 0) {
    // Per-layer inputs of every layer at once (spec §1.4), stored [rows, n_layers, ple_dim]: the token-identity
    // part gathers each token's packed row of the table, the context part is one product with the whole
    // per_layer_model_projection (scaled by d_model^-0.5), and one norm over ple_dim-wide rows mixes them:
    // ple = (norm(context) + identity) * 2^-0.5, each stage rounded as the separate ops would be.
    const int64_t P = tc.ple_dim, L = tc.n_layers;
    const Tensor ple = ws.ple.view(act, {rows, L * P});
    const Tensor ctx = ws.ple_tmp.view(act, {rows, L * P});
    const float proj_scale = static_cast<float>(std::pow(static_cast<double>(tc.d_model), -0.5));
    const float mix_scale = static_cast<float>(std::pow(2.0, -0.5));
    backend_.embedding({.out = ple, .table = w_.ple_embed, .ids = ids, .scale = ple_embed_scale_});
    backend_.linear({.out = ctx, .x = x, .w = w_.ple_model_proj, .alpha = proj_scale});
    backend_.rms_norm({.out = ple.reshape({rows * L, P}), .x = ctx.reshape({rows * L, P}), .weight = w_.ple_proj_norm,
                       .eps = tc.rms_eps, .residual = ple.reshape({rows * L, P}), .out_scale = mix_scale});
  }

  // Layer 0's input norm; every later one comes out of the previous layer's last norm (layer_forward).
  if (tc.n_layers > 0)
    backend_.rms_norm(
        {.out = ws.xn.view(act, {rows, tc.d_model}), .x = x, .weight = w_.layers[0].input_norm, .eps = tc.rms_eps});
  for (int i = 0; i < tc.n_layers; ++i) TANDEM_TRY(layer_forward(i, batch, rows));

  // Final norm + tied LM head + soft-cap for the requested rows (the last n_outputs of each sequence).
  const Tensor hidden_all = ws.hidden.view(act, {out_row0 + n_out, tc.d_model});
  int64_t r = 0, o = out_row0;
  for (const SequenceInput& in : batch) {
    const int64_t n = static_cast<int64_t>(in.tokens.size());
    if (in.n_outputs > 0)
      backend_.rms_norm({.out = hidden_all.slice(o, o + in.n_outputs), .x = x.slice(r + n - in.n_outputs, r + n),
                         .weight = w_.final_norm, .eps = tc.rms_eps});
    r += n;
    o += in.n_outputs;
  }
  if (n_out > 0) {
    const Tensor logits = ws.logits.view(act, {out_row0 + n_out, tc.n_vocab}).slice(out_row0, out_row0 + n_out);
    backend_.linear({.out = logits, .x = hidden_all.slice(out_row0, out_row0 + n_out), .w = w_.embed});
    if (tc.final_logit_softcap) backend_.softcap({.x = logits, .cap = *tc.final_logit_softcap});
  }
  return ok_status();
}

Status Gemma4Model::layer_forward(int i, std::span<const SequenceInput> batch, int64_t rows) {
  const TextConfig& tc = cfg_.text;
  const LayerSpec& ls = tc.layer(i);
  const LayerWeights& lw = w_.layers[static_cast<size_t>(i)];
  const DType act = backend_.activation_dtype();
  Workspace& ws = *ws_;
  const int64_t d = tc.d_model, nh = tc.n_heads, hd = ls.head_dim, nkv = ls.n_kv_heads;
  const Tensor x = ws.x.view(act, {rows, d});
  const Tensor xn = ws.xn.view(act, {rows, d});
  const Tensor pos = ws.pos.view(DType::kI32, {rows});
  const Tensor inv_freq = rope_.for_layer(ls.attn, ls.head_dim);

  // The block's last residual norm, with the next layer's input norm of its result in the same op (on entry to a
  // layer, xn already holds input_norm(x); run_chunk computes it for layer 0).
  auto residual_norm_then_next_input = [&](const RmsNormArgs& a) {
    if (i + 1 < tc.n_layers) {
      backend_.rms_norm_then(
          a, {.out = xn, .x = x, .weight = w_.layers[static_cast<size_t>(i) + 1].input_norm, .eps = tc.rms_eps});
    } else {
      backend_.rms_norm(a);
    }
  };

  // Attention block (spec §1.5, §1.6).
  const Tensor q = ws.q.view(act, {rows, nh, hd});
  const Tensor k = ws.k.view(act, {rows, nkv, hd});
  const Tensor v = ws.v.view(act, {rows, nkv, hd});
  // The q, k and v products of xn as one op (one GEMV launch on CUDA at decode sizes).
  LinearGroupArgs qkv{.x = xn};
  qkv.out[qkv.n] = q.reshape({rows, nh * hd});
  qkv.w[qkv.n++] = lw.attn.q_proj;
  if (ls.owns_kv) {
    qkv.out[qkv.n] = k.reshape({rows, nkv * hd});
    qkv.w[qkv.n++] = lw.attn.k_proj;
    if (!ls.k_eq_v) {
      qkv.out[qkv.n] = v.reshape({rows, nkv * hd});
      qkv.w[qkv.n++] = lw.attn.v_proj;
    }
  }
  backend_.linear_group(qkv);
  // q = RoPE(q_norm(q)) in one op (ops.h: the same bits as rms_norm then rope); in kv_norm_write below when the
  // layer writes the cache of a single sequence.
  const bool fused_qkv_norms = ls.owns_kv && batch.size() == 1;
  if (!fused_qkv_norms)
    backend_.rms_norm(
        {.out = q, .x = q, .weight = lw.attn.q_norm, .eps = tc.rms_eps, .rope_pos = pos, .rope_inv_freq = inv_freq});
  if (ls.owns_kv) {
    if (ls.k_eq_v) {
      // K=V layers: values are the raw k_proj output, copied before k_norm/RoPE (spec §1.6, item 7 of §6).
      TANDEM_TRY(backend_.copy(v.data, k.data, k.nbytes(), CopyKind::kDeviceToDevice));
    }
    if (fused_qkv_norms) {
      // q and k = RoPE(norm(.)), v = v_norm(v) and the cache write in one op (one launch on CUDA).
      const SequenceInput& in = batch[0];
      const int64_t n = static_cast<int64_t>(in.tokens.size());
      backend_.kv_norm_write({.write = {.kv = in.cache->view(i, in.cache->length() + n),
                                        .k_new = k.slice(0, n),
                                        .v_new = v.slice(0, n),
                                        .pos = pos.slice(0, n)},
                              .k_norm = lw.attn.k_norm,
                              .rope_inv_freq = inv_freq,
                              .eps = tc.rms_eps,
                              .q = q.slice(0, n),
                              .q_norm = lw.attn.q_norm});
    } else {
      backend_.rms_norm(
          {.out = k, .x = k, .weight = lw.attn.k_norm, .eps = tc.rms_eps, .rope_pos = pos, .rope_inv_freq = inv_freq});
      backend_.rms_norm({.out = v, .x = v, .weight = Tensor(), .eps = tc.rms_eps});  // weightless v_norm
      int64_t r = 0;
      for (const SequenceInput& in : batch) {
        const int64_t n = static_cast<int64_t>(in.tokens.size());
        backend_.kv_write({.kv = in.cache->view(i, in.cache->length() + n),
                           .k_new = k.slice(r, r + n),
                           .v_new = v.slice(r, r + n),
                           .pos = pos.slice(r, r + n)});
        r += n;
      }
    }
  }
  const Tensor attn = ws.attn.view(act, {rows, nh, hd});
  int64_t r = 0;
  for (const SequenceInput& in : batch) {
    const int64_t n = static_cast<int64_t>(in.tokens.size());
    // Scale 1.0: q_norm/k_norm replace 1/sqrt(d) (spec §1.6). Sliding layers: q - W < k <= q (spec §1.8).
    backend_.attention({.out = attn.slice(r, r + n), .q = q.slice(r, r + n),
                        .kv = in.cache->attention_view(i, in.cache->length() + n), .q_pos = pos.slice(r, r + n),
                        .kv_end = batch.size() == 1 ? ws.kv_end.view(DType::kI32, {1}) : Tensor(),
                        .window = ls.attn == AttnType::kSliding ? ls.window : 0, .causal = true, .scale = 1.f});
    r += n;
  }
  const Tensor o = ws.o.view(act, {rows, d});
  // x = x + norm(o): the residual add fused into the post-attention norm (ops.h; the same bits as norm then add);
  // then xn = pre_ffn_norm(x), the feed-forward block's input.
  const RmsNormArgs post_attn{.out = x, .x = o, .weight = lw.post_attn_norm, .eps = tc.rms_eps, .residual = x};
  const RmsNormArgs pre_ffn{.out = xn, .x = x, .weight = lw.pre_ffn_norm, .eps = tc.rms_eps};

  // Feed-forward block: dense GeGLU (+ MoE on 26B-A4B), spec §1.9, §1.10. The dense output goes to f.
  const Tensor f = ws.f.view(act, {rows, d});
  const Tensor g = ws.g.view(act, {rows, ls.d_ff});
  const Tensor u = ws.u.view(act, {rows, ls.d_ff});
  auto dense = [&] {
    backend_.geglu({.out = g, .x = xn, .w_gate = lw.mlp.gate, .w_up = lw.mlp.up, .up = u});
    backend_.linear({.out = f, .x = g, .w = lw.mlp.down});
  };
  RmsNormArgs tail[4];  // norms after the block, run as one rms_norm_seq
  int n_tail = 0;
  if (!ls.moe) {
    // The o product, both norms and the GeGLU MLP as one op (four launches on CUDA; one with TANDEM_FUSED_MLP=1).
    backend_.attn_out_mlp({.attn = attn.reshape({rows, nh * hd}),
                           .o_proj = lw.attn.o_proj,
                           .o = o,
                           .x = x,
                           .post_attn_norm = lw.post_attn_norm,
                           .xn = xn,
                           .pre_ffn_norm = lw.pre_ffn_norm,
                           .eps = tc.rms_eps,
                           .gate = lw.mlp.gate,
                           .up = lw.mlp.up,
                           .g = g,
                           .u = u,
                           .down = lw.mlp.down,
                           .f = f});
  } else {
    backend_.linear({.out = o, .x = attn.reshape({rows, nh * hd}), .w = lw.attn.o_proj});
    // The experts' path: the router input z (a weightless norm of the residual * router.scale * d_model^-0.5) and
    // the experts' input y2 (pre_ffn_norm_2), both norms of the updated x, in the same op as post_attn/pre_ffn.
    const Tensor z = ws.z.view(act, {rows, d});
    const Tensor y2 = ws.y2.view(act, {rows, d});
    const RmsNormArgs into_ffn[] = {post_attn,
                                    pre_ffn,
                                    {.out = z,
                                     .x = x,
                                     .weight = lw.moe.router_scale,
                                     .eps = tc.rms_eps,
                                     .out_scale = static_cast<float>(std::pow(static_cast<double>(d), -0.5))},
                                    {.out = y2, .x = x, .weight = lw.moe.pre_ffn_norm_2, .eps = tc.rms_eps}};
    backend_.rms_norm_seq(into_ffn);
    // Router (softmax/top-k/renorm of its logits) and experts into f2. They share no tensor with the dense GeGLU,
    // so on a backend with concurrent streams they run on the side stream while the dense block runs here.
    const StreamId main = backend_.current_stream();
    const bool fork = ws.side >= 0;
    if (fork) {
      TANDEM_TRY(backend_.wait_stream(ws.side, main));
      backend_.set_stream(ws.side);
    }
    const Tensor router = ws.router.view(act, {rows, tc.n_experts});
    backend_.linear({.out = router, .x = z, .w = lw.moe.router_proj});
    const Tensor idx = ws.moe_idx.view(DType::kI32, {rows, tc.top_k_experts});
    const Tensor wts = ws.moe_w.view(DType::kF32, {rows, tc.top_k_experts});
    backend_.moe_route({.idx = idx,
                        .weights = wts,
                        .logits = router,
                        .per_expert_scale = lw.moe.per_expert_scale,
                        .k = tc.top_k_experts});
    const Tensor f2 = ws.f2.view(act, {rows, d});
    backend_.moe_experts({.out = f2, .x = y2, .gate_up = lw.moe.gate_up, .down = lw.moe.down, .idx = idx,
                          .weights = wts});
    if (fork) backend_.set_stream(main);
    dense();
    if (fork) TANDEM_TRY(backend_.wait_stream(main, ws.side));
    // f = post_ffn_norm_1(f) + post_ffn_norm_2(f2).
    tail[n_tail++] = {.out = f, .x = f, .weight = lw.moe.post_ffn_norm_1, .eps = tc.rms_eps};
    tail[n_tail++] = {.out = f, .x = f2, .weight = lw.moe.post_ffn_norm_2, .eps = tc.rms_eps, .residual = f};
  }
  // x = x + norm(f), times layer_scalar here unless the per-layer-input block still follows (spec §1.5: the scalar
  // multiplies the whole output, residual included, after that block).
  const float layer_scalar = layer_scalar_[static_cast<size_t>(i)];
  const RmsNormArgs post_ffn{.out = x,
                             .x = f,
                             .weight = lw.post_ffn_norm,
                             .eps = tc.rms_eps,
                             .residual = x,
                             .out_scale = tc.ple_dim > 0 ? 1.f : layer_scalar};
  if (tc.ple_dim == 0 && n_tail == 0) {
    residual_norm_then_next_input(post_ffn);
  } else if (tc.ple_dim == 0) {
    tail[n_tail++] = post_ffn;
    if (i + 1 < tc.n_layers)
      tail[n_tail++] = {
          .out = xn, .x = x, .weight = w_.layers[static_cast<size_t>(i) + 1].input_norm, .eps = tc.rms_eps};
    backend_.rms_norm_seq(std::span<const RmsNormArgs>(tail, static_cast<size_t>(n_tail)));
  } else {
    if (n_tail > 0) backend_.rms_norm_seq(std::span<const RmsNormArgs>(tail, static_cast<size_t>(n_tail)));
    // Per-layer input: x = (x + norm(f)) then x += norm(proj(gelu(gate(x)) * ple_i)), times layer_scalar (spec
    // §1.4), and the next layer's input norm, in one op.
    const int64_t P = tc.ple_dim;
    // Layer i's inputs: columns [i*P, (i+1)*P) of the [rows, n_layers * P] per-layer inputs (row-strided).
    Tensor pl = ws.ple.view(act, {rows, tc.n_layers * P});
    pl.shape[1] = P;
    pl.data = static_cast<char*>(pl.data) + static_cast<size_t>(i * P) * dtype_size(act);
    const bool has_next = i + 1 < tc.n_layers;
    backend_.per_layer_input({.x = x,
                              .f = f,
                              .post_ffn_norm = lw.post_ffn_norm,
                              .gate = lw.ple.gate,
                              .ple = pl,
                              .proj = lw.ple.proj,
                              .post_norm = lw.ple.post_norm,
                              .layer_scalar = layer_scalar,
                              .eps = tc.rms_eps,
                              .gate_out = ws.ple_tmp.view(act, {rows, P}),
                              .proj_out = o,
                              .next_out = has_next ? xn : Tensor(),
                              .next_norm = has_next ? w_.layers[static_cast<size_t>(i) + 1].input_norm : Tensor(),
                              .next_gate = has_next ? w_.layers[static_cast<size_t>(i) + 1].ple.gate : Tensor(),
                              .next_proj = has_next ? w_.layers[static_cast<size_t>(i) + 1].ple.proj : Tensor()});
  }
  return ok_status();
}

}  // namespace tandem
