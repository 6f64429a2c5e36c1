// Strict JSON parsing for files tandem reads (safetensors headers, config.json, index files): nlohmann::json
// plus rejection of duplicate object keys and of absurd nesting, with errors that name the file and the byte.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/status.h"

namespace tandem {

inline constexpr int kMaxJsonDepth = 64;

// Parses `text` as one JSON value. Errors (kCorrupt) start with `source`.
Result<nlohmann::json> parse_json_strict(std::string_view text, const std::string& source);

// "object", "array", "string", "number", "boolean", "null": for messages about wrong types.
[[nodiscard]] const char* json_kind(const nlohmann::json& v);

}  // namespace tandem
