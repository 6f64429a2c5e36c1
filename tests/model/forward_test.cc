// The target forward pass against HF transformers 5.17 (fp32 compute from the same bf16 weights, embedding scales
// rounded to bf16 as for a bf16 load; tests/fixtures/README.md), for every variant and checkpoint layout, plus the
// cache invariants of spec §6 items 11 and 23: prefill == incremental decode, chunked prefill, and rollback of a
// rejected block across the sliding-window ring.
#include <gtest/gtest.h>

#include "model/gemma4.h"
#include "spec/generator.h"
#include "support/fixture_refs.h"

namespace tandem {
namespace {

using testing::fixture_path;
using testing::ids_of;
using testing::load_fixture_json;
using testing::load_fixture_npy;
using testing::rel_l2;

struct Variant {
  const char* model;  // tests/fixtures/models/<model>
  const char* refs;   // tests/fixtures/refs/<refs>
};

class TargetForward : public ::testing::TestWithParam<Variant> {
 protected:
  void SetUp() override {
    backend_ = make_cpu_backend(1);
    auto m = Gemma4Model::load(fixture_path(std::string("models/") + GetParam().model), *backend_);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    model_ = std::move(*m);
    prompt_ = ids_of(load_fixture_json(std::string("refs/") + GetParam().refs + "/prompt.json")["ids"]);
  }
  // Logits [T, V] of `tokens` run through a fresh cache with forwards of at most `chunk` tokens.
  std::vector<float> logits_of(const std::vector<int32_t>& tokens, int64_t chunk, int64_t step = 0) {
    auto cache = model_->new_cache({.max_positions = 512, .max_tokens_per_forward = chunk});
    EXPECT_TRUE(cache.ok());
    std::vector<float> out;
    const int64_t s = step > 0 ? step : static_cast<int64_t>(tokens.size());
    for (size_t i = 0; i < tokens.size(); i += static_cast<size_t>(s)) {
      const size_t n = std::min(tokens.size() - i, static_cast<size_t>(s));
      SequenceInput in{.cache = &*cache, .tokens = std::span(tokens).subspan(i, n), .n_outputs = static_cast<int>(n)};
      ForwardOutputs fo;
      Status st = model_->forward(std::span(&in, 1), &fo);
      EXPECT_TRUE(st.ok()) << st.to_string();
      out.insert(out.end(), fo.logits.ptr<float>(), fo.logits.ptr<float>() + fo.logits.numel());
    }
    return out;
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Gemma4Model> model_;
  std::vector<int32_t> prompt_;
};

TEST_P(TargetForward, LogitsAndHiddenMatchTransformers) {
  const NpyArray ref = load_fixture_npy(std::string("refs/") + GetParam().refs + "/logits.npy");
  const NpyArray ref_h = load_fixture_npy(std::string("refs/") + GetParam().refs + "/hidden.npy");
  const int64_t T = static_cast<int64_t>(prompt_.size()), V = model_->text().n_vocab, D = model_->text().d_model;
  ASSERT_EQ(ref.shape, (std::vector<int64_t>{T, V}));
  auto cache = model_->new_cache({.max_positions = T});
  ASSERT_TRUE(cache.ok());
  SequenceInput in{.cache = &*cache, .tokens = prompt_, .n_outputs = static_cast<int>(T)};
  ForwardOutputs out;
  ASSERT_TRUE(model_->forward(std::span(&in, 1), &out).ok());
  double worst = 0, worst_h = 0;
  for (int64_t t = 0; t < T; ++t) {
    worst = std::max(worst, rel_l2(out.logits.ptr<float>() + t * V, ref.f32() + t * V, static_cast<size_t>(V)));
    worst_h = std::max(worst_h, rel_l2(out.hidden.ptr<float>() + t * D, ref_h.f32() + t * D, static_cast<size_t>(D)));
  }
  EXPECT_LE(worst, 1e-4) << "worst per-position relative L2 error of the logits";
  EXPECT_LE(worst_h, 1e-4) << "worst per-position relative L2 error of the post-norm hidden";
}

TEST_P(TargetForward, GreedyContinuationMatchesTransformers) {
  const auto ref = load_fixture_json(std::string("refs/") + GetParam().refs + "/greedy.json");
  Generator gen(*model_, nullptr);
  GenerateOptions o;
  o.max_new_tokens = ref["max_new_tokens"].get<int>();
  for (int e : model_->config().eos_ids) o.stop_ids.push_back(e);
  auto r = gen.generate(prompt_, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->tokens, ids_of(ref["generated"]));
}

TEST_P(TargetForward, IncrementalAndChunkedEqualPrefill) {
  // Same logits whether a position is computed in one prefill, token by token, or in chunks of 5 (with a ring
  // of W + 1 + 5 slots, so the sliding layers wrap several times over a prompt longer than 2W).
  const std::vector<float> full = logits_of(prompt_, 256);
  const std::vector<float> inc = logits_of(prompt_, 256, 1);
  const std::vector<float> chunked = logits_of(prompt_, 5);
  ASSERT_EQ(full.size(), inc.size());
  EXPECT_LE(rel_l2(inc.data(), full.data(), full.size()), 1e-6);
  EXPECT_LE(rel_l2(chunked.data(), full.data(), full.size()), 1e-6);
}

TEST_P(TargetForward, RollbackAcrossTheSlidingRing) {
  // Verify blocks of 5 junk tokens are written and rolled back at every position; the ring (W + 1 + 5 slots)
  // wraps many times. The logits of the real tokens must not change.
  const int64_t V = model_->text().n_vocab;
  const std::vector<float> ref = logits_of(prompt_, 5);
  auto cache = model_->new_cache({.max_positions = 512, .max_tokens_per_forward = 5});
  ASSERT_TRUE(cache.ok());
  std::vector<float> got;
  for (size_t i = 0; i < prompt_.size(); ++i) {
    std::vector<int32_t> junk = {static_cast<int32_t>((i * 7 + 3) % V), 5, 9, static_cast<int32_t>((i * 13) % V), 77};
    SequenceInput bad{.cache = &*cache, .tokens = junk, .n_outputs = 0};
    ForwardOutputs fo;
    ASSERT_TRUE(model_->forward(std::span(&bad, 1), &fo).ok());
    ASSERT_TRUE(cache->truncate(static_cast<int64_t>(i)).ok());
    SequenceInput good{.cache = &*cache, .tokens = std::span(prompt_).subspan(i, 1), .n_outputs = 1};
    ASSERT_TRUE(model_->forward(std::span(&good, 1), &fo).ok());
    got.insert(got.end(), fo.logits.ptr<float>(), fo.logits.ptr<float>() + V);
  }
  EXPECT_LE(rel_l2(got.data(), ref.data(), ref.size()), 1e-6);
}

TEST_P(TargetForward, BadInputIsAnError) {
  auto cache = model_->new_cache({.max_positions = 8});
  ASSERT_TRUE(cache.ok());
  std::vector<int32_t> bad_id = {2, model_->text().n_vocab};
  SequenceInput in{.cache = &*cache, .tokens = bad_id};
  ForwardOutputs out;
  EXPECT_EQ(model_->forward(std::span(&in, 1), &out).code(), StatusCode::kInvalidArgument);
  std::vector<int32_t> too_long(9, 3);
  in.tokens = too_long;
  EXPECT_EQ(model_->forward(std::span(&in, 1), &out).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(cache->length(), 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TargetForward,
                         ::testing::Values(Variant{"e2b-tiny", "e2b-tiny"}, Variant{"e2b-tiny-text", "e2b-tiny"},
                                           Variant{"26b-tiny", "26b-tiny"}, Variant{"31b-tiny", "31b-tiny"}),
                         [](const auto& info) {
                           std::string s = info.param.model;
                           for (char& c : s)
                             if (c == '-') c = '_';
                           return s;
                         });

TEST(TargetLoad, AssistantIsNotATarget) {
  auto be = make_cpu_backend(1);
  auto m = Gemma4Model::load(fixture_path("models/e2b-tiny-assistant"), *be);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("assistant"), std::string::npos);
}

}  // namespace
}  // namespace tandem
