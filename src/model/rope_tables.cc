// RoPE tables on the backend (see rope_tables.h).
#include "model/rope_tables.h"

#include <vector>

namespace tandem {
namespace {
Status upload_one(Backend& backend, const RopeSpec& rope, int head_dim, Buffer* out) {
  const std::vector<float> f = rope.inv_freq(head_dim);
  TANDEM_ASSIGN_OR_RETURN(*out, backend.alloc(f.size() * sizeof(float)));
  return backend.copy(out->data(), f.data(), f.size() * sizeof(float), CopyKind::kHostToDevice);
}
}  // namespace

Status RopeTables::upload(Backend& backend, const TextConfig& cfg) {
  TANDEM_TRY(upload_one(backend, cfg.rope_sliding, cfg.head_dim, &sliding_));
  TANDEM_TRY(upload_one(backend, cfg.rope_full, cfg.global_head_dim, &full_));
  return backend.synchronize();
}

Tensor RopeTables::for_layer(AttnType attn, int head_dim) const {
  return (attn == AttnType::kSliding ? sliding_ : full_).view(DType::kF32, {head_dim / 2});
}

}  // namespace tandem
