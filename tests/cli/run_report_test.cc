// cli/run_report: the --report page is well-formed, stands alone, carries
// the curves' data, and is rewritten whole at each evaluation and at the end.
#include "cli/run_report.h"

#include <dirent.h>

#include <cctype>
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cli/html_report.h"
#include "temp_dir.h"
#include "testing/text.h"

namespace zinf::cli {
namespace {

using test_support::Count;
using test_support::ReadAll;

// Every element opened is closed, in order (void elements and "/>" aside);
// returns the first problem, empty when the page is well-formed. A plain
// scan, not std::regex: libstdc++'s regex recurses per character and runs
// out of stack on a long page under the sanitizers.
std::string CheckBalanced(const std::string& page) {
  std::vector<std::string> open;
  for (size_t lt = page.find('<'); lt != std::string::npos; lt = page.find('<', lt + 1)) {
    size_t i = lt + 1;
    const bool closing = i < page.size() && page[i] == '/';
    if (closing) ++i;
    if (i >= page.size() || !std::isalpha(static_cast<unsigned char>(page[i]))) continue;  // <!DOCTYPE, text
    size_t end = i;
    while (end < page.size() && std::isalnum(static_cast<unsigned char>(page[end]))) ++end;
    const std::string name = page.substr(i, end - i);
    const size_t gt = page.find('>', end);
    if (gt == std::string::npos) return "<" + name + " at " + std::to_string(lt) + " never ends";
    if (name == "meta" || name == "br" || page[gt - 1] == '/') continue;
    if (closing) {
      if (open.empty() || open.back() != name) {
        return "</" + name + "> at " + std::to_string(lt) + " closes " + (open.empty() ? "nothing" : open.back());
      }
      open.pop_back();
    } else {
      open.push_back(name);
    }
  }
  return open.empty() ? "" : "<" + open.back() + "> never closed";
}

// The points of the first polyline, empty when there is none.
std::string FirstPolylinePoints(const std::string& page) {
  const size_t at = page.find("<polyline");
  if (at == std::string::npos) return "";
  const size_t gt = page.find('>', at);
  const size_t points = page.find("points=\"", at);
  if (points == std::string::npos || points > gt) return "";
  const size_t begin = points + 8, end = page.find('"', begin);
  return end == std::string::npos ? "" : page.substr(begin, end - begin);
}

StepMetrics Step(int64_t i) {
  StepMetrics m;
  m.step = i;
  m.samples = 8 * i;
  m.loss = 6.0 - 0.01 * static_cast<double>(i);
  m.lr = 1e-4 * static_cast<double>(std::min<int64_t>(i, 10)) / 10.0;
  m.total_seconds = 0.5;
  m.compute_seconds = 0.25;
  m.nvme_seconds = 0.125;
  m.optimizer_seconds = 0.0625;
  m.engine.nvme_read_bytes = int64_t{3} << 20;
  m.engine.h2d_bytes = int64_t{5} << 20;
  m.engine.gradient_nvme_bytes = int64_t{7} << 20;
  m.tokens_per_second = 1000;
  return m;
}

std::vector<std::string> Files(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') out.push_back(e->d_name);
  }
  closedir(d);
  return out;
}

TEST(RunReportTest, PageIsWellFormedAndCarriesTheCurves) {
  test_support::TempDir dir("run-report");
  RunReportOptions o;
  o.path = dir.path() + "/run.html";
  o.title = "zinf train: model tiny";
  o.facts = {{"model", "tiny <2 layers>"}};
  o.config_json = "{\"train_batch_size\": 8}";
  RunReport report(o);
  ASSERT_TRUE(report.OnEval(0, 0, 6.25).ok());
  std::string page = ReadAll(o.path);
  EXPECT_NE(page.find("Running"), std::string::npos);
  EXPECT_EQ(CheckBalanced(page), "");
  for (int64_t i = 1; i <= 20; ++i) ASSERT_TRUE(report.OnStep(Step(i)).ok());
  ASSERT_TRUE(report.OnEval(20, 160, 5.5).ok());
  page = ReadAll(o.path);
  EXPECT_NE(page.find("20 step(s)"), std::string::npos) << "rewritten at the evaluation";
  ASSERT_TRUE(report.OnEnd().ok());
  page = ReadAll(o.path);
  EXPECT_NE(page.find("Finished"), std::string::npos);
  EXPECT_EQ(Files(dir.path()), std::vector<std::string>{"run.html"}) << "no temporary file left behind";

  EXPECT_EQ(CheckBalanced(page), "");
  EXPECT_EQ(page.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_EQ(page.find("<script"), std::string::npos);
  EXPECT_EQ(Count(page, "<svg"), 4u);  // loss, lr, time split, bytes
  for (const char* title : {"Loss", "Learning rate", "Time per step", "Bytes moved per step, by tier"}) {
    EXPECT_NE(page.find(std::string("aria-label=\"") + title + "\""), std::string::npos) << title;
  }
  // The train loss: one polyline of 20 points; the evaluations as dots.
  const std::string points = FirstPolylinePoints(page);
  ASSERT_FALSE(points.empty());
  EXPECT_EQ(Count(points, ","), 20u);
  EXPECT_NE(page.find("<title>eval (held out) at 0: 6.250</title>"), std::string::npos);
  EXPECT_NE(page.find("<title>eval (held out) at 20: 5.500</title>"), std::string::npos);
  // The time split: each step's bar stacked from its parts, in ms.
  EXPECT_NE(page.find("<title>step 7: compute 250.0</title>"), std::string::npos);
  EXPECT_NE(page.find("<title>step 7: wait nvme 125.0</title>"), std::string::npos);
  EXPECT_NE(page.find("<title>step 7: optimizer 62.50</title>"), std::string::npos);
  EXPECT_NE(page.find("<title>step 7: other 62.50</title>"), std::string::npos);
  EXPECT_EQ(page.find("step 7: comm"), std::string::npos) << "a zero part draws nothing";
  // Bytes per tier, the facts (escaped) and the config.
  for (const char* series : {"nvme read (params)", "nvme write (params)", "nvme (optimizer)", "nvme (gradient)", "h2d",
                             "d2h", "all-gather", "reduce-scatter"}) {
    EXPECT_NE(page.find(std::string(">") + series + "<"), std::string::npos) << series << " not in the legend";
  }
  EXPECT_NE(page.find("tiny &lt;2 layers&gt;"), std::string::npos);
  EXPECT_NE(page.find("{&quot;train_batch_size&quot;: 8}"), std::string::npos);
}

TEST(RunReportTest, ALongRunIsBinned) {
  test_support::TempDir dir("run-report-long");
  RunReport report({dir.path() + "/r.html", "long", {}, ""});
  for (int64_t i = 1; i <= 5000; ++i) ASSERT_TRUE(report.OnStep(Step(i)).ok());
  const std::string page = report.Render(true);
  EXPECT_EQ(CheckBalanced(page), "");
  const std::string points = FirstPolylinePoints(page);
  ASSERT_FALSE(points.empty());
  EXPECT_LE(Count(points, ","), RunReport::kMaxPoints);
  EXPECT_GE(Count(points, ","), RunReport::kMaxPoints / 2);
  EXPECT_LE(Count(page, ": compute "), RunReport::kMaxBars);
  EXPECT_NE(page.find("Many steps"), std::string::npos);
}

TEST(RunReportTest, ChartTextNeverBecomesMarkup) {
  const std::string evil = "<script>x</script>";
  HtmlReport r(evil);
  r.AddLineChart({evil, evil, evil, {{evil, {1, 2}, {3, NAN}, true}}, false});
  r.AddStackedBars({evil, evil, evil, {1, 2}, {{evil, {1.0, -1.0}}}});
  r.AddPreformatted(evil, evil + "</pre>");
  const std::string page = r.Render();
  EXPECT_EQ(page.find("<script"), std::string::npos);
  EXPECT_EQ(Count(page, "</pre>"), 1u);
  EXPECT_EQ(CheckBalanced(page), "");
  EXPECT_EQ(page.find("nan"), std::string::npos);
  // The checker itself catches what it should.
  EXPECT_NE(CheckBalanced("<p><b></p>"), "");
  EXPECT_NE(CheckBalanced("<svg><rect/>"), "");
}

TEST(RunReportTest, AnUnwritablePathIsAnError) {
  RunReport report({"/nonexistent-dir/r.html", "x", {}, ""});
  const Status s = report.OnEnd();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("/nonexistent-dir"), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace zinf::cli
