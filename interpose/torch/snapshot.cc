#include "interpose/torch/snapshot.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <torch/csrc/jit/serialization/pickle.h>

#include "absl/strings/str_cat.h"
#include "core/self_path.h"

namespace nanhunt {
absl::StatusOr<std::string> SaveSnapshot(
    const std::string& dir, const std::optional<c10::OperatorHandle>& op,
    const std::vector<c10::IValue>& args, const FindingRow& finding) {
  if (!op) return absl::FailedPreconditionError("the op has no schema");
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NANHUNT_SNAPSHOT_DIR='", dir, "': ", strerror(errno)));
  }
  const c10::FunctionSchema& schema = op->schema();
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  c10::impl::GenericList names(c10::StringType::get());
  c10::impl::GenericList kwarg_only(c10::BoolType::get());
  for (const auto& a : schema.arguments()) {
    names.push_back(a.name());
    kwarg_only.push_back(a.kwarg_only());
  }
  c10::impl::GenericList saved(c10::AnyType::get());
  for (const c10::IValue& v : args) {
    // Tensors are saved detached and contiguous (views of huge storages
    // would drag the whole storage into the file).
    saved.push_back(v.isTensor() && v.toTensor().defined()
                        ? c10::IValue(v.toTensor().detach().contiguous())
                        : v);
  }
  c10::impl::GenericDict info(c10::StringType::get(), c10::StringType::get());
  info.insert("kind", finding.kind);
  info.insert("op", finding.op);
  info.insert("top_op", finding.top_op);
  info.insert("phase", finding.phase);
  info.insert("step", absl::StrCat(finding.step));
  info.insert("source", finding.source);
  info.insert("outputs", finding.outputs);
  dict.insert("op", schema.name());
  dict.insert("overload", schema.overload_name());
  dict.insert("arg_names", names);
  dict.insert("kwarg_only", kwarg_only);
  dict.insert("args", saved);
  dict.insert("finding", info);
  dict.insert("python", SelfExecutable());
  const std::vector<char> bytes = torch::jit::pickle_save(c10::IValue(dict));

  const std::string path = absl::StrCat(dir, "/nanhunt-snapshot-", getpid(),
                                        "-step", finding.step, ".pt");
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot create ", path, ": ", strerror(errno)));
  }
  fchmod(fd, 0600);  // an existing file keeps its mode through O_CREAT
  size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = write(fd, bytes.data() + written, bytes.size() - written);
    if (n <= 0 && errno != EINTR) break;
    if (n > 0) written += static_cast<size_t>(n);
  }
  close(fd);
  if (written != bytes.size()) {
    return absl::InternalError(absl::StrCat("short write to ", path));
  }
  return path;
}

}  // namespace nanhunt
