// The Gemma 4 assistant (MTP drafter): a 4-layer Q-only decoder that attends over the TARGET's KV cache.
// One step consumes the last token t (embedded with the target's scaled table) and a backbone-width hidden g,
// returns the next-step hidden (post_projection) and a proposal from its LM head: tied/untied dense, or the
// centroid-routed masked embedder of E2B/E4B (spec §4.2-§4.7). The round loop lives in spec/.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "kv/kv_cache.h"
#include "model/gemma4.h"
#include "model/rope_tables.h"

namespace tandem {

enum class DraftHeadKind : uint8_t { kTiedDense, kUntiedDense, kCentroid };
const char* draft_head_name(DraftHeadKind k);

// The attention window (in the AttentionArgs sense: keys k > q_pos - window) that makes a drafter query at
// Pq = P see exactly the newest W+1 keys of the target's sliding K/V [0, P): HF's inclusive bidirectional window
// |q - k| <= W, flipped to look back from the newest key (spec §4.6).
constexpr int64_t drafter_sliding_window(int64_t W) { return W + 2; }

struct DraftStepArgs {
  const KvCache* cache = nullptr;  // the target's cache; positions [0, kv_end) are read
  int64_t kv_end = 0;              // P: the target K/V the drafter sees are positions [0, P) (clean mode)
  int64_t q_pos = 0;               // Pq: the query position, constant within a round (= P, spec §4.5)
  int32_t token = 0;               // last token (bonus token, or the previous draft)
  const Tensor* g_in = nullptr;    // [1, backbone] target hidden for the first step; nullptr = previous g_out
  bool full_logits = false;        // also materialise full-vocab logits (sampling); greedy never needs them
};

struct DraftStepResult {
  int32_t argmax = 0;  // greedy proposal (HF argmax: lowest token id among ties)
  Tensor logits;       // [1, n_vocab] device, act dtype; only when full_logits (centroid head: fill = min - 1)
  Tensor g_out;        // [1, backbone] next step's hidden (valid until the next step)
};

class Gemma4Assistant {
 public:
  // Loads an assistant checkpoint and checks it against `target` (backbone width, vocabulary, head dims, KV
  // heads and window per attention type); a mismatch is a clear error naming both checkpoints' values.
  static Result<std::unique_ptr<Gemma4Assistant>> load(const std::string& dir, Gemma4Model& target,
                                                       const LoadOptions& opts = {});
  static Result<std::unique_ptr<Gemma4Assistant>> load_from(ModelConfig cfg, WeightStore store, const std::string& name,
                                                            Gemma4Model& target, const LoadOptions& opts = {});
  ~Gemma4Assistant();

  [[nodiscard]] const ModelConfig& config() const { return cfg_; }
  [[nodiscard]] DraftHeadKind head_kind() const { return head_; }

  // One drafter step (spec §4.2).
  Status step(const DraftStepArgs& a, DraftStepResult* out);

 private:
  struct Workspace;
  explicit Gemma4Assistant(Gemma4Model& target);
  Status check_compatible(const std::string& dir) const;
  // The masked embedder's head on the device (part of the captured step): cluster logits, candidates, their
  // logits and the argmax by token id into ws.amax.
  void centroid_head_ops(const Tensor& zf);
  // Sampled drafts: the candidates' logits scattered over the vocabulary (on the host) into out->logits.
  Status centroid_full_logits(DraftStepResult* out);
  Status run_step(const DraftStepArgs& a);  // the device work of step() after its inputs are uploaded
  void drop_graphs();

  Gemma4Model& target_;
  Backend& backend_;
  ModelConfig cfg_;
  WeightStore store_;
  AssistantWeights w_;
  DraftHeadKind head_ = DraftHeadKind::kTiedDense;
  std::vector<float> layer_scalar_;
  std::vector<int32_t> token_ordering_;  // host copy [n_vocab]: row r of the [C, V/C] view = cluster r's tokens
  RopeTables rope_;
  std::unique_ptr<Workspace> ws_;
  // CUDA graphs of run_step, one per target cache (graphs on or off with the target's, Gemma4Model::set_graphs).
  std::map<uint64_t, Backend::GraphId> graphs_;
  std::set<uint64_t> seen_;
  bool graphs_failed_ = false;
};

}  // namespace tandem
