#include "core/progress.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

namespace zinf {
namespace {

// What a meter printed, through a memory stream.
class Captured {
 public:
  Captured() { file_ = open_memstream(&buf_, &size_); }
  ~Captured() {
    if (file_ != nullptr) std::fclose(file_);
    std::free(buf_);
  }
  FILE* file() { return file_; }
  std::string text() {
    std::fflush(file_);
    return std::string(buf_, size_);
  }

 private:
  FILE* file_ = nullptr;
  char* buf_ = nullptr;
  size_t size_ = 0;
};

ProgressMeter::Options Opts(FILE* out, double* now, int tty) {
  ProgressMeter::Options o;
  o.out = out;
  o.label = "saving checkpoint /s/step-8";
  o.tty = tty;
  o.clock = [now] { return *now; };
  o.quiet_below_s = 0.0;
  return o;
}

TEST(ProgressTest, RateAndEta) {
  EXPECT_DOUBLE_EQ(ProgressMeter::Rate(300, 3.0), 100.0);
  EXPECT_DOUBLE_EQ(ProgressMeter::Rate(300, 0.0), 0.0);
  EXPECT_DOUBLE_EQ(ProgressMeter::Eta(300, 1000, 3.0), 7.0);  // 700 left at 100/s
  EXPECT_LT(ProgressMeter::Eta(0, 1000, 3.0), 0.0);           // nothing done: unknown
  EXPECT_LT(ProgressMeter::Eta(300, 0, 3.0), 0.0);            // no total: unknown
  EXPECT_DOUBLE_EQ(ProgressMeter::Eta(1000, 1000, 3.0), 0.0);
}

TEST(ProgressTest, Durations) {
  EXPECT_EQ(ProgressMeter::FormatDuration(4.4), "4 s");
  EXPECT_EQ(ProgressMeter::FormatDuration(125), "2 min 05 s");
  EXPECT_EQ(ProgressMeter::FormatDuration(3720), "1 h 02 min");
}

// Not a terminal: a line at each tenth of the work or every 5 s, then "done".
TEST(ProgressTest, PlainLinesAtTenthsAndIntervals) {
  Captured cap;
  double now = 100.0;
  {
    ProgressMeter m(Opts(cap.file(), &now, 0));
    const int64_t total = 100 << 20;  // 100 MiB
    now = 101.0;
    m.Update(5 << 20, total);  // 5%, 1 s: nothing yet
    EXPECT_EQ(cap.text(), "");
    now = 102.0;
    m.Update(10 << 20, total);  // 10%: a line
    now = 102.5;
    m.Update(12 << 20, total);  // same tenth, 0.5 s later: nothing
    now = 107.5;
    m.Update(13 << 20, total);  // 5 s since the last line: a line
    now = 110.0;
    m.Update(total, total);  // done
  }
  EXPECT_EQ(cap.text(),
            "saving checkpoint /s/step-8:  10% (10.00 MiB of 100.00 MiB), 5.00 MiB/s, ETA 18 s\n"
            "saving checkpoint /s/step-8:  13% (13.00 MiB of 100.00 MiB), 1.73 MiB/s, ETA 50 s\n"
            "saving checkpoint /s/step-8: 100% (100.00 MiB of 100.00 MiB), 10.00 MiB/s, done in 10 s\n");
}

// A terminal: one line redrawn in place (carriage return, erase to the end),
// at most every 0.1 s, and a newline when done.
TEST(ProgressTest, TerminalBarRedrawsInPlace) {
  Captured cap;
  double now = 0.0;
  ProgressMeter::Options o = Opts(cap.file(), &now, 1);
  o.bar_width = 10;
  o.label = "export";
  ProgressMeter m(o);
  now = 1.0;
  m.Update(1 << 20, 4 << 20);
  now = 1.05;
  m.Update(2 << 20, 4 << 20);  // too soon: not drawn
  now = 2.0;
  m.Update(2 << 20, 4 << 20);
  now = 4.0;
  m.Update(4 << 20, 4 << 20);
  EXPECT_EQ(cap.text(),
            "\rexport [##........]  25% 1.00 MiB/4.00 MiB  1.00 MiB/s  ETA 3 s\033[K"
            "\rexport [#####.....]  50% 2.00 MiB/4.00 MiB  1.00 MiB/s  ETA 2 s\033[K"
            "\rexport [##########] 100% 4.00 MiB/4.00 MiB  1.00 MiB/s  in 4 s\033[K\n");
}

TEST(ProgressTest, CountsAndUnknownTotals) {
  Captured cap;
  double now = 0.0;
  ProgressMeter::Options o = Opts(cap.file(), &now, 0);
  o.unit = ProgressMeter::Unit::kCount;
  o.count_name = "blocks";
  o.label = "measuring";
  ProgressMeter m(o);
  now = 6.0;
  m.Update(12, 0);  // no total: lines by interval only, no percent or ETA
  m.Finish();
  EXPECT_EQ(cap.text(), "measuring: 12 blocks, 2 blocks/s\nmeasuring: 12 blocks, 2 blocks/s\n");
}

// Work finished within quiet_below_s prints nothing; longer work prints from
// then on, and its final line.
TEST(ProgressTest, QuickWorkIsQuiet) {
  Captured cap;
  double now = 0.0;
  ProgressMeter::Options o = Opts(cap.file(), &now, 0);
  o.quiet_below_s = 1.0;
  o.label = "quick";
  {
    ProgressMeter m(o);
    now = 0.5;
    m.Update(50, 100);  // a new tenth, but too early
    now = 0.9;
    m.Update(100, 100);
  }
  EXPECT_EQ(cap.text(), "");
  now = 10.0;
  o.label = "slow";
  ProgressMeter m(o);
  now = 10.5;
  m.Update(20, 100);
  now = 11.5;
  m.Update(30, 100);
  now = 12.0;
  m.Update(100, 100);
  EXPECT_EQ(cap.text(),
            "slow:  30% (30 B of 100 B), 20 B/s, ETA 4 s\nslow: 100% (100 B of 100 B), 50 B/s, done in 2 s\n");
}

TEST(ProgressTest, FactoryWithoutOutputIsSilent) {
  EXPECT_FALSE(static_cast<bool>(MeterFactory(nullptr)));
  EXPECT_TRUE(static_cast<bool>(MeterFactory(stderr)));
}

}  // namespace
}  // namespace zinf
