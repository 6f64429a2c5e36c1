// Times processed_probs (sample/sampling.h), the host side of sampling, on a 262,144-token row: temperature only,
// top-k + top-p, top-p alone and min-p, for smooth logits (normal, sd 2: top-p 0.9 keeps about half the
// vocabulary) and peaked ones (the same plus 32 tokens 14 higher, as a trained model's rows look). Prints the mean
// milliseconds per call over 10 calls after one warm-up. Usage: tandem_bench_sample
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "sample/sampling.h"

int main() {
  using tandem::SamplingParams;
  const SamplingParams cases[] = {{.temperature = 1.f},
                                  {.temperature = 0.8f, .top_k = 40, .top_p = 0.95f},
                                  {.temperature = 1.f, .top_p = 0.9f},
                                  {.temperature = 0.7f, .min_p = 0.05f}};
  const char* names[] = {"temperature only", "top-k 40 + top-p 0.95", "top-p 0.9", "min-p 0.05"};
  std::printf("%-8s %-24s %10s\n", "logits", "processing", "ms/call");
  for (bool peaked : {false, true}) {
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.f, 2.f);
    std::vector<float> logits(262144);
    for (float& v : logits) v = normal(rng);
    if (peaked)
      for (size_t i = 0; i < logits.size(); i += 8192) logits[i] += 14.f;
    std::vector<float> probs;
    for (size_t c = 0; c < std::size(cases); ++c) {
      tandem::processed_probs(logits, cases[c], &probs);
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 10; ++i) tandem::processed_probs(logits, cases[c], &probs);
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / 10;
      std::printf("%-8s %-24s %10.2f\n", peaked ? "peaked" : "smooth", names[c], ms);
    }
  }
  return 0;
}
