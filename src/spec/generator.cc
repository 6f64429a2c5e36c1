// The generation loop: plain decoding and the speculative round of spec §5.6 (see generator.h).
#include "spec/generator.h"

#include <algorithm>
#include <chrono>

#include "core/strings.h"
#include "sample/rejection.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Rows [r0, r1) of a device tensor [rows, n] as host floats.
Status rows_to_host(Backend& be, const Tensor& t, int64_t r0, int64_t r1, std::vector<float>* out) {
  const int64_t n = t.shape[1];
  const size_t bytes = static_cast<size_t>((r1 - r0) * n) * dtype_size(t.dtype);
  std::vector<uint8_t> raw(bytes);
  TANDEM_TRY(be.copy(raw.data(), t.slice(r0, r1).data, bytes, CopyKind::kDeviceToHost));
  TANDEM_TRY(be.synchronize());
  out->resize(static_cast<size_t>((r1 - r0) * n));
  for (size_t i = 0; i < out->size(); ++i) (*out)[i] = load_as_f32(raw.data(), t.dtype, static_cast<int64_t>(i));
  return ok_status();
}

}  // namespace

double GenerationStats::mean_accepted() const {
  int64_t acc = 0;
  for (int64_t a : accepted_at) acc += a;
  return rounds ? static_cast<double>(acc) / static_cast<double>(rounds) : 0.0;
}
double GenerationStats::tokens_per_pass() const {
  return target_passes ? static_cast<double>(generated_tokens - 1) / static_cast<double>(target_passes) : 0.0;
}
double GenerationStats::decode_tokens_per_second() const {
  double t = total_seconds - prefill_seconds;
  return t > 0 ? static_cast<double>(generated_tokens) / t : 0.0;
}

const char* stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::kMaxTokens: return "max_tokens";
    case StopReason::kStopToken: return "stop_token";
    case StopReason::kCancelled: return "cancelled";
  }
  return "?";
}

Result<GenerationResult> Generator::generate(std::span<const int32_t> prompt, const GenerateOptions& opts,
                                             const TokenCallback& on_tokens) {
  TANDEM_TRY(opts.sampling.validate());
  if (prompt.empty()) return invalid_argument("the prompt is empty");
  if (opts.max_new_tokens < 0) return invalid_argument("max_new_tokens must be >= 0");
  if (opts.draft_tokens < 0 || opts.max_draft_tokens < 1 || opts.draft_tokens > 64 || opts.max_draft_tokens > 64)
    return invalid_argument("draft tokens must be between 0 and 64");
  Backend& be = target_.backend();
  const bool speculate = drafter_ != nullptr && (opts.draft_mode != DraftMode::kFixed || opts.draft_tokens > 0);
  const int max_k = !speculate ? 0 : opts.draft_mode == DraftMode::kFixed ? opts.draft_tokens : opts.max_draft_tokens;
  const int64_t L = static_cast<int64_t>(prompt.size());
  int64_t context = opts.context > 0 ? opts.context : L + opts.max_new_tokens + max_k + 1;
  const int max_pos = target_.text().max_position;
  if (max_pos > 0 && L + 1 > max_pos)
    return out_of_range(strfmt("the prompt has %lld tokens; the model's context is %d", static_cast<long long>(L), max_pos));
  if (max_pos > 0) context = std::min<int64_t>(context, max_pos);
  if (L + 1 > context)
    return out_of_range(strfmt("the prompt has %lld tokens but the context is %lld", static_cast<long long>(L),
                               static_cast<long long>(context)));
  TANDEM_ASSIGN_OR_RETURN(KvCache cache, target_.new_cache({.max_positions = context,
                                                             .max_tokens_per_forward = std::max(256, max_k + 1)}));
  std::unique_ptr<DraftPolicy> policy =
      opts.draft_mode == DraftMode::kAuto        ? make_cost_model_policy(max_k)
      : opts.draft_mode == DraftMode::kHeuristic ? make_heuristic_policy(opts.draft_tokens, max_k)
                                                 : make_fixed_policy(max_k);
  Rng target_rng(opts.sampling.seed), draft_rng(opts.sampling.seed ^ 0x5eed5eed5eedull);
  GenerationResult res;
  GenerationStats& st = res.stats;
  st.prompt_tokens = L;
  st.proposed_at.assign(static_cast<size_t>(max_k), 0);
  st.accepted_at.assign(static_cast<size_t>(max_k), 0);
  const auto t_start = Clock::now();
  std::vector<float> rows, probs;
  std::vector<std::vector<float>> q_probs;
  bool done = opts.max_new_tokens == 0;
  // Greedy: the argmax of every logits row is taken on the device; only the token ids come back.
  TANDEM_ASSIGN_OR_RETURN(Buffer amax_dev, be.alloc(static_cast<size_t>(max_k + 1) * sizeof(int32_t)));
  std::vector<int32_t> amax(static_cast<size_t>(max_k + 1));
  auto device_argmax = [&](const ForwardOutputs& out, int64_t n_rows) -> Status {
    be.argmax({.out = amax_dev.view(DType::kI32, {n_rows}), .x = out.logits.slice(0, n_rows)});
    TANDEM_TRY(be.copy(amax.data(), amax_dev.data(), static_cast<size_t>(n_rows) * sizeof(int32_t),
                       CopyKind::kDeviceToHost));
    return be.synchronize();
  };

  // Picks the target's token from logits row r of `out` (argmax or a draw from the processed distribution).
  auto select = [&](const ForwardOutputs& out, int64_t r, int32_t* tok) -> Status {
    if (opts.sampling.greedy()) {
      TANDEM_TRY(device_argmax(out, r + 1));
      *tok = amax[static_cast<size_t>(r)];
    } else {
      TANDEM_TRY(rows_to_host(be, out.logits, r, r + 1, &rows));
      processed_probs(rows, opts.sampling, &probs);
      *tok = sample(probs, target_rng);
    }
    return ok_status();
  };
  // Commits emitted tokens, honouring stop ids and the budget. Returns true when generation is over.
  auto emit = [&](std::span<const int32_t> toks) {
    size_t n = 0;
    bool stop = false;
    for (int32_t t : toks) {
      res.tokens.push_back(t);
      ++n;
      if (std::find(opts.stop_ids.begin(), opts.stop_ids.end(), t) != opts.stop_ids.end()) {
        res.stop = StopReason::kStopToken, stop = true;
        break;
      }
      if (static_cast<int>(res.tokens.size()) >= opts.max_new_tokens) {
        res.stop = StopReason::kMaxTokens, stop = true;
        break;
      }
    }
    if (on_tokens && n > 0 && !on_tokens(toks.first(n)) && !stop) res.stop = StopReason::kCancelled, stop = true;
    return stop;
  };

  // Prefill: b = token at position L, g = post-norm hidden of position L-1.
  ForwardOutputs out;
  SequenceInput in{.cache = &cache, .tokens = prompt, .n_outputs = 1};
  TANDEM_TRY(target_.forward(std::span(&in, 1), &out));
  int32_t b = 0;
  if (!done) {
    TANDEM_TRY(select(out, 0, &b));
    done = emit(std::span(&b, 1));
  }
  Tensor g = out.hidden.slice(0, 1);
  int64_t P = L;
  st.prefill_seconds = since(t_start);

  std::vector<int32_t> block, emitted;
  while (!done) {
    const int64_t budget = opts.max_new_tokens - static_cast<int64_t>(res.tokens.size());
    int k = speculate ? policy->next_k() : 0;
    k = static_cast<int>(std::clamp<int64_t>(std::min<int64_t>(k, budget - 1), 0, context - P - 1));
    // Draft K tokens at the constant query position P over the target K/V [0, P).
    block.assign(1, b);
    const auto t_draft = Clock::now();
    q_probs.resize(static_cast<size_t>(k));
    int32_t t = b;
    for (int i = 0; i < k; ++i) {
      DraftStepResult ds;
      const bool sampled = opts.sample_drafts && !opts.sampling.greedy();
      TANDEM_TRY(drafter_->step({.cache = &cache, .kv_end = P, .q_pos = P, .token = t, .g_in = i == 0 ? &g : nullptr,
                                 .full_logits = sampled},
                                &ds));
      t = ds.argmax;
      if (sampled) {
        TANDEM_TRY(rows_to_host(be, ds.logits, 0, 1, &rows));
        processed_probs(rows, opts.sampling, &q_probs[static_cast<size_t>(i)]);
        t = sample(q_probs[static_cast<size_t>(i)], draft_rng);
      } else {
        q_probs[static_cast<size_t>(i)].clear();  // point mass at the argmax
      }
      block.push_back(t);
    }
    const double draft_s = since(t_draft);
    // Verify [b, d1..dK] at positions P..P+K in one target pass.
    const auto t_verify = Clock::now();
    in = {.cache = &cache, .tokens = block, .n_outputs = k + 1};
    TANDEM_TRY(target_.forward(std::span(&in, 1), &out));
    ++st.target_passes;
    int n = 0;
    int32_t next = 0;
    if (opts.sampling.greedy()) {
      TANDEM_TRY(device_argmax(out, k + 1));
      for (; n <= k; ++n) {
        next = amax[static_cast<size_t>(n)];
        if (n == k || next != block[static_cast<size_t>(n) + 1]) break;
      }
    } else {
      for (; n <= k; ++n) {
        TANDEM_TRY(rows_to_host(be, out.logits, n, n + 1, &rows));
        processed_probs(rows, opts.sampling, &probs);
        if (n == k) {  // every draft accepted: the bonus comes from the last row
          next = sample(probs, target_rng);
          break;
        }
        Verdict v = verify_draft(probs, q_probs[static_cast<size_t>(n)], block[static_cast<size_t>(n) + 1], target_rng);
        if (!v.accepted) {
          next = v.token;
          break;
        }
      }
    }
    const double verify_s = since(t_verify);
    // Accept d1..dn plus the target's own token; roll the cache back to positions [0, P+n].
    emitted.assign(block.begin() + 1, block.begin() + 1 + n);
    emitted.push_back(next);
    TANDEM_TRY(cache.truncate(P + n + 1));
    g = out.hidden.slice(n, n + 1);
    if (k > 0) {
      res.rounds.push_back({.position = P, .draft = {block.begin() + 1, block.end()}, .accepted = n});
      ++st.rounds;
      for (int j = 0; j < k; ++j) {
        ++st.proposed_at[static_cast<size_t>(j)];
        if (j < n) ++st.accepted_at[static_cast<size_t>(j)];
      }
    }
    st.draft_seconds += draft_s;
    st.verify_seconds += verify_s;
    policy->observe({.k = k, .accepted = n, .draft_seconds = draft_s, .verify_seconds = verify_s});
    b = next;
    P += n + 1;
    done = emit(emitted);
  }
  st.generated_tokens = static_cast<int64_t>(res.tokens.size());
  st.total_seconds = since(t_start);
  return res;
}

}  // namespace tandem
