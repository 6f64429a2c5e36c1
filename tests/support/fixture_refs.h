// Access to the committed HF reference data (tests/fixtures/refs, tests/fixtures/README.md) for model tests.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/npy.h"

namespace tandem::testing {

inline std::string fixture_path(const std::string& rel) { return std::string(TANDEM_SOURCE_DIR) + "/tests/fixtures/" + rel; }
// Parsed JSON file under tests/fixtures (aborts the test binary with a message if missing: fixtures are committed).
nlohmann::json load_fixture_json(const std::string& rel);
NpyArray load_fixture_npy(const std::string& rel);
std::vector<int32_t> ids_of(const nlohmann::json& j);
// ||a - b|| / ||b|| over n floats.
double rel_l2(const float* a, const float* b, size_t n);

}  // namespace tandem::testing
