// Reference-data helpers (see fixture_refs.h).
#include "support/fixture_refs.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>

namespace tandem::testing {

nlohmann::json load_fixture_json(const std::string& rel) {
  std::ifstream f(fixture_path(rel));
  if (!f) {
    std::fprintf(stderr, "missing fixture %s\n", fixture_path(rel).c_str());
    std::abort();
  }
  return nlohmann::json::parse(f);
}

NpyArray load_fixture_npy(const std::string& rel) {
  auto r = read_npy(fixture_path(rel));
  if (!r.ok()) {
    std::fprintf(stderr, "fixture %s: %s\n", rel.c_str(), r.status().to_string().c_str());
    std::abort();
  }
  return std::move(r).value();
}

std::vector<int32_t> ids_of(const nlohmann::json& j) {
  std::vector<int32_t> out;
  for (const auto& v : j) out.push_back(v.get<int32_t>());
  return out;
}

double rel_l2(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace tandem::testing
