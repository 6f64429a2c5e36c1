// WeightStore (see weight_store.h).
#include "model/weight_store.h"

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

Status WeightStore::place(Backend& backend, const ForEach& for_each, const ProgressFn& progress) {
  if (backend.device().is_cpu()) return ok_status();
  uint64_t total = 0, done = 0;
  for_each([&](const std::string&, Tensor& t) { total += t.nbytes(); });
  Status status;
  for_each([&](const std::string& name, Tensor& t) {
    if (!status.ok()) return;
    auto buf = backend.alloc(t.nbytes());
    if (!buf.ok()) {
      status = buf.status();
      status.with_context("placing weight " + name);
      return;
    }
    Status s = backend.copy(buf->data(), t.data, t.nbytes(), CopyKind::kHostToDevice);
    if (!s.ok()) {
      status = std::move(s).with_context("copying weight " + name);
      return;
    }
    t.data = buf->data();
    t.device = backend.device();
    done += t.nbytes();
    device_bytes_ += t.nbytes();
    device_.push_back(std::move(*buf));
    if (progress) progress(done, total);
  });
  TANDEM_TRY(status);
  return backend.synchronize();
}

}  // namespace tandem
