// `tandem logits`: soft-capped logits of every position of a token sequence, as a float32 [T, vocab] .npy file.
#include <cstdio>

#include "cli_common.h"
#include "commands.h"
#include "io/npy.h"
#include "model/gemma4.h"

namespace tandem::cli {
namespace {

struct LogitsOptions {
  std::string model, ids, out, device = "cpu";
  int threads = 0;
};

int run_logits(const LogitsOptions& o) {
  auto ids = parse_ids(o.ids);
  if (!ids.ok()) return fail("logits", ids.status());
  auto backend = open_backend(o.device, o.threads);
  if (!backend.ok()) return fail("logits", backend.status());
  auto model = Gemma4Model::load(o.model, **backend);
  if (!model.ok()) return fail("logits", model.status());
  const int64_t T = static_cast<int64_t>(ids->size());
  auto cache = (*model)->new_cache({.max_positions = T, .max_tokens_per_forward = 256});
  if (!cache.ok()) return fail("logits", cache.status());
  SequenceInput in{.cache = &*cache, .tokens = *ids, .n_outputs = static_cast<int>(T)};
  ForwardOutputs out;
  Status s = (*model)->forward(std::span(&in, 1), &out);
  if (!s.ok()) return fail("logits", s);
  const int64_t V = out.logits.shape[1];
  std::vector<uint8_t> raw(out.logits.nbytes());
  s = (*backend)->copy(raw.data(), out.logits.data, raw.size(), CopyKind::kDeviceToHost);
  if (s.ok()) s = (*backend)->synchronize();
  if (!s.ok()) return fail("logits", s);
  std::vector<float> f32(static_cast<size_t>(T * V));
  for (size_t i = 0; i < f32.size(); ++i) f32[i] = load_as_f32(raw.data(), out.logits.dtype, static_cast<int64_t>(i));
  s = write_npy(o.out, DType::kF32, {T, V}, f32.data());
  if (!s.ok()) return fail("logits", s);
  std::fprintf(stderr, "tandem logits: wrote [%lld, %lld] float32 to %s\n", static_cast<long long>(T),
               static_cast<long long>(V), o.out.c_str());
  return 0;
}

}  // namespace

void add_logits_command(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<LogitsOptions>();
  auto* cmd = app.add_subcommand("logits", "Write the logits of every position of a token sequence to a .npy file");
  cmd->add_option("--model", opts->model, "Target checkpoint directory")->required();
  cmd->add_option("--ids", opts->ids, "Comma-separated token ids, e.g. 2,17,300")->required();
  cmd->add_option("--out", opts->out, "Output .npy file (float32 [T, vocab])")->required();
  cmd->add_option("--device", opts->device, "cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--threads", opts->threads, "CPU threads (0 = all cores)")->capture_default_str();
  cmd->footer("Example:\n  tandem logits --model models/demo/target --ids 2,651,1210 --out logits.npy");
  cmd->callback([opts, &exit_code] { exit_code = run_logits(*opts); });
}

}  // namespace tandem::cli
