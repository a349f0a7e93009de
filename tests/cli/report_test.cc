// perf/report: the benchmarks' HTML page. Text from callers must never
// become markup; the page must stand alone (no scripts, nothing fetched).
#include "report.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <string>

#include <gtest/gtest.h>

#include "core/fs.h"
#include "testing/text.h"

namespace zinf::perf {
namespace {

using test_support::Count;
using test_support::ReadAll;

TEST(HtmlEscape, EscapesEveryMarkupCharacter) {
  EXPECT_EQ(HtmlEscape("<a href=\"x\" title='y'>&amp;</a>"),
            "&lt;a href=&quot;x&quot; title=&#39;y&#39;&gt;&amp;amp;&lt;/a&gt;");
  EXPECT_EQ(HtmlEscape("plain text, 1.5 GB/s"), "plain text, 1.5 GB/s");
  EXPECT_EQ(HtmlEscape(""), "");
  EXPECT_EQ(HtmlEscape(std::string("nul\0byte", 8)), std::string("nul\0byte", 8));
  EXPECT_EQ(HtmlEscape("caf\xc3\xa9"), "caf\xc3\xa9");  // UTF-8 passes through
}

TEST(FormatFigure, FourSignificantDigits) {
  EXPECT_EQ(FormatFigure(0.1234), "0.1234");
  EXPECT_EQ(FormatFigure(12.3456), "12.35");
  EXPECT_EQ(FormatFigure(1234567), "1234567");
  EXPECT_EQ(FormatFigure(0.001234), "0.001234");
  EXPECT_EQ(FormatFigure(0), "0");
  EXPECT_EQ(FormatFigure(-2.5), "-2.500");
  EXPECT_EQ(FormatFigure(1.5e9), "1.5e+09");
  EXPECT_EQ(FormatFigure(NAN), "n/a");
  EXPECT_EQ(FormatFigure(INFINITY), "n/a");
}

// Hostile text everywhere a caller can put text.
constexpr char kEvil[] = "<script>alert('x')</script>&\"";
constexpr char kEvilEscaped[] = "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;";

HtmlReport EvilReport() {
  HtmlReport r(kEvil);
  r.AddParagraph(kEvil);
  r.AddTable(kEvil, {kEvil, "b"}, {{kEvil, "1"}, {"2", kEvil}});
  BarChart bars;
  bars.title = kEvil;
  bars.x_label = kEvil;
  bars.y_label = kEvil;
  bars.categories = {kEvil, "b"};
  bars.series = {{kEvil, {1.0, 2.0}}, {"other", {NAN, 3.0}}};
  r.AddBarChart(bars);
  bars.lines = true;
  r.AddBarChart(bars);
  Heatmap map;
  map.title = kEvil;
  map.x_label = kEvil;
  map.y_label = "queue depth";
  map.value_label = kEvil;
  map.columns = {kEvil, "1M"};
  map.rows = {"4", kEvil};
  map.values = {{1.0, 2.0}, {NAN, 4.0}};
  r.AddHeatmap(map);
  Timeline tl;
  tl.title = kEvil;
  tl.unit = "s";
  tl.segment_names = {kEvil, "wait"};
  tl.rows = {{kEvil, {1.0, 0.5}}, {"step 2", {NAN, -1.0}}};
  tl.markers = {{kEvil, 1.2}};
  r.AddTimeline(tl);
  r.SetJson(std::string("{\"x\": \"") + kEvil + "</pre>\"}");
  return r;
}

TEST(HtmlReport, CallerTextNeverBecomesMarkup) {
  const std::string page = EvilReport().Render();
  EXPECT_EQ(page.find("<script"), std::string::npos);
  EXPECT_EQ(page.find("alert('x')"), std::string::npos);
  EXPECT_GE(Count(page, kEvilEscaped), 20u);
  // The JSON cannot close its <pre> early: exactly one </pre>, at the end.
  EXPECT_EQ(Count(page, "</pre>"), 1u);
  EXPECT_NE(page.find("&lt;/pre&gt;"), std::string::npos);
}

TEST(HtmlReport, PageIsSelfContained) {
  const std::string page = EvilReport().Render();
  EXPECT_EQ(page.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(page.find("<style>"), std::string::npos);
  EXPECT_EQ(Count(page, "<svg"), 4u);  // two bar charts, a heatmap, a timeline
  EXPECT_EQ(Count(page, "<svg"), Count(page, "</svg>"));
  std::string stripped = page;
  for (size_t at; (at = stripped.find("http://www.w3.org/2000/svg")) != std::string::npos;) stripped.erase(at, 26);
  for (const char* external : {"http://", "https://", "url(", "@import", "<link", "<img", "<iframe"}) {
    EXPECT_EQ(stripped.find(external), std::string::npos) << external;
  }
  EXPECT_TRUE(page.size() > 100 && page.substr(page.size() - 8) == "</html>\n");
}

TEST(HtmlReport, GapsAreShownNotDrawn) {
  HtmlReport r("gaps");
  Heatmap map;
  map.title = "grid";
  map.columns = {"a", "b"};
  map.rows = {"x"};
  map.values = {{NAN, 1.0}};  // and a missing row's cells
  map.rows.push_back("y");
  r.AddHeatmap(map);
  const std::string page = r.Render();
  EXPECT_EQ(Count(page, "not measured"), 3u + 1u);  // three grey cells' titles, and the legend
  EXPECT_EQ(page.find("nan"), std::string::npos);
  EXPECT_EQ(page.find("inf"), std::string::npos);
}

TEST(HtmlReport, TimelineStacksSegmentsInOrder) {
  HtmlReport r("t");
  Timeline tl;
  tl.title = "steps";
  tl.unit = "s";
  tl.segment_names = {"compute", "wait"};
  tl.rows = {{"step 1", {2.0, 1.0}}};
  r.AddTimeline(tl);
  const std::string page = r.Render();
  const size_t compute = page.find("<title>step 1: compute 2.000 s</title>");
  const size_t wait = page.find("<title>step 1: wait 1.000 s</title>");
  ASSERT_NE(compute, std::string::npos);
  ASSERT_NE(wait, std::string::npos);
  EXPECT_LT(compute, wait);
}

TEST(EmitResult, WritesJsonAndPage) {
  char tmpl[] = "/tmp/zinf-report-test.XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  HtmlReport r("bench <x>");
  r.AddParagraph("hello");
  const std::string json = "{\n  \"ratio_to_bound\": 1.02\n}";
  ASSERT_TRUE(EmitResult(json, JoinPath(dir, "out.json"), JoinPath(dir, "out.html"), r).ok());
  EXPECT_EQ(ReadAll(JoinPath(dir, "out.json")), json + "\n");
  const std::string page = ReadAll(JoinPath(dir, "out.html"));
  EXPECT_NE(page.find("&quot;ratio_to_bound&quot;: 1.02"), std::string::npos);
  EXPECT_NE(page.find("<h1>bench &lt;x&gt;</h1>"), std::string::npos);
  EXPECT_EQ(page, r.Render());
  // A directory that does not exist is an error, not a crash.
  EXPECT_FALSE(EmitResult(json, "", JoinPath(dir, "missing/out.html"), r).ok());
  ASSERT_TRUE(RemoveTree(dir).ok());
}

}  // namespace
}  // namespace zinf::perf
