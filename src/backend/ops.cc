// Names of the ops of ops.h, for logs, errors and capability reports.
#include "backend/ops.h"

namespace tandem {

const char* op_name(Op op) {
  switch (op) {
    case Op::kEmbedding: return "embedding";
    case Op::kLinear: return "linear";
    case Op::kRmsNorm: return "rms_norm";
    case Op::kRope: return "rope";
    case Op::kKvWrite: return "kv_write";
    case Op::kAttention: return "attention";
    case Op::kGeluMul: return "gelu_mul";
    case Op::kAdd: return "add";
    case Op::kScale: return "scale";
    case Op::kSoftcap: return "softcap";
    case Op::kArgmax: return "argmax";
    case Op::kMoeRoute: return "moe_route";
    case Op::kMoeExperts: return "moe_experts";
    case Op::kSample: return "sample";
    case Op::kRejectDrafts: return "reject_drafts";
    case Op::kCount: break;
  }
  return "?";
}

}  // namespace tandem
