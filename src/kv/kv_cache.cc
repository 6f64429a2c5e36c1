// KV cache storage, views and rollback (see kv_cache.h; spec §1.8, §4.6, §5.6).
#include "kv/kv_cache.h"

#include <algorithm>
#include <atomic>

#include "core/strings.h"

namespace tandem {
namespace {

// K and V bytes of one position of one layer.
size_t kv_row_bytes(const KvLayerSpec& ls, DType dtype) {
  return 2 * static_cast<size_t>(ls.n_kv_heads) * static_cast<size_t>(ls.head_dim) * dtype_size(dtype);
}

}  // namespace

Result<KvCache> KvCache::create(std::vector<KvLayerSpec> layers, Backend& backend, const KvCacheOptions& opts) {
  if (opts.max_positions <= 0 || opts.max_tokens_per_forward <= 0)
    return invalid_argument("KV cache sizes must be positive");
  static std::atomic<uint64_t> next_storage_id{1};
  KvCache c;
  c.storage_id_ = next_storage_id.fetch_add(1);
  c.opts_ = opts;
  c.dtype_ = backend.activation_dtype();
  c.layers_.resize(layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    const KvLayerSpec& ls = layers[i];
    if (ls.source < 0 || static_cast<size_t>(ls.source) >= layers.size() || !layers[ls.source].owns_kv)
      return internal_error(strfmt("layer %zu reads KV of layer %d, which owns none", i, ls.source));
    if (!ls.owns_kv) continue;
    LayerStore& s = c.layers_[i];
    s.n_kv_heads = ls.n_kv_heads;
    s.head_dim = ls.head_dim;
    if (ls.window > 0) {
      // Target queries need W-1 older keys, the drafter W+1 (spec §4.6), and a forward of T tokens overwrites
      // T slots: W + 1 + T slots keep everything any later query or drafter step can read.
      s.capacity = std::min<int64_t>(opts.max_positions, ls.window + 1 + opts.max_tokens_per_forward);
      s.ring = s.capacity < opts.max_positions;
    } else {
      s.capacity = opts.max_positions;
    }
    size_t bytes = static_cast<size_t>(s.n_kv_heads) * static_cast<size_t>(s.capacity) *
                   static_cast<size_t>(s.head_dim) * dtype_size(c.dtype_);
    TANDEM_ASSIGN_OR_RETURN(s.k, backend.alloc(bytes));
    TANDEM_ASSIGN_OR_RETURN(s.v, backend.alloc(bytes));
    TANDEM_TRY(backend.memset_zero(s.k.data(), bytes));
    TANDEM_TRY(backend.memset_zero(s.v.data(), bytes));
    c.bytes_ += 2 * bytes;
  }
  c.specs_ = std::move(layers);
  return c;
}

KvView KvCache::view(int layer, int64_t end) const {
  const LayerStore& s = layers_.at(static_cast<size_t>(layer));
  TANDEM_CHECK_MSG(s.capacity > 0, "layer %d owns no KV storage", layer);
  KvView v;
  v.k = s.k.view(dtype_, {s.n_kv_heads, s.capacity, s.head_dim});
  v.v = s.v.view(dtype_, {s.n_kv_heads, s.capacity, s.head_dim});
  v.ring = s.ring;
  v.end = end;
  v.begin = s.ring ? std::max<int64_t>(0, end - s.capacity) : 0;
  return v;
}

KvView KvCache::attention_view(int layer, int64_t end) const {
  return view(specs_.at(static_cast<size_t>(layer)).source, end);
}

void KvCache::commit(int64_t new_length) {
  TANDEM_CHECK_MSG(new_length >= length_ && new_length <= opts_.max_positions, "commit %lld (length %lld)",
                   static_cast<long long>(new_length), static_cast<long long>(length_));
  length_ = new_length;
}

Status KvCache::truncate(int64_t new_length) {
  if (new_length < 0 || new_length > length_)
    return invalid_argument(strfmt("cannot truncate KV cache of length %lld to %lld", static_cast<long long>(length_),
                                   static_cast<long long>(new_length)));
  length_ = new_length;
  return ok_status();
}

size_t KvCache::bytes_per_position(const std::vector<KvLayerSpec>& layers, DType dtype) {
  size_t n = 0;
  for (const KvLayerSpec& ls : layers)
    if (ls.owns_kv && ls.window == 0) n += kv_row_bytes(ls, dtype);
  return n;
}

size_t KvCache::bytes_read_per_token(const std::vector<KvLayerSpec>& layers, DType dtype, int64_t context) {
  if (context <= 0) return 0;
  size_t n = 0;
  for (const KvLayerSpec& ls : layers) {
    const int64_t keys = ls.window > 0 ? std::min<int64_t>(context, ls.window) : context;
    n += kv_row_bytes(ls, dtype) * static_cast<size_t>(keys);
  }
  return n;
}

}  // namespace tandem
