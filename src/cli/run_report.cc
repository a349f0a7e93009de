#include "cli/run_report.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>

#include "cli/html_report.h"
#include "core/fs.h"

namespace zinf::cli {
namespace {

// `v` averaged in consecutive groups so that at most `max` values remain.
std::vector<double> Bin(const std::vector<double>& v, size_t max) {
  if (v.size() <= max || max == 0) return v;
  const size_t group = (v.size() + max - 1) / max;
  std::vector<double> out;
  for (size_t i = 0; i < v.size(); i += group) {
    double sum = 0;
    size_t n = 0;
    for (size_t j = i; j < std::min(v.size(), i + group); ++j) {
      if (!std::isfinite(v[j])) continue;
      sum += v[j];
      ++n;
    }
    out.push_back(n ? sum / static_cast<double>(n) : std::nan(""));
  }
  return out;
}

std::vector<double> Scaled(std::vector<double> v, double factor) {
  for (double& x : v) x *= factor;
  return v;
}

double Median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

std::string Now() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

}  // namespace

RunReport::RunReport(RunReportOptions options) : options_(std::move(options)) {}

Status RunReport::OnStep(const StepMetrics& m) {
  step_.push_back(static_cast<double>(m.step));
  loss_.push_back(m.loss);
  lr_.push_back(m.lr);
  compute_.push_back(m.compute_seconds);
  nvme_.push_back(m.nvme_seconds);
  pcie_.push_back(m.pcie_seconds);
  comm_.push_back(m.comm_seconds);
  optimizer_.push_back(m.optimizer_seconds);
  other_.push_back(std::max(0.0, m.total_seconds - m.compute_seconds - m.nvme_seconds - m.pcie_seconds -
                                     m.comm_seconds - m.optimizer_seconds));
  const EngineCounters& c = m.engine;
  nvme_read_.push_back(static_cast<double>(c.nvme_read_bytes));
  nvme_write_.push_back(static_cast<double>(c.nvme_write_bytes));
  optimizer_nvme_.push_back(static_cast<double>(c.optimizer_nvme_bytes));
  gradient_nvme_.push_back(static_cast<double>(c.gradient_nvme_bytes));
  h2d_.push_back(static_cast<double>(c.h2d_bytes));
  d2h_.push_back(static_cast<double>(c.d2h_bytes));
  gathered_.push_back(static_cast<double>(c.allgather_bytes));
  reduced_.push_back(static_cast<double>(c.reduce_scatter_bytes));
  tokens_per_second_.push_back(m.tokens_per_second);
  return Status::Ok();
}

Status RunReport::OnEval(int64_t step, int64_t /*samples*/, double eval_loss) {
  eval_step_.push_back(static_cast<double>(step));
  eval_loss_.push_back(eval_loss);
  return WriteFileAtomic(options_.path, Render(false));
}

Status RunReport::WriteNow() const { return WriteFileAtomic(options_.path, Render(false)); }

Status RunReport::OnEnd() { return WriteFileAtomic(options_.path, Render(true)); }

std::string RunReport::Render(bool finished) const {
  HtmlReport page(options_.title);
  std::string status = finished ? "Finished" : "Running";
  status += " (page written " + Now() + "): " + std::to_string(step_.size()) + " step(s) in this run";
  if (!step_.empty()) {
    status += ", last step " + std::to_string(static_cast<int64_t>(step_.back())) + ", loss " +
              FormatFigure(loss_.front()) + " -> " + FormatFigure(loss_.back());
  }
  if (!eval_loss_.empty()) {
    status += ", eval loss " + FormatFigure(eval_loss_.front()) + " -> " + FormatFigure(eval_loss_.back());
  }
  if (!tokens_per_second_.empty()) status += ", median " + FormatFigure(Median(tokens_per_second_)) + " tokens/s";
  page.AddParagraph(status + (finished ? "." : "; this page is rewritten after each evaluation and at the end."));
  const size_t group = step_.size() > kMaxBars ? (step_.size() + kMaxBars - 1) / kMaxBars : 1;
  if (step_.size() > kMaxPoints || group > 1) {
    page.AddParagraph("Many steps: the lines average up to " +
                      std::to_string((step_.size() + kMaxPoints - 1) / kMaxPoints) +
                      " consecutive steps per point, the bars " + std::to_string(group) + " per bar.");
  }

  LineChart loss{"Loss", "step", "cross-entropy", {}, false};
  loss.series.push_back({"train (per step)", Bin(step_, kMaxPoints), Bin(loss_, kMaxPoints), false});
  loss.series.push_back({"eval (held out)", eval_step_, eval_loss_, true});
  page.AddLineChart(loss);
  page.AddLineChart({"Learning rate", "step", "lr", {{"lr", Bin(step_, kMaxPoints), Bin(lr_, kMaxPoints)}}, true});

  StackedBars time{"Time per step", "step", "ms", Bin(step_, kMaxBars), {}};
  for (const auto& [name, v] :
       {std::pair{"compute", &compute_}, std::pair{"wait nvme", &nvme_}, std::pair{"wait pcie/gather", &pcie_},
        std::pair{"comm", &comm_}, std::pair{"optimizer", &optimizer_}, std::pair{"other", &other_}}) {
    time.segments.push_back({name, Scaled(Bin(*v, kMaxBars), 1e3)});
  }
  page.AddStackedBars(time);

  LineChart bytes{"Bytes moved per step, by tier", "step", "MiB", {}, true};
  for (const auto& [name, v] :
       {std::pair{"nvme read (params)", &nvme_read_}, std::pair{"nvme write (params)", &nvme_write_},
        std::pair{"nvme (optimizer)", &optimizer_nvme_}, std::pair{"nvme (gradient)", &gradient_nvme_},
        std::pair{"h2d", &h2d_}, std::pair{"d2h", &d2h_}, std::pair{"all-gather", &gathered_},
        std::pair{"reduce-scatter", &reduced_}}) {
    bytes.series.push_back({name, Bin(step_, kMaxPoints), Scaled(Bin(*v, kMaxPoints), 1.0 / (1 << 20)), false});
  }
  page.AddLineChart(bytes);

  std::vector<std::vector<std::string>> rows;
  for (const auto& [k, v] : options_.facts) rows.push_back({k, v});
  if (!rows.empty()) page.AddTable("Run", {}, rows);
  if (!options_.config_json.empty()) page.AddPreformatted("Config (resolved)", options_.config_json);
  return page.Render();
}

}  // namespace zinf::cli
