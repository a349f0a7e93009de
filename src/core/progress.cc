#include "core/progress.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "core/units.h"

namespace zinf {

ProgressMeter::ProgressMeter(Options options) : o_(std::move(options)) {
  tty_ = o_.tty >= 0 ? o_.tty == 1 : (o_.out != nullptr && isatty(fileno(o_.out)) == 1);
  start_s_ = Now();
}

// Work that stopped short (an error) leaves the bar where it was: end its
// line, so that the error message starts on a line of its own.
ProgressMeter::~ProgressMeter() {
  if (!finished_ && total_ > 0 && done_ >= total_) {
    Finish();
  } else if (!finished_ && tty_ && drew_ && o_.out != nullptr) {
    std::fputc('\n', o_.out);
    std::fflush(o_.out);
  }
}

double ProgressMeter::Now() const {
  if (o_.clock) return o_.clock();
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double ProgressMeter::Rate(int64_t done, double elapsed_s) {
  return elapsed_s > 0 ? static_cast<double>(done) / elapsed_s : 0.0;
}

double ProgressMeter::Eta(int64_t done, int64_t total, double elapsed_s) {
  const double rate = Rate(done, elapsed_s);
  if (total <= 0 || done <= 0 || rate <= 0) return -1.0;
  return static_cast<double>(std::max<int64_t>(0, total - done)) / rate;
}

std::string ProgressMeter::FormatDuration(double seconds) {
  const int64_t s = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  char buf[48];
  if (s < 60) {
    std::snprintf(buf, sizeof(buf), "%lld s", static_cast<long long>(s));
  } else if (s < 3600) {
    std::snprintf(buf, sizeof(buf), "%lld min %02lld s", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  } else {
    std::snprintf(buf, sizeof(buf), "%lld h %02lld min", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60));
  }
  return buf;
}

std::string ProgressMeter::Amount(double v) const {
  if (o_.unit == Unit::kBytes) return FormatBytes(static_cast<int64_t>(v));
  return std::to_string(static_cast<int64_t>(v));
}

std::string ProgressMeter::Line(int64_t done, int64_t total, double elapsed_s, bool bar) const {
  std::string line = o_.label;
  const double rate = Rate(done, elapsed_s);
  const std::string rate_text = o_.unit == Unit::kBytes
                                    ? Amount(rate) + "/s"
                                    : FormatCount(static_cast<int64_t>(rate)) + " " + o_.count_name + "/s";
  char pct[16] = "";
  if (total > 0) {
    const double f = std::clamp(static_cast<double>(done) / static_cast<double>(total), 0.0, 1.0);
    std::snprintf(pct, sizeof(pct), "%3d%%", static_cast<int>(std::floor(f * 100.0)));
    if (bar) {
      const int fill = static_cast<int>(std::floor(f * o_.bar_width));
      line += " [" + std::string(fill, '#') + std::string(o_.bar_width - fill, '.') + "]";
    }
  }
  const std::string unit = o_.unit == Unit::kCount ? " " + o_.count_name : "";
  if (bar) {
    // Appended piece by piece: GCC 12 at -O3 takes `"/" + std::string` for
    // an overlapping memcpy (-Wrestrict, its bug 105651).
    line.append(" ").append(total > 0 ? std::string(pct) + " " : std::string()).append(Amount(done));
    if (total > 0) line.append("/").append(Amount(total));
    line.append(unit).append("  ").append(rate_text);
  } else {
    line += ": " +
            (total > 0 ? std::string(pct) + " (" + Amount(done) + " of " + Amount(total) + unit + ")"
                       : Amount(done) + unit) +
            ", " + rate_text;
  }
  const double eta = Eta(done, total, elapsed_s);
  if (total > 0 && done >= total) {
    line += bar ? "  in " + FormatDuration(elapsed_s) : ", done in " + FormatDuration(elapsed_s);
  } else if (eta >= 0) {
    line += (bar ? "  ETA " : ", ETA ") + FormatDuration(eta);
  }
  return line;
}

void ProgressMeter::Update(int64_t done, int64_t total) {
  done_ = done;
  total_ = total;
  if (o_.out == nullptr || finished_) return;
  const double now = Now();
  const double elapsed = now - start_s_;
  if (total > 0 && done >= total) {
    Finish();
    return;
  }
  if (elapsed < o_.quiet_below_s) return;
  if (tty_) {
    if (last_print_s_ >= 0 && now - last_print_s_ < o_.redraw_interval_s) return;
    std::fprintf(o_.out, "\r%s\033[K", Line(done, total, elapsed, true).c_str());
    std::fflush(o_.out);
    drew_ = true;
    last_print_s_ = now;
    return;
  }
  // Plain: at each new fraction step of the total, or when the interval passed.
  const int64_t step =
      total > 0 && o_.line_fraction > 0
          ? static_cast<int64_t>(std::floor(static_cast<double>(done) / static_cast<double>(total) / o_.line_fraction))
          : -1;
  const bool new_step = step > last_fraction_step_ && step > 0;
  const bool interval = now - (last_print_s_ >= 0 ? last_print_s_ : start_s_) >= o_.line_interval_s;
  if (step > last_fraction_step_) last_fraction_step_ = step;
  if (!new_step && !interval) return;
  std::fprintf(o_.out, "%s\n", Line(done, total, elapsed, false).c_str());
  std::fflush(o_.out);
  last_print_s_ = now;
}

void ProgressMeter::Finish() {
  if (finished_) return;
  finished_ = true;
  const double elapsed = Now() - start_s_;
  if (o_.out == nullptr || (elapsed < o_.quiet_below_s && last_print_s_ < 0)) return;
  const std::string line = Line(done_, total_, elapsed, tty_);
  if (tty_) {
    std::fprintf(o_.out, "\r%s\033[K\n", line.c_str());
  } else {
    std::fprintf(o_.out, "%s\n", line.c_str());
  }
  std::fflush(o_.out);
}

ProgressFactory MeterFactory(FILE* out) {
  if (out == nullptr) return {};
  return [out](const std::string& what) -> ProgressFn {
    ProgressMeter::Options o;
    o.out = out;
    o.label = what;
    auto meter = std::make_shared<ProgressMeter>(o);
    return [meter](int64_t done, int64_t total) { meter->Update(done, total); };
  };
}

}  // namespace zinf
