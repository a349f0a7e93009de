#include "cli/metrics_jsonl.h"

#include <cmath>

#include <nlohmann/json.hpp>

namespace zinf::cli {
namespace {

using json = nlohmann::ordered_json;

// JSON has no infinity or NaN: those are null.
json Number(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

}  // namespace

Status MetricsJsonl::Open(const std::string& path) { return file_.Open(path); }

Status MetricsJsonl::Continue(const std::string& path, int64_t step) {
  return file_.Continue(path, [step](std::string_view line) {
    const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) return false;
    const int64_t s = j["step"].get<int64_t>();
    return j.contains("eval_loss") ? s < step : s <= step;
  });
}

std::string MetricsJsonl::StepLine(const StepMetrics& m) {
  json j;
  j["step"] = m.step;
  j["loss"] = Number(m.loss);
  j["lr"] = Number(m.lr);
  j["grad_norm"] = Number(m.grad_norm);
  j["loss_scale"] = Number(m.loss_scale);
  j["tokens"] = m.tokens;
  j["samples"] = m.samples;
  j["time"] = {{"total", Number(m.total_seconds)}, {"compute", Number(m.compute_seconds)},
               {"nvme", Number(m.nvme_seconds)},   {"pcie", Number(m.pcie_seconds)},
               {"comm", Number(m.comm_seconds)},   {"optimizer", Number(m.optimizer_seconds)}};
  if (!m.kernels.by_op.empty()) {  // wall_clock_breakdown: seconds on the device and calls, by Ops method
    json ops = json::object();
    for (const auto& [name, t] : m.kernels.by_op) ops[name] = {{"seconds", Number(t.seconds)}, {"calls", t.calls}};
    j["kernels"] = {{"busy", Number(m.kernels.busy_seconds)}, {"ops", std::move(ops)}};
  }
  if (!m.applied) j["skipped"] = true;
  // nlohmann writes doubles in the shortest form that reads back exactly.
  return j.dump();
}

Status MetricsJsonl::OnStep(const StepMetrics& m) { return file_.Append(StepLine(m) + "\n"); }

Status MetricsJsonl::OnEval(int64_t step, int64_t samples, double eval_loss) {
  json j;
  j["step"] = step;
  j["eval_loss"] = Number(eval_loss);
  j["samples"] = samples;
  return file_.Append(j.dump() + "\n");
}

}  // namespace zinf::cli
