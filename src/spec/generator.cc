// The generation loop: plain decoding and the speculative round of spec §5.6 (see generator.h).
#include "spec/generator.h"

#include <algorithm>
#include <chrono>

#include "core/strings.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

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
  if (opts.prefill_chunk < 1 || opts.prefill_chunk > kMaxPrefillChunk)
    return invalid_argument(
        strfmt("the prefill chunk must be 1..%d tokens (got %d)", kMaxPrefillChunk, opts.prefill_chunk));
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
  TANDEM_ASSIGN_OR_RETURN(
      KvCache cache,
      target_.new_cache({.max_positions = context, .max_tokens_per_forward = std::max(opts.prefill_chunk, max_k + 1)}));
  std::unique_ptr<DraftPolicy> policy = opts.draft_mode == DraftMode::kAuto ? make_cost_model_policy(max_k)
                                        : opts.draft_mode == DraftMode::kHeuristic
                                            ? make_heuristic_policy(opts.draft_tokens, max_k)
                                            : make_fixed_policy(max_k);
  GenerationResult res;
  GenerationStats& st = res.stats;
  st.prompt_tokens = L;
  st.proposed_at.assign(static_cast<size_t>(max_k), 0);
  st.accepted_at.assign(static_cast<size_t>(max_k), 0);
  const auto t_start = Clock::now();
  bool done = opts.max_new_tokens == 0;
  // Token choice stays on the device: the argmax (greedy) or a draw from the processed distribution (sampling) of
  // each logits row, and with sampled drafts the rejection rule too; only token ids and verdicts come back.
  const bool greedy = opts.sampling.greedy();
  const bool sampled_drafts = opts.sample_drafts && !greedy && max_k > 0;
  const int64_t V = target_.text().n_vocab;
  const uint64_t target_seed = opts.sampling.seed, draft_seed = opts.sampling.seed ^ 0x5eed5eed5eedull;
  uint64_t target_counter = 0, draft_counter = 0;  // uniforms used so far (uniform_at(seed, counter))
  TANDEM_ASSIGN_OR_RETURN(Buffer ids_dev, be.alloc(static_cast<size_t>(max_k + 1) * sizeof(int32_t)));
  Buffer drafts_dev, verdicts_dev, p_dev, q_dev;  // sampled drafts only
  if (sampled_drafts) {
    const size_t k = static_cast<size_t>(max_k);
    TANDEM_ASSIGN_OR_RETURN(drafts_dev, be.alloc(k * sizeof(int32_t)));
    TANDEM_ASSIGN_OR_RETURN(verdicts_dev, be.alloc(2 * k * sizeof(int32_t)));
    TANDEM_ASSIGN_OR_RETURN(p_dev, be.alloc((k + 1) * static_cast<size_t>(V) * sizeof(float)));
    TANDEM_ASSIGN_OR_RETURN(q_dev, be.alloc(k * static_cast<size_t>(V) * sizeof(float)));
  }
  std::vector<int32_t> ids(static_cast<size_t>(max_k + 1)), verdicts(static_cast<size_t>(2 * max_k));
  auto to_host = [&](std::span<int32_t> dst, const Buffer& src, size_t offset = 0) {
    return be.copy(dst.data(), static_cast<const uint8_t*>(src.data()) + offset, dst.size_bytes(),
                   CopyKind::kDeviceToHost);
  };
  const SamplingParams& sp = opts.sampling;
  auto draw = [&](const Tensor& out, const Tensor& logits, const Tensor& probs, uint64_t seed, uint64_t* counter) {
    be.sample({.out = out,
               .x = logits,
               .probs = probs,
               .temperature = sp.temperature,
               .top_k = sp.top_k,
               .top_p = sp.top_p,
               .min_p = sp.min_p,
               .seed = seed,
               .counter = *counter});
    *counter += static_cast<uint64_t>(logits.rows());
  };
  // Enqueues the target's tokens for the first n_rows logits rows of `out` into ids_dev (argmax, or draws with
  // their distributions kept in p_dev when keep_probs); fetch_ids() copies them to ids[0, n_rows).
  auto choose = [&](const ForwardOutputs& out, int64_t n_rows, bool keep_probs) {
    const Tensor dst = ids_dev.view(DType::kI32, {n_rows});
    const Tensor logits = out.logits.slice(0, n_rows);
    if (greedy) {
      be.argmax({.out = dst, .x = logits});
    } else {
      draw(dst, logits, keep_probs ? p_dev.view(DType::kF32, {n_rows, V}) : Tensor(), target_seed, &target_counter);
    }
  };
  auto fetch_ids = [&](int64_t n_rows) { return to_host(std::span(ids).first(static_cast<size_t>(n_rows)), ids_dev); };

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
    choose(out, 1, false);
    TANDEM_TRY(fetch_ids(1));
    TANDEM_TRY(be.synchronize());
    b = ids[0];
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
    int32_t t = b;
    for (int i = 0; i < k; ++i) {
      DraftStepResult ds;
      TANDEM_TRY(drafter_->step({.cache = &cache,
                                 .kv_end = P,
                                 .q_pos = P,
                                 .token = t,
                                 .g_in = i == 0 ? &g : nullptr,
                                 .full_logits = sampled_drafts},
                                &ds));
      t = ds.argmax;
      if (sampled_drafts) {  // drawn from the drafter's processed distribution q, kept on the device
        const Tensor d = drafts_dev.view(DType::kI32, {1}, static_cast<size_t>(i) * sizeof(int32_t));
        draw(d, ds.logits, q_dev.view(DType::kF32, {1, V}, static_cast<size_t>(i * V) * sizeof(float)), draft_seed,
             &draft_counter);
        TANDEM_TRY(to_host(std::span(&t, 1), drafts_dev, static_cast<size_t>(i) * sizeof(int32_t)));
        TANDEM_TRY(be.synchronize());
      }
      block.push_back(t);
    }
    const double draft_s = since(t_draft);
    // Verify [b, d1..dK] at positions P..P+K in one target pass.
    const auto t_verify = Clock::now();
    in = {.cache = &cache, .tokens = block, .n_outputs = k + 1};
    TANDEM_TRY(target_.forward(std::span(&in, 1), &out));
    ++st.target_passes;
    // Greedy or argmax drafts: draft n+1 stands iff the target's own token at row n equals it (for a point-mass
    // proposal, "draw s ~ p, accept iff s == d" is the rejection rule, and s is the recovered token). Sampled
    // drafts: the rejection rule on the device, the bonus token from row k.
    choose(out, k + 1, sampled_drafts);
    int n = 0;
    int32_t next = 0;
    if (sampled_drafts && k > 0) {
      const auto i32 = [](const Buffer& b, int64_t count, int64_t at = 0) {
        return b.view(DType::kI32, {count}, static_cast<size_t>(at) * sizeof(int32_t));
      };
      be.reject_drafts({.accepted = i32(verdicts_dev, k),
                        .token = i32(verdicts_dev, k, k),
                        .p = p_dev.view(DType::kF32, {k, V}),
                        .q = q_dev.view(DType::kF32, {k, V}),
                        .draft = i32(drafts_dev, k),
                        .seed = target_seed,
                        .counter = target_counter});
      target_counter += 2 * static_cast<uint64_t>(k);
      TANDEM_TRY(to_host(std::span(verdicts).first(static_cast<size_t>(2 * k)), verdicts_dev));
      TANDEM_TRY(fetch_ids(k + 1));
      TANDEM_TRY(be.synchronize());
      while (n < k && verdicts[static_cast<size_t>(n)] == 1) ++n;
      next = n < k ? verdicts[static_cast<size_t>(k + n)] : ids[static_cast<size_t>(k)];
    } else {
      TANDEM_TRY(fetch_ids(k + 1));
      TANDEM_TRY(be.synchronize());
      for (; n <= k; ++n) {
        next = ids[static_cast<size_t>(n)];
        if (n == k || next != block[static_cast<size_t>(n) + 1]) break;
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
