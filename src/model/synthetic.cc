// Synthetic Gemma 4 checkpoints (see synthetic.h). The config numbers are spec §2.1 / §2.2.
#include "model/synthetic.h"

#include <sys/sysinfo.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/strings.h"
#include "model/gemma4_weights.h"

namespace tandem {
namespace {

struct Arch {
  const char* name;
  const char* target;     // gemma4_text config.json
  const char* assistant;  // gemma4_assistant config.json
};

// Layer pattern string: n blocks of (s sliding + 1 full).
std::string pattern(int blocks, int sliding) {
  std::string out = "[";
  for (int b = 0; b < blocks; ++b)
    for (int i = 0; i <= sliding; ++i)
      out += std::string(out.size() > 1 ? "," : "") + (i < sliding ? "\"sliding_attention\"" : "\"full_attention\"");
  return out + "]";
}

std::string target_json(const std::string& a) {
  const std::string common = R"("model_type":"gemma4_text","vocab_size":262144,"head_dim":256,"global_head_dim":512,
    "rms_norm_eps":1e-6,"final_logit_softcapping":30.0,"hidden_activation":"gelu_pytorch_tanh","bos_token_id":2,
    "eos_token_id":[1,106],"pad_token_id":0,"tie_word_embeddings":true,)";
  if (a == "gemma4-e2b")
    return "{" + common + R"("hidden_size":1536,"num_hidden_layers":35,"num_attention_heads":8,"num_key_value_heads":1,
      "intermediate_size":6144,"use_double_wide_mlp":true,"num_kv_shared_layers":20,"hidden_size_per_layer_input":256,
      "vocab_size_per_layer_input":262144,"sliding_window":512,"max_position_embeddings":131072,"layer_types":)" +
           pattern(7, 4) + "}";
  if (a == "gemma4-e4b")
    return "{" + common + R"("hidden_size":2560,"num_hidden_layers":42,"num_attention_heads":8,"num_key_value_heads":2,
      "intermediate_size":10240,"num_kv_shared_layers":18,"hidden_size_per_layer_input":256,
      "vocab_size_per_layer_input":262144,"sliding_window":512,"max_position_embeddings":131072,"layer_types":)" +
           pattern(7, 5) + "}";
  if (a == "gemma4-26b-a4b")
    return "{" + common + R"("hidden_size":2816,"num_hidden_layers":30,"num_attention_heads":16,"num_key_value_heads":8,
      "num_global_key_value_heads":2,"attention_k_eq_v":true,"intermediate_size":2112,"enable_moe_block":true,
      "num_experts":128,"top_k_experts":8,"moe_intermediate_size":704,"hidden_size_per_layer_input":0,
      "sliding_window":1024,"max_position_embeddings":262144,"layer_types":)" +
           pattern(5, 5) + "}";
  if (a == "gemma4-31b")
    return "{" + common + R"("hidden_size":5376,"num_hidden_layers":60,"num_attention_heads":32,"num_key_value_heads":16,
      "num_global_key_value_heads":4,"attention_k_eq_v":true,"intermediate_size":21504,"hidden_size_per_layer_input":0,
      "sliding_window":1024,"max_position_embeddings":262144,"layer_types":)" +
           pattern(10, 5) + "}";
  return "";
}

std::string assistant_json(const std::string& a) {
  const std::string layers = R"("layer_types":["sliding_attention","sliding_attention","sliding_attention","full_attention"],
    "num_hidden_layers":4,"num_kv_shared_layers":4,"hidden_size_per_layer_input":0,"vocab_size_per_layer_input":0,
    "vocab_size":262144,"head_dim":256,"global_head_dim":512,"hidden_activation":"gelu_pytorch_tanh",)";
  auto wrap = [&](const std::string& text, const std::string& outer) {
    return R"({"model_type":"gemma4_assistant","tie_word_embeddings":true,)" + outer +
           R"(,"text_config":{"model_type":"gemma4_text",)" + layers + text + "}}";
  };
  if (a == "gemma4-e2b" || a == "gemma4-e4b") {
    const bool e2 = a == "gemma4-e2b";
    return wrap(std::string(R"("hidden_size":256,"intermediate_size":2048,"num_attention_heads":4,"sliding_window":512,)") +
                    "\"num_key_value_heads\":" + (e2 ? "1" : "2"),
                std::string(R"("use_ordered_embeddings":true,"num_centroids":2048,"centroid_intermediate_top_k":32,)") +
                    "\"backbone_hidden_size\":" + (e2 ? "1536" : "2560"));
  }
  if (a == "gemma4-26b-a4b")
    return wrap(R"("hidden_size":1024,"intermediate_size":8192,"num_attention_heads":16,"num_key_value_heads":8,
      "num_global_key_value_heads":2,"attention_k_eq_v":true,"sliding_window":1024)",
                R"("use_ordered_embeddings":false,"backbone_hidden_size":2816)");
  if (a == "gemma4-31b")
    return wrap(R"("hidden_size":1024,"intermediate_size":8192,"num_attention_heads":32,"num_key_value_heads":16,
      "num_global_key_value_heads":4,"attention_k_eq_v":true,"sliding_window":1024)",
                R"("use_ordered_embeddings":false,"backbone_hidden_size":5376)");
  return "";
}

uint64_t splitmix(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

std::vector<std::string> arch_names() { return {"gemma4-e2b", "gemma4-e4b", "gemma4-26b-a4b", "gemma4-31b"}; }

Result<ModelConfig> arch_config(const std::string& arch, bool assistant) {
  TANDEM_ASSIGN_OR_RETURN(const std::string json, arch_config_json(arch, assistant));
  return parse_model_config(json, arch + (assistant ? "-assistant (built in)" : " (built in)"));
}

namespace {

int64_t numel_of(const ExpectedTensor& e) {
  int64_t n = 1;
  for (int64_t d : e.shape) n *= d;
  return n;
}

// Bytes of a synthetic tensor: i64 index tensors, bf16 everything else.
uint64_t bytes_of(const ExpectedTensor& e) { return static_cast<uint64_t>(numel_of(e)) * (e.index ? 8 : 2); }

}  // namespace

uint64_t synthetic_weight_bytes(const ModelConfig& cfg) {
  uint64_t total = 0;
  for (const ExpectedTensor& e : expected_tensors(cfg)) total += bytes_of(e);
  return total;
}

namespace {

// Random values of tensor e in 4096-element blocks [blk0, blk1) into dst (element blk0 * 4096 first): bf16 bits, or
// i64 0, 1, 2, ... for index tensors. Norms and scalars uniform in [0.5, 1.5], matrices with std 1/sqrt(fan_in).
// Each block has its own generator state, so any split into blocks gives the same values.
constexpr int64_t kBlock = 4096;
void fill_random_blocks(const ExpectedTensor& e, int64_t n, uint64_t seed, int64_t blk0, int64_t blk1, void* dst) {
  if (e.index) {
    int64_t* p = static_cast<int64_t*>(dst);
    for (int64_t i = blk0 * kBlock; i < std::min(n, blk1 * kBlock); ++i) p[i - blk0 * kBlock] = i;
    return;
  }
  const bool vector = e.shape.size() <= 1;
  const double fan_in = static_cast<double>(e.shape.empty() ? 1 : e.shape.back());
  const float lo = vector ? 0.5f : static_cast<float>(-std::sqrt(3.0 / fan_in));
  const float span = vector ? 1.0f : -2 * lo;
  uint16_t* p = static_cast<uint16_t*>(dst);
  const uint64_t base = seed ^ std::hash<std::string>{}(e.name);
#pragma omp parallel for schedule(static)
  for (int64_t blk = blk0; blk < blk1; ++blk) {
    uint64_t st = base + static_cast<uint64_t>(blk) * 0x9e3779b97f4a7c15ull;
    for (int64_t i = blk * kBlock; i < std::min<int64_t>(n, (blk + 1) * kBlock); ++i) {
      const float u = static_cast<float>(splitmix(st) >> 40) * (1.0f / 16777216.0f);
      p[i - blk0 * kBlock] = f32_to_bf16(lo + span * u);
    }
  }
}

}  // namespace

Result<WeightStore> make_random_weights(const ModelConfig& cfg, uint64_t seed) {
  const uint64_t need = synthetic_weight_bytes(cfg);
  struct sysinfo si {};
  if (sysinfo(&si) == 0) {
    const uint64_t avail = (static_cast<uint64_t>(si.freeram) + si.bufferram) * si.mem_unit;
    if (need > avail)
      return resource_exhausted(strfmt("random weights need %s of memory but only %s is free", human_bytes(need).c_str(),
                                       human_bytes(avail).c_str()));
  }
  std::vector<Buffer> bufs;
  std::vector<TensorInfo> infos;
  for (const ExpectedTensor& e : expected_tensors(cfg)) {
    TensorInfo ti;
    ti.name = e.name;
    ti.shape = e.shape;
    ti.dtype = e.index ? DType::kI64 : DType::kBF16;
    const int64_t n = ti.numel();
    ti.nbytes = static_cast<uint64_t>(n) * dtype_size(ti.dtype);
    TANDEM_ASSIGN_OR_RETURN(Buffer b, Buffer::allocate(host_allocator(), std::max<uint64_t>(ti.nbytes, 8), MemKind::kHost));
    fill_random_blocks(e, n, seed, 0, (n + kBlock - 1) / kBlock, b.data());
    ti.data = b.data();
    infos.push_back(std::move(ti));
    bufs.push_back(std::move(b));
  }
  return WeightStore::from_memory(SafetensorsModel::from_memory(std::move(infos), "random weights"), std::move(bufs));
}

Result<std::string> arch_config_json(const std::string& arch, bool assistant) {
  std::string json = assistant ? assistant_json(arch) : target_json(arch);
  if (json.empty())
    return invalid_argument("unknown architecture \"" + arch + "\" (expected one of " + join(arch_names(), ", ") + ")");
  return json;
}

Status write_random_checkpoint(const std::string& config_json, const std::string& dir, uint64_t seed,
                               const std::function<void(uint64_t, uint64_t)>& progress) {
  TANDEM_ASSIGN_OR_RETURN(ModelConfig cfg, parse_model_config(config_json, dir + "/config.json"));
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return io_error(strfmt("cannot create %s: %s", dir.c_str(), ec.message().c_str()));
  for (const char* name : {"config.json", "model.safetensors", "model.safetensors.index.json"}) {
    if (fs::exists(dir + "/" + name, ec))
      return invalid_argument(strfmt("%s/%s already exists (remove it first; nothing was written)", dir.c_str(), name));
  }
  // Header: every tensor back to back in table order, the JSON space-padded to a multiple of 8 bytes.
  const std::vector<ExpectedTensor> tensors = expected_tensors(cfg);
  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = {{"format", "pt"}, {"writer", "tandem random weights"}};
  uint64_t off = 0;
  for (const ExpectedTensor& e : tensors) {
    const uint64_t bytes = bytes_of(e);
    header[e.name] = {{"dtype", e.index ? "I64" : "BF16"}, {"shape", e.shape}, {"data_offsets", {off, off + bytes}}};
    off += bytes;
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text += ' ';
  const std::string path = dir + "/model.safetensors", tmp = path + ".partial";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return io_error(strfmt("cannot write %s: %s", tmp.c_str(), std::strerror(errno)));
  bool ok = true;
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
  ok = ok && std::fwrite(len, 1, 8, f) == 8 && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  constexpr int64_t kChunkBlocks = 4096;  // 32 MiB of bf16 per write
  std::vector<uint8_t> chunk(static_cast<size_t>(kChunkBlocks * kBlock * 8));
  uint64_t done = 0;
  for (const ExpectedTensor& e : tensors) {
    const int64_t n = numel_of(e), esize = e.index ? 8 : 2, n_blocks = (n + kBlock - 1) / kBlock;
    for (int64_t b0 = 0; ok && b0 < n_blocks; b0 += kChunkBlocks) {
      const int64_t b1 = std::min(n_blocks, b0 + kChunkBlocks);
      fill_random_blocks(e, n, seed, b0, b1, chunk.data());
      const size_t bytes = static_cast<size_t>((std::min(n, b1 * kBlock) - b0 * kBlock) * esize);
      ok = std::fwrite(chunk.data(), 1, bytes, f) == bytes;
      done += bytes;
      if (progress) progress(done, off);
    }
  }
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    fs::remove(tmp, ec);
    return io_error(strfmt("writing %s failed: %s", tmp.c_str(), std::strerror(errno)));
  }
  std::FILE* c = std::fopen((dir + "/config.json").c_str(), "wb");
  ok = c != nullptr && std::fwrite(config_json.data(), 1, config_json.size(), c) == config_json.size();
  if (c != nullptr) ok = (std::fclose(c) == 0) && ok;
  fs::rename(tmp, path, ec);
  if (!ok || ec) {
    fs::remove(tmp, ec);
    return io_error(strfmt("cannot finish the checkpoint in %s", dir.c_str()));
  }
  return ok_status();
}

}  // namespace tandem
