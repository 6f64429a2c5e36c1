// WeightStore (see weight_store.h).
#include "model/weight_store.h"

#include <algorithm>
#include <cstring>

#include "core/strings.h"

namespace tandem {

Result<WeightStore> WeightStore::open(const std::string& dir) {
  WeightStore ws;
  TANDEM_ASSIGN_OR_RETURN(ws.st_, SafetensorsModel::open(dir));
  return ws;
}

WeightStore WeightStore::from_memory(SafetensorsModel st, std::vector<Buffer> host_buffers) {
  WeightStore ws;
  ws.st_ = std::move(st);
  ws.host_ = std::move(host_buffers);
  return ws;
}

namespace {

constexpr size_t kAlign = 256;                      // every tensor starts 256-byte aligned (cuBLASLt, vector loads)
constexpr size_t kStageBytes = size_t{64} << 20;    // pinned staging chunk

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

}  // namespace

Status WeightStore::place(Backend& backend, const ForEach& for_each, const ProgressFn& progress) {
  if (backend.device().is_cpu()) return ok_status();
  // One device allocation for all tensors, filled through two pinned staging buffers: the host copy of chunk i
  // (from the mmapped file or host buffer) overlaps the DMA of chunk i - 1. Weights keep their dtype.
  uint64_t total = 0, done = 0;
  size_t arena_bytes = 0;
  for_each([&](const std::string&, Tensor& t) {
    total += t.nbytes();
    arena_bytes += align_up(t.nbytes());
  });
  if (arena_bytes == 0) return ok_status();
  Result<Buffer> arena = backend.alloc(arena_bytes);
  if (!arena.ok())
    return Status(arena.status()).with_context(strfmt("allocating %s of device memory for the weights",
                                                      human_bytes(arena_bytes).c_str()));
  Buffer stage[2];
  const bool staged = [&] {
    for (Buffer& b : stage) {
      Result<Buffer> r = backend.alloc(kStageBytes, MemKind::kPinned);
      if (!r.ok()) return false;  // no pinned memory: plain (pageable) copies below
      b = std::move(*r);
    }
    return true;
  }();
  char* base = static_cast<char*>(arena->data());
  size_t offset = 0;
  int chunk = 0;
  Status status;
  for_each([&](const std::string& name, Tensor& t) {
    if (!status.ok()) return;
    char* dst = base + offset;
    const char* src = static_cast<const char*>(t.data);
    const size_t n = t.nbytes();
    for (size_t pos = 0; pos < n && status.ok();) {
      const size_t len = staged ? std::min(kStageBytes, n - pos) : n;
      if (staged) {
        Buffer& b = stage[chunk++ % 2];
        std::memcpy(b.data(), src + pos, len);           // overlaps the DMA of the other buffer
        status = backend.synchronize();                 // that DMA (chunk - 1) is done before this one starts
        if (status.ok()) status = backend.copy(dst + pos, b.data(), len, CopyKind::kHostToDevice);
      } else {
        status = backend.copy(dst + pos, src + pos, len, CopyKind::kHostToDevice);
      }
      pos += len;
    }
    if (!status.ok()) {
      status = std::move(status).with_context("copying weight " + name);
      return;
    }
    t.data = dst;
    t.device = backend.device();
    offset += align_up(n);
    done += n;
    if (progress) progress(done, total);
  });
  TANDEM_TRY(status);
  TANDEM_TRY(backend.synchronize());  // the staging buffers are released below
  device_bytes_ += total;
  device_.push_back(std::move(*arena));
  return ok_status();
}

}  // namespace tandem
