#include "cli/csv_monitor.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <utility>

#include "core/fs.h"

namespace zinf::cli {

Status CsvMonitor::Open(const std::string& dir) {
  dir_ = dir;
  return MakeDirectories(dir);
}

Status CsvMonitor::Continue(const std::string& dir, int64_t samples) {
  ZINF_RETURN_IF_ERROR(Open(dir));
  resumed_samples_ = samples;
  return Status::Ok();
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
    const std::string path = JoinPath(dir_, FileName(tag));
    const std::string header = "step," + tag.substr(tag.rfind('/') + 1);
    if (resumed_samples_ < 0) {
      ZINF_RETURN_IF_ERROR(file->Open(path));
    } else {
      const bool eval = tag == kEvalLossTag;
      const int64_t last = resumed_samples_;
      bool first = true;
      ZINF_RETURN_IF_ERROR(file->Continue(path, [&](std::string_view line) {
        if (std::exchange(first, false)) return line == header;
        // A row: "samples,value".
        int64_t row_samples = 0;
        const auto [end, ec] = std::from_chars(line.data(), line.data() + line.size(), row_samples);
        if (ec != std::errc() || end == line.data() + line.size() || *end != ',') return false;
        return eval ? row_samples < last : row_samples <= last;
      }));
    }
    if (file->size() == 0) ZINF_RETURN_IF_ERROR(file->Append(header + "\n"));
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
