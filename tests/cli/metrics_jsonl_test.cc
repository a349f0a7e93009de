// cli/metrics_jsonl: one JSON object per line, steps in order, the loss read
// back bit for bit, evaluations under eval_loss only.
#include "cli/metrics_jsonl.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "temp_dir.h"

namespace zinf::cli {
namespace {

std::vector<nlohmann::json> ReadLines(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

StepMetrics Step(int64_t step, double loss) {
  StepMetrics m;
  m.step = step;
  m.samples = 8 * step;
  m.loss = loss;
  m.lr = 3e-4 * static_cast<double>(step) / 7.0;
  m.grad_norm = 1.0 / 3.0;
  m.tokens = 512;
  m.total_seconds = 0.25;
  m.compute_seconds = 0.125;
  m.nvme_seconds = 0.01;
  m.pcie_seconds = 0.02;
  m.comm_seconds = 0.03;
  m.optimizer_seconds = 0.04;
  return m;
}

TEST(MetricsJsonlTest, OneLinePerStepAndPerEvaluation) {
  test_support::TempDir dir("metrics-jsonl");
  const std::string path = dir.path() + "/m.jsonl";
  MetricsJsonl metrics;
  ASSERT_TRUE(metrics.Open(path).ok());
  // Losses that need all 17 digits to read back.
  const std::vector<double> losses = {5.541927656158805, 1.0 / 3.0, std::nextafter(2.0, 3.0)};
  ASSERT_TRUE(metrics.OnEval(0, 0, 5.75).ok());
  for (size_t i = 0; i < losses.size(); ++i) {
    ASSERT_TRUE(metrics.OnStep(Step(static_cast<int64_t>(i) + 1, losses[i])).ok());
  }
  ASSERT_TRUE(metrics.OnEval(3, 24, 4.5).ok());

  const auto lines = ReadLines(path);
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[0]["step"], 0);
  EXPECT_EQ(lines[0]["eval_loss"].get<double>(), 5.75);
  EXPECT_FALSE(lines[0].contains("loss"));
  for (size_t i = 0; i < losses.size(); ++i) {
    const auto& l = lines[i + 1];
    EXPECT_EQ(l["step"].get<int64_t>(), static_cast<int64_t>(i) + 1);
    EXPECT_EQ(l["loss"].get<double>(), losses[i]) << "loss must read back exactly";
    EXPECT_EQ(l["lr"].get<double>(), 3e-4 * static_cast<double>(i + 1) / 7.0);
    EXPECT_EQ(l["grad_norm"].get<double>(), 1.0 / 3.0);
    EXPECT_EQ(l["tokens"].get<int64_t>(), 512);
    EXPECT_EQ(l["samples"].get<int64_t>(), 8 * static_cast<int64_t>(i + 1));
    EXPECT_FALSE(l.contains("eval_loss"));
    const auto& t = l["time"];
    EXPECT_EQ(t["total"].get<double>(), 0.25);
    EXPECT_EQ(t["compute"].get<double>(), 0.125);
    EXPECT_EQ(t["nvme"].get<double>(), 0.01);
    EXPECT_EQ(t["pcie"].get<double>(), 0.02);
    EXPECT_EQ(t["comm"].get<double>(), 0.03);
    EXPECT_EQ(t["optimizer"].get<double>(), 0.04);
  }
  EXPECT_EQ(lines[4]["eval_loss"].get<double>(), 4.5);
  EXPECT_EQ(lines[4]["samples"].get<int64_t>(), 24);
  EXPECT_FALSE(lines[4].contains("loss"));
  for (const auto& l : lines) EXPECT_FALSE(l.contains("kernels")) << "kernels without wall_clock_breakdown";
}

// With wall_clock_breakdown the step's kernel times: their sum and each Ops
// method's seconds and calls.
TEST(MetricsJsonlTest, KernelTimesAreWrittenWhenThereAreAny) {
  StepMetrics m = Step(1, 5.5);
  m.kernels.busy_seconds = 0.0625;
  m.kernels.by_op["MatmulForward16"] = {0.0375, 48};
  m.kernels.by_op["AttentionForward"] = {0.025, 12};
  const nlohmann::json l = nlohmann::json::parse(MetricsJsonl::StepLine(m));
  ASSERT_TRUE(l.contains("kernels"));
  EXPECT_EQ(l["kernels"]["busy"].get<double>(), 0.0625);
  EXPECT_EQ(l["kernels"]["ops"]["MatmulForward16"]["seconds"].get<double>(), 0.0375);
  EXPECT_EQ(l["kernels"]["ops"]["MatmulForward16"]["calls"].get<int64_t>(), 48);
  EXPECT_EQ(l["kernels"]["ops"]["AttentionForward"]["calls"].get<int64_t>(), 12);
  EXPECT_EQ(l["kernels"]["ops"].size(), 2u);
}

TEST(MetricsJsonlTest, NonFiniteValuesAreNullAndSkippedStepsMarked) {
  StepMetrics m = Step(1, 2.0);
  m.grad_norm = std::numeric_limits<double>::infinity();
  m.applied = false;
  const auto j = nlohmann::json::parse(MetricsJsonl::StepLine(m));
  EXPECT_TRUE(j["grad_norm"].is_null());
  EXPECT_EQ(j["skipped"], true);
  EXPECT_FALSE(nlohmann::json::parse(MetricsJsonl::StepLine(Step(1, 2.0))).contains("skipped"));
}

// A run resumed after step 2 of a file a run wrote to step 4 (and cut short
// in its last line): steps 1 and 2 and the evaluation before step 1 stay; the
// evaluation at step 2 goes (the resumed run evaluates there again), and so
// does all that came after it.
TEST(MetricsJsonlTest, ContinueKeepsTheStepsUpToTheResumedOne) {
  test_support::TempDir dir("metrics-jsonl");
  const std::string path = dir.path() + "/m.jsonl";
  {
    MetricsJsonl first;
    ASSERT_TRUE(first.Open(path).ok());
    ASSERT_TRUE(first.OnEval(0, 0, 5.75).ok());
    for (int64_t s = 1; s <= 4; ++s) {
      ASSERT_TRUE(first.OnStep(Step(s, 5.0 - static_cast<double>(s))).ok());
      if (s == 2) {
        ASSERT_TRUE(first.OnEval(2, 16, 4.5).ok());
      }
    }
  }
  { std::ofstream(path, std::ios::app) << "{\"step\":5,\"lo"; }
  MetricsJsonl resumed;
  ASSERT_TRUE(resumed.Continue(path, 2).ok());
  ASSERT_TRUE(resumed.OnEval(2, 16, 4.25).ok());
  ASSERT_TRUE(resumed.OnStep(Step(3, 1.5)).ok());

  const auto lines = ReadLines(path);
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[0]["eval_loss"].get<double>(), 5.75);
  EXPECT_EQ(lines[1]["step"], 1);
  EXPECT_EQ(lines[1]["loss"].get<double>(), 4.0);
  EXPECT_EQ(lines[2]["step"], 2);
  EXPECT_EQ(lines[2]["loss"].get<double>(), 3.0);
  EXPECT_EQ(lines[3]["step"], 2);
  EXPECT_EQ(lines[3]["eval_loss"].get<double>(), 4.25) << "the earlier run's evaluation at step 2 is replaced";
  EXPECT_EQ(lines[4]["step"], 3);
  EXPECT_EQ(lines[4]["loss"].get<double>(), 1.5);
}

TEST(MetricsJsonlTest, ContinueCreatesAMissingFile) {
  test_support::TempDir dir("metrics-jsonl");
  const std::string path = dir.path() + "/m.jsonl";
  MetricsJsonl resumed;
  ASSERT_TRUE(resumed.Continue(path, 7).ok());
  ASSERT_TRUE(resumed.OnStep(Step(8, 1.0)).ok());
  const auto lines = ReadLines(path);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["step"], 8);
}

TEST(MetricsJsonlTest, AFileThatCannotBeCreatedIsNamed) {
  MetricsJsonl metrics;
  const Status s = metrics.Open("/nonexistent-dir/m.jsonl");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("/nonexistent-dir/m.jsonl"), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace zinf::cli
