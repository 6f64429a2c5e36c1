// `tandem bench`: decode, verify, draft and speculative-round times of a checkpoint or of a released
// architecture with random weights built in memory, each next to the memory-bandwidth floor measured in the same
// run (weight bytes read per token / measured bandwidth). Appends its table to a results file on request.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <random>

#include <omp.h>

#include "cli_common.h"
#include "commands.h"
#include "core/strings.h"
#include "model/assistant.h"
#include "model/synthetic.h"
#include "spec/generator.h"

namespace tandem::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct BenchOptions {
  std::string model, draft, arch, device = "cpu", results, write_checkpoint;
  int threads = 0, iters = 20, context = 128, max_k = 6, prefill_chunk = kDefaultPrefillChunk;
  int64_t kv_capacity = 0;  // KV positions to allocate; 0: the positions the bench writes
  bool json = false, no_draft = false, profile = false, trace = false;
};

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Read bandwidth of this backend: a parallel sum over 1 GiB on the CPU; a device-to-device copy (bytes read +
// written) elsewhere. Best of several runs.
Result<double> measure_bandwidth(Backend& be) {
  const size_t bytes = size_t{1} << 30;
  if (be.device().is_cpu()) {
    TANDEM_ASSIGN_OR_RETURN(Buffer b, Buffer::host(bytes));
    const int64_t n = static_cast<int64_t>(bytes / sizeof(uint64_t));
    uint64_t* p = static_cast<uint64_t*>(b.data());
    for (int64_t i = 0; i < n; i += 512) p[i] = static_cast<uint64_t>(i);
    double best = 1e30;
    uint64_t sink = 0;
    for (int r = 0; r < 5; ++r) {
      const auto t0 = Clock::now();
      uint64_t s = 0;  // integer adds vectorise without reassociation concerns
#pragma omp parallel for simd reduction(+ : s) schedule(static)
      for (int64_t i = 0; i < n; ++i) s += p[i];
      best = std::min(best, seconds_since(t0));
      sink += s;
    }
    if (sink == 42) std::printf(" ");
    return static_cast<double>(bytes) / best;
  }
  TANDEM_ASSIGN_OR_RETURN(Buffer a, be.alloc(bytes));
  TANDEM_ASSIGN_OR_RETURN(Buffer b, be.alloc(bytes));
  double best = 1e30;
  for (int r = 0; r < 6; ++r) {
    TANDEM_TRY(be.synchronize());
    const auto t0 = Clock::now();
    TANDEM_TRY(be.copy(b.data(), a.data(), bytes, CopyKind::kDeviceToDevice));
    TANDEM_TRY(be.synchronize());
    if (r) best = std::min(best, seconds_since(t0));
  }
  return 2.0 * static_cast<double>(bytes) / best;
}

struct Row {
  std::string what;
  double ms = 0, ratio = 0;
  std::string ratio_to;
};

// --trace: kernel timelines (backend/kernel_timeline.h) of the decode graph and of a verify graph of up to 5 tokens,
// each captured anew while the trace runs, then replayed (the report leaves out the first replay). Forwards go
// through `fwd`; verify forwards are rolled back.
Status trace_graphs(const BenchOptions& o, Gemma4Model& target, Backend& be, bool graphs,
                    const std::function<Status(const std::vector<int32_t>&, int)>& fwd,
                    const std::function<std::vector<int32_t>(int)>& tokens, KvCache& cache, std::string* out) {
  if (!graphs) {
    *out += "\nkernel trace: needs a backend with CUDA graphs\n";
    return ok_status();
  }
  constexpr int kForwards = 10;  // an eager one, the capture with the first replay, then replays
  for (const int T : {1, std::min(5, o.max_k + 1)}) {
    const std::string title = T == 1 ? std::string("kernel timeline, decode 1 token (graphs, traced)")
                                     : strfmt("kernel timeline, verify %d tokens (graphs, traced)", T);
    target.set_graphs(false);  // drops the graphs: the next forwards capture again, inside the trace
    target.set_graphs(true);
    const Status st = be.start_kernel_trace();
    if (!st.ok()) {
      *out += "\nkernel trace: " + st.to_string() + "\n";
      return ok_status();
    }
    Status f;
    for (int i = 0; i < kForwards && f.ok(); ++i) {
      const int64_t len = cache.length();
      f = fwd(tokens(T), T);
      if (f.ok() && T > 1) f = cache.truncate(len);
    }
    Result<std::string> report = be.stop_kernel_trace(title);
    TANDEM_TRY(f);
    TANDEM_TRY(report.status());
    *out += "\n" + *report;
  }
  return ok_status();
}

Status run_bench(const BenchOptions& o, std::vector<Row>* rows, std::string* header, std::string* machine,
                 std::string* profile) {
  if (o.model.empty() == o.arch.empty()) return invalid_argument("give exactly one of --model and --arch");
  if (o.iters < 1 || o.context < 1 || o.max_k < 1 || o.max_k > 16) return invalid_argument("--iters, --context >= 1; --max-k 1..16");
  TANDEM_TRY(check_prefill_chunk(o.prefill_chunk));
  // Room for every committed token: prefill, decodes (timed, profiled, traced) and the rounds' fresh tokens.
  const int64_t needed = int64_t{o.context} + int64_t{o.iters} * (o.max_k + 3) + 80;
  if (o.kv_capacity < 0 || (o.kv_capacity > 0 && o.kv_capacity < needed))
    return invalid_argument(
        strfmt("--kv-capacity %lld: the bench writes %lld positions (--context + --iters x (--max-k + 3) + 80); "
               "give at least that, or 0 for exactly that",
               static_cast<long long>(o.kv_capacity), static_cast<long long>(needed)));
  const int64_t capacity = o.kv_capacity > 0 ? o.kv_capacity : needed;
  TANDEM_ASSIGN_OR_RETURN(auto be, open_backend(o.device, o.threads));
  *machine = be->describe_device();
  ProgressBar bar("loading target");
  LoadOptions lo{.progress = [&](uint64_t d, uint64_t t) { bar.update(d, t); }};
  std::unique_ptr<Gemma4Model> target;
  std::unique_ptr<Gemma4Assistant> drafter;
  std::string name = o.model;
  double load_s = 0;  // target load: config + binding + placing the weights on the device
  if (!o.arch.empty()) {
    name = o.arch + " (random bf16 weights)";
    TANDEM_ASSIGN_OR_RETURN(ModelConfig cfg, arch_config(o.arch, false));
    std::fprintf(stderr, "tandem bench: building %s of random %s weights\n",
                 human_bytes(synthetic_weight_bytes(cfg)).c_str(), o.arch.c_str());
    TANDEM_ASSIGN_OR_RETURN(WeightStore ws, make_random_weights(cfg, 1));
    const auto t_load = Clock::now();
    TANDEM_ASSIGN_OR_RETURN(target, Gemma4Model::load_from(std::move(cfg), std::move(ws), o.arch, *be, lo));
    load_s = seconds_since(t_load);
    if (!o.no_draft) {
      TANDEM_ASSIGN_OR_RETURN(ModelConfig dcfg, arch_config(o.arch, true));
      TANDEM_ASSIGN_OR_RETURN(WeightStore dws, make_random_weights(dcfg, 2));
      TANDEM_ASSIGN_OR_RETURN(drafter, Gemma4Assistant::load_from(std::move(dcfg), std::move(dws), o.arch + "-assistant", *target));
    }
  } else {
    const auto t_load = Clock::now();
    TANDEM_ASSIGN_OR_RETURN(target, Gemma4Model::load(o.model, *be, lo));
    load_s = seconds_since(t_load);
    if (!o.draft.empty()) {
      TANDEM_ASSIGN_OR_RETURN(drafter, Gemma4Assistant::load(o.draft, *target));
    }
  }
  bar.finish();
  TargetWeights tw = target->weights();
  const double bytes_tok = static_cast<double>(weight_bytes_per_token(target->config(), tw));
  TANDEM_ASSIGN_OR_RETURN(double bw, measure_bandwidth(*be));
  const double floor_ms = 1e3 * bytes_tok / bw;
  const size_t kv_bytes = KvCache::bytes_per_position(target->kv_layout(), be->activation_dtype());
  // The floor counts weights only; at a long --context the K/V a decode token reads is listed beside it.
  const size_t kv_read = KvCache::bytes_read_per_token(target->kv_layout(), be->activation_dtype(), o.context);
  *header = strfmt(
      "%s on %s | weights read per token %s | KV cache %s per token, %lld positions | measured bandwidth "
      "%.1f GB/s | floor %.3f ms/token | K/V read per token after %d positions %s (floor with it %.3f ms)",
      name.c_str(), be->name(), human_bytes(static_cast<uint64_t>(bytes_tok)).c_str(), human_bytes(kv_bytes).c_str(),
      static_cast<long long>(capacity), bw / 1e9, floor_ms, o.context, human_bytes(kv_read).c_str(),
      1e3 * (bytes_tok + static_cast<double>(kv_read)) / bw);

  if (!be->device().is_cpu()) {
    const double bytes = static_cast<double>(synthetic_weight_bytes(target->config()));
    rows->push_back({strfmt("load target: %s onto the device (%.1f GB/s)", human_bytes(static_cast<uint64_t>(bytes)).c_str(),
                            bytes / load_s / 1e9), load_s * 1e3, 0, ""});
  }
  const int V = target->text().n_vocab;
  std::mt19937 rng(7);
  auto random_tokens = [&](int n) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (int32_t& t : v) t = static_cast<int32_t>(3 + rng() % static_cast<unsigned>(V - 3));
    return v;
  };
  TANDEM_ASSIGN_OR_RETURN(
      KvCache cache,
      target->new_cache({.max_positions = capacity, .max_tokens_per_forward = std::max(o.prefill_chunk, o.max_k + 1)}));
  ForwardOutputs out;
  auto fwd = [&](const std::vector<int32_t>& toks, int n_out) -> Status {
    SequenceInput in{.cache = &cache, .tokens = toks, .n_outputs = n_out};
    TANDEM_TRY(target->forward(std::span(&in, 1), &out));
    return be->synchronize();
  };
  // Prefill throughput (the second of two runs: the first plans the GEMMs and grows the workspace).
  const std::vector<int32_t> prompt = random_tokens(o.context);
  TANDEM_TRY(fwd(prompt, 1));
  cache.clear();
  auto t0 = Clock::now();
  TANDEM_TRY(fwd(prompt, 1));
  const double prefill_s = seconds_since(t0);
  const std::string chunks = o.context > o.prefill_chunk ? strfmt(", chunks of %d", o.prefill_chunk) : "";
  rows->push_back({strfmt("prefill %d tokens%s (%.0f tok/s)", o.context, chunks.c_str(), o.context / prefill_s),
                   prefill_s * 1e3, 0, ""});
  if (o.profile && !be->device().is_cpu()) {
    // Per-op device times of the whole prompt (every chunk, eagerly), run once more into a cleared cache.
    const bool was = target->graphs_enabled();
    target->set_graphs(false);
    cache.clear();
    be->set_profiling(true);
    TANDEM_TRY(fwd(prompt, 1));
    target->set_graphs(was);
    *profile += strfmt("\nper-op device time, prefill %d tokens%s (all chunks):\n", o.context, chunks.c_str()) +
                be->profile_report(1);
  }
  // Decode: one token per forward, committed; eagerly first where the backend has graphs, then from graphs.
  auto time_decode = [&](double* ms) -> Status {
    std::vector<double> dec;
    for (int i = 0; i < o.iters + 3; ++i) {  // the first two run eagerly and capture
      t0 = Clock::now();
      TANDEM_TRY(fwd(random_tokens(1), 1));
      if (i >= 3) dec.push_back(seconds_since(t0));
    }
    *ms = 1e3 * median(dec);
    return ok_status();
  };
  const bool graphs = target->graphs_enabled() && !be->device().is_cpu();
  if (graphs) {
    target->set_graphs(false);
    double eager_ms = 0;
    TANDEM_TRY(time_decode(&eager_ms));
    rows->push_back({strfmt("decode 1 token, no graphs (%.1f tok/s)", 1e3 / eager_ms), eager_ms, eager_ms / floor_ms, "floor"});
    target->set_graphs(true);
  }
  double decode_ms = 0;
  TANDEM_TRY(time_decode(&decode_ms));
  rows->push_back({strfmt("decode 1 token%s (%.1f tok/s)", graphs ? ", graphs" : "", 1e3 / decode_ms), decode_ms,
                   decode_ms / floor_ms, "floor"});
  if (o.profile) {
    // Per-op device times of eager forwards (graphs off, so every op is timed): decode, and a K+1 = 5 verify.
    const bool was = target->graphs_enabled();
    target->set_graphs(false);
    constexpr int kRuns = 3;
    be->set_profiling(true);
    for (int i = 0; i < kRuns; ++i) TANDEM_TRY(fwd(random_tokens(1), 1));
    *profile += "\nper-op device time, decode 1 token (eager, graphs off):\n" + be->profile_report(kRuns);
    const int T = std::min(5, o.max_k + 1);
    // One untimed verify first: a shape's first eager use times its GEMV against cuBLASLt (gemm.cu), which would
    // otherwise count in the profile.
    const int64_t len0 = cache.length();
    TANDEM_TRY(fwd(random_tokens(T), T));
    TANDEM_TRY(cache.truncate(len0));
    be->set_profiling(true);
    for (int i = 0; i < kRuns; ++i) {
      const int64_t len = cache.length();
      TANDEM_TRY(fwd(random_tokens(T), T));
      TANDEM_TRY(cache.truncate(len));
    }
    *profile += strfmt("\nper-op device time, verify %d tokens (eager, graphs off):\n", T) + be->profile_report(kRuns);
    target->set_graphs(was);
  }
  if (o.trace) TANDEM_TRY(trace_graphs(o, *target, *be, graphs, fwd, random_tokens, cache, profile));
  // Verify passes of T tokens, rolled back each time.
  std::vector<double> verify_ms(static_cast<size_t>(o.max_k) + 2, 0);
  for (int T = 2; T <= o.max_k + 1; ++T) {
    std::vector<double> v;
    for (int i = 0; i < o.iters + 2; ++i) {  // two untimed: an eager run and a graph capture
      const int64_t len = cache.length();
      t0 = Clock::now();
      TANDEM_TRY(fwd(random_tokens(T), T));
      if (i >= 2) v.push_back(seconds_since(t0));
      TANDEM_TRY(cache.truncate(len));
    }
    verify_ms[static_cast<size_t>(T)] = 1e3 * median(v);
    rows->push_back({strfmt("verify %d tokens", T), verify_ms[static_cast<size_t>(T)],
                     verify_ms[static_cast<size_t>(T)] / decode_ms, "decode"});
  }
  if (!drafter) return ok_status();
  // Draft step and full speculative rounds (K draft steps + a K+1 verify + rollback).
  TANDEM_TRY(fwd(random_tokens(1), 1));
  const Tensor g = out.hidden;
  const int64_t P = cache.length();
  std::vector<double> ds;
  for (int i = 0; i < o.iters + 2; ++i) {
    DraftStepResult r;
    t0 = Clock::now();
    TANDEM_TRY(drafter->step({.cache = &cache, .kv_end = P, .q_pos = P, .token = 5, .g_in = i == 0 ? &g : nullptr}, &r));
    if (i >= 2) ds.push_back(seconds_since(t0));
  }
  const double draft_ms = 1e3 * median(ds);
  rows->push_back({"draft step", draft_ms, draft_ms / decode_ms, "decode"});
  for (int k = 2; k <= o.max_k; ++k) {
    std::vector<double> v;
    for (int i = 0; i < o.iters + 2; ++i) {
      TANDEM_TRY(fwd(random_tokens(1), 1));  // fresh hidden for the round's first step
      const Tensor g0 = out.hidden;
      const int64_t p = cache.length();
      t0 = Clock::now();
      int32_t t = 5;
      std::vector<int32_t> block = {t};
      for (int j = 0; j < k; ++j) {
        DraftStepResult r;
        TANDEM_TRY(drafter->step({.cache = &cache, .kv_end = p, .q_pos = p, .token = t, .g_in = j == 0 ? &g0 : nullptr}, &r));
        t = r.argmax;
        block.push_back(t);
      }
      TANDEM_TRY(fwd(block, k + 1));
      if (i >= 2) v.push_back(seconds_since(t0));
      TANDEM_TRY(cache.truncate(p));
    }
    const double ms = 1e3 * median(v);
    rows->push_back({strfmt("round K=%d (draft + verify %d)", k, k + 1), ms, ms / decode_ms, "decode"});
  }
  return ok_status();
}

std::string machine_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (starts_with(line, "model name")) return line.substr(line.find(':') + 2);
  return "unknown cpu";
}

// --arch A --write-checkpoint DIR: the random target as a checkpoint directory (and its assistant in DIR/assistant
// unless --no-draft), so loading from disk / the page cache can be timed with --model.
int write_checkpoint_main(const BenchOptions& o) {
  if (o.arch.empty()) return fail("bench", invalid_argument("--write-checkpoint needs --arch"));
  for (bool assistant : {false, true}) {
    if (assistant && o.no_draft) break;
    const std::string dir = assistant ? o.write_checkpoint + "/assistant" : o.write_checkpoint;
    Result<std::string> json = arch_config_json(o.arch, assistant);
    if (!json.ok()) return fail("bench", json.status());
    ProgressBar bar(assistant ? "writing assistant" : "writing target");
    const auto t0 = Clock::now();
    uint64_t total = 0;
    Status s = write_random_checkpoint(*json, dir, assistant ? 2 : 1, [&](uint64_t d, uint64_t t) {
      total = t;
      bar.update(d, t);
    });
    bar.finish();
    if (!s.ok()) return fail("bench", s);
    std::printf("wrote %s (%s of random %s weights) in %.1f s\n", dir.c_str(), human_bytes(total).c_str(),
                o.arch.c_str(), seconds_since(t0));
  }
  return 0;
}

int bench_main(const BenchOptions& o, const std::string& command) {
  if (!o.write_checkpoint.empty()) return write_checkpoint_main(o);
  std::vector<Row> rows;
  std::string header, machine, profile;
  Status s = run_bench(o, &rows, &header, &machine, &profile);
  if (!s.ok()) return fail("bench", s);
  if (o.device == "cpu") machine = strfmt("%s, %d threads", machine_name().c_str(), omp_get_max_threads());
  std::printf("%s\nmachine: %s\n\n%-40s %12s %12s\n", header.c_str(), machine.c_str(), "measure", "ms", "ratio");
  for (const Row& r : rows)
    std::printf("%-40s %12.3f %12s\n", r.what.c_str(), r.ms,
                r.ratio_to.empty() ? "" : strfmt("%.2fx %s", r.ratio, r.ratio_to.c_str()).c_str());
  if (!profile.empty()) std::printf("%s", profile.c_str());
  if (!o.results.empty()) {
    std::ofstream f(o.results, std::ios::app);
    if (!f) return fail("bench", io_error("cannot append to " + o.results));
    char date[32];
    std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
    f << "\n### tandem bench, " << date << ", " << machine << "\n\n`" << command << "`\n\n" << header << "\n\n"
      << "| measure | ms | ratio |\n|---|---|---|\n";
    for (const Row& r : rows)
      f << "| " << r.what << " | " << strfmt("%.3f", r.ms) << " | "
        << (r.ratio_to.empty() ? "" : strfmt("%.2fx %s", r.ratio, r.ratio_to.c_str())) << " |\n";
  }
  return 0;
}

}  // namespace

void add_bench_command(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<BenchOptions>();
  auto* cmd = app.add_subcommand("bench", "Time decode, verify, draft steps and speculative rounds against the bandwidth floor");
  cmd->add_option("--model", o->model, "Target checkpoint directory");
  cmd->add_option("--draft", o->draft, "Assistant checkpoint directory");
  cmd->add_option("--arch", o->arch, "Released architecture with random weights: " + join(arch_names(), ", "));
  cmd->add_flag("--no-draft", o->no_draft, "With --arch: skip the assistant");
  cmd->add_option("--iters", o->iters, "Timed repetitions per measure (median reported)")->capture_default_str();
  cmd->add_option("--context", o->context, "Prompt length before the decode measures")->capture_default_str();
  cmd->add_option("--max-k", o->max_k, "Largest draft block timed")->capture_default_str();
  add_prefill_chunk_option(cmd, &o->prefill_chunk, "--context");
  cmd->add_option("--kv-capacity", o->kv_capacity,
                  "KV positions to allocate (0: the positions the bench writes). A server's context, e.g. 8192, sizes "
                  "the decode graphs' attention launches as the server's would")
      ->capture_default_str();
  cmd->add_option("--device", o->device, "cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--threads", o->threads, "CPU threads (0 = all cores)")->capture_default_str();
  cmd->add_flag("--profile", o->profile,
                "Also print per-op device times of the prefill and of eager decode and verify forwards (CUDA)");
  cmd->add_flag("--trace", o->trace,
                "Also print kernel timelines of decode and verify graph replays: idle time between kernels, overlap, "
                "per-kernel times (CUDA with CUPTI)");
  cmd->add_option("--results", o->results, "Append the table to this markdown file (e.g. bench/RESULTS.md)");
  cmd->add_option("--write-checkpoint", o->write_checkpoint,
                  "With --arch: write the random target to this directory (the assistant to DIR/assistant unless "
                  "--no-draft) instead of benchmarking; then bench it with --model DIR [--draft DIR/assistant]");
  cmd->footer(
      "Examples:\n  tandem bench --model models/demo/target --draft models/demo/assistant\n"
      "  tandem bench --arch gemma4-e2b --iters 5 --results bench/RESULTS.md\n"
      "  tandem bench --arch gemma4-e2b --write-checkpoint /tmp/e2b && tandem bench --model /tmp/e2b --device cuda");
  cmd->callback([o, cmd, &exit_code] {
    std::string command = "tandem bench";
    for (const auto* opt : cmd->get_options())
      if (opt->count() > 0 && opt->get_name() != "--help")
        command += " " + opt->get_name() + (opt->get_expected_min() > 0 ? " " + opt->as<std::string>() : "");
    exit_code = bench_main(*o, command);
  });
}

}  // namespace tandem::cli
