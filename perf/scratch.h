// Scratch space a benchmark makes for one run and must not leave behind,
// however the run ends: a directory of its own (ScratchDir) or files it
// puts into directories it does not own (ScratchFiles: fio's files, swap
// files). Both remove what they hold when they go, so a benchmark's error
// paths need no cleanup code of their own.
//
// Removal is best effort: an error while removing is ignored (a benchmark
// has already reported its result or its error by then).
//
// Thread-safety: thread-compatible; one thread owns each object.
#pragma once

#include <string>
#include <vector>

#include "zinf/status.h"

namespace zinf::perf {

// A fresh directory `base`/`prefix`.XXXXXX (mkdtemp; `base` and missing
// parents are made first), removed with everything in it by the destructor.
// Move-only; a moved-from or default-constructed ScratchDir owns nothing.
class ScratchDir {
 public:
  static StatusOr<ScratchDir> Create(const std::string& base, const std::string& prefix);

  ScratchDir() = default;
  ScratchDir(ScratchDir&& other) noexcept;
  ScratchDir& operator=(ScratchDir&& other) noexcept;
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  ~ScratchDir();

  // The directory; empty when this owns nothing.
  const std::string& path() const { return path_; }

 private:
  explicit ScratchDir(std::string path) : path_(std::move(path)) {}
  void Remove();

  std::string path_;
};

// Files to remove when this goes (or at RemoveAll); a file that was never
// created or is already gone is fine. Keep() hands the files over to the
// user instead (a --keep-files flag). Move-only.
class ScratchFiles {
 public:
  ScratchFiles() = default;
  ScratchFiles(ScratchFiles&& other) noexcept;
  ScratchFiles& operator=(ScratchFiles&& other) noexcept;
  ScratchFiles(const ScratchFiles&) = delete;
  ScratchFiles& operator=(const ScratchFiles&) = delete;
  ~ScratchFiles() { RemoveAll(); }

  // Registers `path`; register a file before creating it, so that a failure
  // half-way through its creation still removes it.
  void Add(std::string path) { paths_.push_back(std::move(path)); }
  // Removes the files now and forgets them.
  void RemoveAll();
  // Forgets the files without removing them.
  void Keep() { paths_.clear(); }
  const std::vector<std::string>& paths() const { return paths_; }

 private:
  std::vector<std::string> paths_;
};

}  // namespace zinf::perf
