#include "scratch.h"

#include <stdlib.h>

#include <cerrno>
#include <utility>

#include "core/fs.h"

namespace zinf::perf {

StatusOr<ScratchDir> ScratchDir::Create(const std::string& base, const std::string& prefix) {
  ZINF_RETURN_IF_ERROR(MakeDirectories(base));
  std::string tmpl = JoinPath(base, prefix + ".XXXXXX");
  if (mkdtemp(tmpl.data()) == nullptr) return ErrnoStatus(errno, "mkdtemp", tmpl);
  return ScratchDir(std::move(tmpl));
}

ScratchDir::ScratchDir(ScratchDir&& other) noexcept : path_(std::exchange(other.path_, {})) {}

ScratchDir& ScratchDir::operator=(ScratchDir&& other) noexcept {
  if (this != &other) {
    Remove();
    path_ = std::exchange(other.path_, {});
  }
  return *this;
}

ScratchDir::~ScratchDir() { Remove(); }

void ScratchDir::Remove() {
  if (!path_.empty()) RemoveTree(path_).IgnoreError();
  path_.clear();
}

ScratchFiles::ScratchFiles(ScratchFiles&& other) noexcept : paths_(std::exchange(other.paths_, {})) {}

ScratchFiles& ScratchFiles::operator=(ScratchFiles&& other) noexcept {
  if (this != &other) {
    RemoveAll();
    paths_ = std::exchange(other.paths_, {});
  }
  return *this;
}

void ScratchFiles::RemoveAll() {
  for (const std::string& p : paths_) RemoveFile(p).IgnoreError();
  paths_.clear();
}

}  // namespace zinf::perf
