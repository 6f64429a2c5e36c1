// libFuzzer target: parse_model_config on arbitrary text. A malformed config.json must produce a Status, and an
// accepted one must resolve into a self-consistent per-layer table (spec §1.6-§1.10).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/log.h"
#include "model/gemma4_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tandem::set_log_level(tandem::LogLevel::kOff);
  auto r = tandem::parse_model_config(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz/config.json");
  if (!r.ok()) return 0;
  const tandem::TextConfig& t = r->text;
  if (static_cast<int>(t.layers.size()) != t.n_layers) __builtin_trap();
  for (const tandem::LayerSpec& l : t.layers) {
    if (l.n_kv_heads <= 0 || t.n_heads % l.n_kv_heads != 0 || l.head_dim <= 0 || l.d_ff <= 0) __builtin_trap();
    if (l.owns_kv && l.kv_source != l.index) __builtin_trap();
    if (!l.owns_kv && !r->is_assistant() && (l.kv_source < 0 || l.kv_source >= l.index)) __builtin_trap();
  }
  // Small head dims only: the frequency tables are sized by the (fuzzed) head dim.
  if (t.head_dim <= 4096 && t.global_head_dim <= 4096) {
    (void)t.rope_sliding.inv_freq(t.head_dim);
    (void)t.rope_full.inv_freq(t.global_head_dim);
  }
  return 0;
}
