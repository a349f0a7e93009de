#include "cli/csv_monitor.h"

#include <algorithm>
#include <cstdio>

#include "core/fs.h"

namespace zinf::cli {

Status CsvMonitor::Open(const std::string& dir) {
  dir_ = dir;
  return MakeDirectories(dir);
}

std::string CsvMonitor::FileName(const std::string& tag) {
  std::string name = tag;
  std::replace(name.begin(), name.end(), '/', '_');
  return name + ".csv";
}

Status CsvMonitor::Write(const std::string& tag, int64_t samples, double value) {
  auto it = std::find_if(files_.begin(), files_.end(), [&](const auto& f) { return f.first == tag; });
  if (it == files_.end()) {
    auto file = std::make_unique<AppendFile>();
    ZINF_RETURN_IF_ERROR(file->Open(JoinPath(dir_, FileName(tag))));
    ZINF_RETURN_IF_ERROR(file->Append("step," + tag.substr(tag.rfind('/') + 1) + "\n"));
    files_.emplace_back(tag, std::move(file));
    it = files_.end() - 1;
  }
  char row[64];
  std::snprintf(row, sizeof(row), "%lld,%.17g\n", static_cast<long long>(samples), value);
  return it->second->Append(row);
}

Status CsvMonitor::OnStep(const StepMetrics& m) {
  for (const auto& [tag, value] : StepScalars(m)) ZINF_RETURN_IF_ERROR(Write(tag, m.samples, value));
  return Status::Ok();
}

Status CsvMonitor::OnEval(int64_t /*step*/, int64_t samples, double eval_loss) {
  return Write(kEvalLossTag, samples, eval_loss);
}

}  // namespace zinf::cli
