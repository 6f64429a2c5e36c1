// The RoPE inverse-frequency tables of a model, one per attention type, resident on the backend (spec §1.7).
// The target and the drafter each hold one; a layer picks its table by type.
#pragma once

#include "backend/backend.h"
#include "model/gemma4_config.h"

namespace tandem {

class RopeTables {
 public:
  // Computes the sliding (head_dim) and full (global_head_dim) tables of `cfg` and copies them to `backend`.
  Status upload(Backend& backend, const TextConfig& cfg);
  // f32 [head_dim / 2] for a layer of type `attn` with head size `head_dim`.
  [[nodiscard]] Tensor for_layer(AttnType attn, int head_dim) const;

 private:
  Buffer sliding_, full_;
};

}  // namespace tandem
