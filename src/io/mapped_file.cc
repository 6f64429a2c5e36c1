// MappedFile (read-only mmap) and small-file helpers; every error names the path and the reason.
#include "io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/strings.h"

namespace tandem {
namespace {

Status open_error(const std::string& path, int err) {
  switch (err) {
    case ENOENT: return not_found(strfmt("%s: no such file", path.c_str()));
    case EACCES:
    case EPERM: return io_error(strfmt("%s: permission denied", path.c_str()));
    case EISDIR: return invalid_argument(strfmt("%s: is a directory, expected a file", path.c_str()));
    default: return io_error(strfmt("%s: cannot open: %s", path.c_str(), std::strerror(err)));
  }
}

// Opens `path` for reading and checks it is a regular file; returns the fd and its size.
Result<std::pair<int, uint64_t>> open_regular(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return open_error(path, errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return io_error(strfmt("%s: cannot stat: %s", path.c_str(), std::strerror(err)));
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    return invalid_argument(strfmt("%s: is a directory, expected a file", path.c_str()));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalid_argument(strfmt("%s: not a regular file", path.c_str()));
  }
  return std::make_pair(fd, static_cast<uint64_t>(st.st_size));
}

}  // namespace

Result<std::unique_ptr<MappedFile>> MappedFile::open(const std::string& path) {
  TANDEM_ASSIGN_OR_RETURN(auto fd_size, open_regular(path));
  auto [fd, size] = fd_size;
  if (size == 0) {
    ::close(fd);
    return corrupt(strfmt("%s: empty file", path.c_str()));
  }
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) {
    return io_error(strfmt("%s: mmap of %s failed: %s", path.c_str(), human_bytes(size).c_str(), std::strerror(err)));
  }
  return std::unique_ptr<MappedFile>(new MappedFile(path, static_cast<const uint8_t*>(p), size));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

Result<std::string> read_text_file(const std::string& path) {
  TANDEM_ASSIGN_OR_RETURN(auto fd_size, open_regular(path));
  auto [fd, size] = fd_size;
  constexpr uint64_t kMaxText = 256ull << 20;
  if (size > kMaxText) {
    ::close(fd);
    return invalid_argument(strfmt("%s: %s is too large for a text file", path.c_str(), human_bytes(size).c_str()));
  }
  std::string out(size, '\0');
  uint64_t done = 0;
  while (done < size) {
    ssize_t n = ::read(fd, out.data() + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      return io_error(strfmt("%s: read failed: %s", path.c_str(), std::strerror(err)));
    }
    if (n == 0) break;
    done += static_cast<uint64_t>(n);
  }
  ::close(fd);
  out.resize(done);
  return out;
}

bool is_regular_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace tandem
