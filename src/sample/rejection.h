// Speculative acceptance math (spec §5.2.4, §5.6): the standard Leviathan/Chen rule, which makes speculative
// sampling lossless. With a point-mass proposal (drafts chosen by argmax) draft d is accepted with probability
// p(d) and a rejection resamples from p with d removed — exactly "sample s ~ p, accept iff s == d". With drafts
// sampled from q, accept with min(1, p(d)/q(d)) and resample from normalize(max(0, p - q)).
#pragma once

#include <cstdint>
#include <span>

#include "sample/sampling.h"

namespace tandem {

struct Verdict {
  bool accepted = false;
  int32_t token = 0;  // the draft when accepted, else the recovered token drawn from the residual
};

// p: the target's processed distribution at this position; q: the proposal the draft was drawn from (empty =
// point mass at `draft`).
Verdict verify_draft(std::span<const float> p, std::span<const float> q, int32_t draft, Rng& rng);
// The same rule with its two uniforms given: u_accept decides acceptance (accept iff u_accept < min(1, p/q)),
// u_resample draws the recovered token (sample_at) on rejection.
Verdict verify_draft_at(std::span<const float> p, std::span<const float> q, int32_t draft, double u_accept,
                        double u_resample);

}  // namespace tandem
