#include "report.h"

#include <cstdio>

#include "core/fs.h"

namespace zinf::perf {

Status EmitResult(const std::string& json_text, const std::string& json_path, const std::string& html_path,
                  HtmlReport& report) {
  std::printf("%s\n", json_text.c_str());
  std::fflush(stdout);
  if (!json_path.empty()) ZINF_RETURN_IF_ERROR(WriteFileAtomic(json_path, json_text + "\n"));
  if (!html_path.empty()) {
    report.SetJson(json_text);
    ZINF_RETURN_IF_ERROR(report.WriteFile(html_path));
  }
  return Status::Ok();
}

}  // namespace zinf::perf
