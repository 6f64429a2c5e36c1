// Synthetic checkpoints: the real shapes of the released Gemma 4 models (spec §2.1, §2.2) with random bf16 weights
// built in memory, so benchmarks run without a 62 GB download. Bound through the same weight table as real files.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "model/gemma4_config.h"
#include "model/weight_store.h"

namespace tandem {

// "gemma4-e2b", "gemma4-e4b", "gemma4-26b-a4b", "gemma4-31b"; assistant = the matching -assistant drafter.
Result<ModelConfig> arch_config(const std::string& arch, bool assistant);
std::vector<std::string> arch_names();

// Random weights for `cfg`: norms and scalars in [0.5, 1.5], matrices uniform with std 1/sqrt(fan_in),
// token_ordering the identity permutation. Fails with resource_exhausted when the host lacks the memory.
Result<WeightStore> make_random_weights(const ModelConfig& cfg, uint64_t seed);
uint64_t synthetic_weight_bytes(const ModelConfig& cfg);

// The config.json text of a built-in architecture (the HF gemma4_text / gemma4_assistant layout).
Result<std::string> arch_config_json(const std::string& arch, bool assistant);

// Writes a checkpoint directory a loader reads like a downloaded one: config_json as config.json and the random
// weights of make_random_weights(cfg, seed) (the same values) as one model.safetensors, streamed in 32 MiB pieces
// (written as model.safetensors.partial and renamed at the end). Refuses a directory that already holds a
// checkpoint. progress(bytes written, total) after each piece.
Status write_random_checkpoint(const std::string& config_json, const std::string& dir, uint64_t seed,
                               const std::function<void(uint64_t, uint64_t)>& progress = {});

}  // namespace tandem
