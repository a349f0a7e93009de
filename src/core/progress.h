// Progress of long work (checkpoint save and load, safetensors export and
// import, measurements): a bar with rate and ETA on a terminal, plain lines
// every few seconds or tenth of the work when the output is a file or pipe
// (a log keeps a readable record, not carriage returns).
//
// Lower layers take a ProgressFn and call it as work is done; they never
// print. The command line makes the ProgressMeter that draws it.
//
// Thread-safety: a ProgressMeter belongs to one thread at a time; a
// ProgressFn is called on the thread doing the work.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

namespace zinf {

// `done` of `total` units of one operation, non-decreasing; the last call
// has done == total. total 0: unknown.
using ProgressFn = std::function<void(int64_t done, int64_t total)>;
// Makes the ProgressFn for one operation named by `what` ("saving
// checkpoint /s/step-8"); may return an empty function (no report).
using ProgressFactory = std::function<ProgressFn(const std::string& what)>;

class ProgressMeter {
 public:
  enum class Unit { kBytes, kCount };
  struct Options {
    FILE* out = stderr;        // not owned; null: silent
    std::string label;         // what is being done
    Unit unit = Unit::kBytes;  // kCount: plain numbers, with `count_name` ("blocks")
    std::string count_name = "items";
    int tty = -1;                    // -1: isatty(fileno(out)); 0/1 force the style
    double line_interval_s = 5.0;    // plain style: a line at least this often...
    double line_fraction = 0.1;      // ...or at each such fraction of the total
    double redraw_interval_s = 0.1;  // terminal style: at most this often
    int bar_width = 28;
    // Work done sooner than this prints nothing (a small checkpoint saved
    // every few steps does not fill the log); longer work is reported from
    // then on, and its final line always.
    double quiet_below_s = 1.0;
    std::function<double()> clock;  // seconds, monotonic; empty: the steady clock
  };

  explicit ProgressMeter(Options options);
  // Reports `done` of `total` (0: unknown); prints when it is time to.
  void Update(int64_t done, int64_t total);
  // The final line (once; also on destruction if Update reached the total).
  void Finish();
  ~ProgressMeter();

  // The text of a report at `elapsed_s` (no newline or carriage return), as
  // either style prints it; for tests and for the callers' summaries.
  std::string Line(int64_t done, int64_t total, double elapsed_s, bool bar) const;
  // Units per second so far, and the seconds left at that rate (negative:
  // unknown: no total, or nothing done yet).
  static double Rate(int64_t done, double elapsed_s);
  static double Eta(int64_t done, int64_t total, double elapsed_s);
  // "4 s", "2 min 05 s", "1 h 02 min".
  static std::string FormatDuration(double seconds);

  bool tty() const { return tty_; }

 private:
  double Now() const;
  std::string Amount(double v) const;

  Options o_;
  bool tty_ = false;
  double start_s_ = 0;
  double last_print_s_ = -1;
  int64_t last_fraction_step_ = -1;
  int64_t done_ = 0, total_ = 0;
  bool drew_ = false;
  bool finished_ = false;
};

// A ProgressFactory printing to `out` (null: none), each operation its own
// meter in bytes.
ProgressFactory MeterFactory(FILE* out);

}  // namespace zinf
