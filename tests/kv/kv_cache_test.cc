// KvCache's byte accounting: the storage per position of context (full layers that own their KV) and the K/V bytes
// one decode token reads, on a hand-built layer list with sliding, full and KV-shared layers, summed here layer by
// layer.
#include "kv/kv_cache.h"

#include <gtest/gtest.h>

#include <vector>

namespace tandem {
namespace {

// Two sliding layers (window 512, 2 heads x 256), a full one (2 x 512), a KV-shared sliding layer reading layer 0
// and a KV-shared full layer reading layer 2.
std::vector<KvLayerSpec> layers() {
  return {{.owns_kv = true, .source = 0, .n_kv_heads = 2, .head_dim = 256, .window = 512},
          {.owns_kv = true, .source = 1, .n_kv_heads = 2, .head_dim = 256, .window = 512},
          {.owns_kv = true, .source = 2, .n_kv_heads = 2, .head_dim = 512, .window = 0},
          {.owns_kv = false, .source = 0, .n_kv_heads = 2, .head_dim = 256, .window = 512},
          {.owns_kv = false, .source = 2, .n_kv_heads = 2, .head_dim = 512, .window = 0}};
}

TEST(KvBytes, PerPositionCountsOnlyFullLayersThatOwnTheirKv) {
  // K and V of the one full layer that owns storage: 2 x 2 heads x 512 x 2 bytes.
  EXPECT_EQ(KvCache::bytes_per_position(layers(), DType::kBF16), 2u * 2 * 512 * 2);
  EXPECT_EQ(KvCache::bytes_per_position(layers(), DType::kF32), 2u * 2 * 512 * 4);
}

TEST(KvBytes, ReadPerTokenTakesEachLayersVisibleKeys) {
  const size_t sliding_row = 2 * 2 * 256 * 2, full_row = 2 * 2 * 512 * 2;  // K + V bytes per position, bf16
  // 100 positions: every layer sees all of them.
  EXPECT_EQ(KvCache::bytes_read_per_token(layers(), DType::kBF16, 100), 3 * sliding_row * 100 + 2 * full_row * 100);
  // 4096 positions: the sliding layers (shared one included) see their window of 512.
  EXPECT_EQ(KvCache::bytes_read_per_token(layers(), DType::kBF16, 4096), 3 * sliding_row * 512 + 2 * full_row * 4096);
  EXPECT_EQ(KvCache::bytes_read_per_token(layers(), DType::kBF16, 512), 3 * sliding_row * 512 + 2 * full_row * 512);
  EXPECT_EQ(KvCache::bytes_read_per_token(layers(), DType::kBF16, 0), 0u);
  EXPECT_EQ(KvCache::bytes_read_per_token({}, DType::kBF16, 4096), 0u);
}

}  // namespace
}  // namespace tandem
