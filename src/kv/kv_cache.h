// KV cache of one sequence, owned by the runtime (not the model) because the drafter reads the target's cache.
// Full-attention layers keep every position; sliding layers keep a ring of W + 1 + max_tokens_per_forward
// positions, enough for the target's window, the drafter's W+1 keys (spec §4.6) and a rollback of any
// rejected verify block; KV-shared layers own nothing and read their source layer (spec §1.8).
// Keys are stored after k_norm + RoPE, values after v_norm. Layout per layer: [n_kv_heads, capacity, head_dim].
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace tandem {

// What the cache needs to know about one layer (the model derives these from its LayerSpecs).
struct KvLayerSpec {
  bool owns_kv = true;  // false: KV-shared layer, reads `source`
  int source = 0;       // layer whose storage this layer attends with (itself when owns_kv)
  int n_kv_heads = 0;
  int head_dim = 0;
  int window = 0;       // sliding window W; 0 = full attention (keeps every position)
};

struct KvCacheOptions {
  int64_t max_positions = 4096;        // context length the full layers can hold
  int64_t max_tokens_per_forward = 256; // largest forward (prefill chunk / verify block) the ring must absorb
};

class KvCache {
 public:
  // Allocates storage on `backend` for every KV-owning layer in the backend's activation dtype.
  static Result<KvCache> create(std::vector<KvLayerSpec> layers, Backend& backend, const KvCacheOptions& opts);

  KvCache() = default;
  KvCache(KvCache&&) noexcept = default;
  KvCache& operator=(KvCache&&) noexcept = default;

  // Positions [0, length()) are committed.
  [[nodiscard]] int64_t length() const { return length_; }
  [[nodiscard]] int64_t max_positions() const { return opts_.max_positions; }
  [[nodiscard]] int64_t max_tokens_per_forward() const { return opts_.max_tokens_per_forward; }
  // Identifies this cache's storage (unique per create(); kept by moves): keys of graphs captured over it.
  [[nodiscard]] uint64_t storage_id() const { return storage_id_; }

  // View of layer `layer`'s own storage (the layer must own KV) covering positions [begin, end), where end is
  // `end` and begin is the oldest position still stored.
  [[nodiscard]] KvView view(int layer, int64_t end) const;
  // The view a layer attends with: its KV source layer's storage.
  [[nodiscard]] KvView attention_view(int layer, int64_t end) const;

  // Marks positions [length(), new_length) as written (after a forward wrote them).
  void commit(int64_t new_length);
  // Rolls back to `new_length` <= length() (rejected drafts). Always possible for the last
  // max_tokens_per_forward positions; positions older than that are never dropped by rollback.
  Status truncate(int64_t new_length);
  void clear() { length_ = 0; }

  // Bytes of KV storage allocated in total, and per position of context (full layers only grow with context).
  [[nodiscard]] size_t bytes_allocated() const { return bytes_; }
  [[nodiscard]] static size_t bytes_per_position(const std::vector<KvLayerSpec>& layers, DType dtype);
  // Bytes of K and V one decode token's attention reads after `context` positions: every layer, KV-shared ones too
  // (they read their source's storage), reads min(context, window) positions (all `context` for a full layer).
  [[nodiscard]] static size_t bytes_read_per_token(const std::vector<KvLayerSpec>& layers, DType dtype,
                                                   int64_t context);

 private:
  struct LayerStore {
    Buffer k, v;
    int64_t capacity = 0;
    bool ring = false;
    int n_kv_heads = 0, head_dim = 0;
  };
  std::vector<KvLayerSpec> specs_;
  KvCacheOptions opts_;
  DType dtype_ = DType::kF32;
  std::vector<LayerStore> layers_;  // indexed by layer; empty stores for KV-shared layers
  int64_t length_ = 0;
  size_t bytes_ = 0;
  uint64_t storage_id_ = 0;
};

}  // namespace tandem
