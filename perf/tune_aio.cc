// zinf tune aio --config IN --out OUT: finds the fastest aio settings for the
// config's nvme paths and writes them into a copy of the config.
//
// Search. A full grid (block size x queue depth x threads x two switches) is
// ~200 trials; coordinate descent finds the same peak on real drives in
// ~15: start from the config's aio section, sweep one knob at a time with
// the others at the best found so far, keep the best, and move on. A trial
// writes then reads `--size` bytes per path through what training uses: one
// IoEngine with the trial's settings under a swap::SwapStore striped over all
// the paths (so thread_count means what it means in training: rings in all,
// not per path). It scores the harmonic mean of the write and read rates
// (total bytes over total time). Trials stop when the time budget is spent;
// the table shows what was measured.
//
// OUT is IN with only the aio keys replaced (other keys, their order and
// values are kept), written crash-safely: temp file, fsync, rename.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "aio/file.h"
#include "aio/pinned_pool.h"
#include "aio/throughput.h"
#include "cli/command.h"
#include "core/fs.h"
#include "core/progress.h"
#include "core/units.h"
#include "report.h"
#include "swap/swap_store.h"
#include "zinf/config.h"

namespace zinf::perf {
namespace {

struct Trial {
  AioConfig aio;
  double write_gbps = 0;
  double read_gbps = 0;
  double score = 0;  // harmonic mean of write and read
  std::string error;
};

auto Key(const AioConfig& a) {
  return std::make_tuple(a.block_size, a.queue_depth, a.thread_count, a.single_submit, a.overlap_events);
}

std::string Describe(const AioConfig& a) {
  char buf[160];
  std::snprintf(buf, sizeof(buf),
                "block_size=%-5s queue_depth=%-3lld thread_count=%-2lld single_submit=%d overlap_events=%d",
                FormatBytes(a.block_size).c_str(), static_cast<long long>(a.queue_depth),
                static_cast<long long>(a.thread_count), a.single_submit ? 1 : 0, a.overlap_events ? 1 : 0);
  return buf;
}

// The trials' swap files. A trial reuses the previous trial's files when its
// stripe (and so its layout) is the same (a fixed run id), so its writes
// overwrite written blocks, as training's do after the first step; another
// stripe removes them first, so SwapStore has no stale file to replace.
class TrialFiles {
 public:
  static constexpr const char* kPrefix = ".zinf-tune-aio";
  static constexpr const char* kRunId = "zinf-tune-aio";

  void Prepare(int64_t stripe_bytes) {
    if (stripe_bytes != stripe_bytes_) Remove();
    stripe_bytes_ = stripe_bytes;
  }
  void Keep(const std::vector<std::string>& paths) { paths_ = paths; }
  void Remove() {
    std::error_code ec;
    for (const std::string& p : paths_) std::filesystem::remove(p, ec);
    paths_.clear();
  }

 private:
  int64_t stripe_bytes_ = 0;
  std::vector<std::string> paths_;
};

// Writes then reads all of `store`'s one tensor in requests as large as
// `buffers`; fills `t`'s rates or its error.
void TimePasses(swap::SwapStore& store, std::span<aio::PinnedBuffer> buffers, Trial& t) {
  aio::PassTarget target;
  target.submit = [&store](aio::IoOp op, int64_t off, void* buf, int64_t len) -> StatusOr<aio::IoTicket> {
    auto h = op == aio::IoOp::kWrite ? store.SwapOutRange(0, off, len, buf) : store.SwapInRange(0, off, len, buf);
    if (!h.ok()) return h.status();
    return aio::IoTicket{h->id};
  };
  target.wait = [&store](aio::IoTicket ticket) { return store.Wait(swap::SwapHandle{ticket.id}); };
  const int64_t bytes = store.tensor(0).size_bytes;
  auto w = aio::TimedPass(target, aio::IoOp::kWrite, bytes, buffers);
  auto r = w.ok() ? aio::TimedPass(target, aio::IoOp::kRead, bytes, buffers) : StatusOr<aio::PassResult>(w.status());
  if (!r.ok()) {
    t.error = r.status().ToString();
    return;
  }
  t.write_gbps = w->gbps();
  t.read_gbps = r->gbps();
  t.score = 2.0 * static_cast<double>(bytes) / (w->seconds + r->seconds) / 1e9;
}

Trial RunTrial(const std::vector<std::string>& dirs, int64_t per_path_bytes, const AioConfig& aio, TrialFiles& files) {
  Trial t;
  t.aio = aio;
  aio::IoEngineOptions eo = aio::FromAioConfig(aio);
  eo.direct_io = aio::DirectIo::kRequire;
  auto engine = aio::CreateIoEngine(eo);
  if (!engine.ok()) {
    t.error = engine.status().ToString();
    return t;
  }
  swap::SwapStoreOptions so;
  so.paths = dirs;
  so.file_prefix = TrialFiles::kPrefix;
  so.run_id = TrialFiles::kRunId;
  so.stripe_bytes = AlignUp(std::max<int64_t>(aio.block_size, kMiB), so.alignment_bytes);
  so.checksums = false;  // the drives' rates, not crc32c's
  const int64_t bytes = per_path_bytes * static_cast<int64_t>(dirs.size());
  files.Prepare(so.stripe_bytes);
  auto store = swap::SwapStore::Create(engine->get(), {{"tune aio", bytes, 1}}, so);
  if (!store.ok()) {
    t.error = store.status().ToString();
    return t;
  }
  files.Keep((*store)->file_paths());
  // Enough bytes outstanding for every ring to be full, capped so large
  // settings do not pin gigabytes; whole stripes, as ranges of the tensor.
  const int64_t in_flight = aio.block_size * aio.queue_depth * aio.thread_count;
  const int64_t request = AlignUp(std::clamp<int64_t>(in_flight, so.stripe_bytes, 128 * kMiB), so.stripe_bytes);
  aio::PinnedPoolOptions po;
  po.buffer_count = 3;
  po.buffer_bytes = request;
  po.alignment_bytes = (*store)->alignment_bytes();
  po.name = "tune aio buffers";
  auto pool = aio::PinnedPool::Create(po);
  if (!pool.ok()) {
    t.error = pool.status().ToString();
    return t;
  }
  auto region = (*pool)->region();
  if (Status st = (*engine)->RegisterMemory(region.data(), region.size()); !st.ok()) {
    t.error = st.ToString();
    return t;
  }
  std::vector<aio::PinnedBuffer> buffers;
  for (int i = 0; i < 3; ++i) buffers.push_back((*pool)->Acquire());
  TimePasses(**store, buffers, t);
  return t;
}

nlohmann::ordered_json TrialJson(const Trial& t) {
  nlohmann::ordered_json j;
  j["block_size"] = t.aio.block_size;
  j["queue_depth"] = t.aio.queue_depth;
  j["thread_count"] = t.aio.thread_count;
  j["single_submit"] = t.aio.single_submit;
  j["overlap_events"] = t.aio.overlap_events;
  j["write_gbps"] = t.write_gbps;
  j["read_gbps"] = t.read_gbps;
  j["score"] = t.score;
  if (!t.error.empty()) j["error"] = t.error;
  return j;
}

// --json: the trials in the order run and the best; --html: that JSON with
// a block size x queue depth heatmap of the scores and a chart of the trials.
// The heatmap shows, per cell, the best score among trials with the best
// trial's other knobs (thread_count, single_submit, overlap_events); cells
// the descent did not visit are grey (--grid visits them all).
Status WriteReports(const cli::Flags& flags, const std::vector<std::string>& dirs, int64_t per_path,
                    const std::vector<Trial>& trials, const AioConfig& best, const std::vector<int64_t>& block_sizes,
                    const std::vector<int64_t>& depths) {
  const std::string json_path = flags.GetOr("json", ""), html_path = flags.GetOr("html", "");
  if (json_path.empty() && html_path.empty()) return Status::Ok();
  nlohmann::ordered_json j;
  j["tune"] = "aio";
  j["paths"] = dirs;
  j["bytes_per_path_per_trial"] = per_path;
  j["score"] = "harmonic mean of write and read GB/s (1e9 B/s): total bytes over total time";
  const Trial* best_trial = nullptr;
  for (const Trial& t : trials) {
    if (Key(t.aio) == Key(best)) best_trial = &t;
  }
  j["best"] = best_trial ? TrialJson(*best_trial) : nlohmann::ordered_json();
  j["trials"] = nlohmann::ordered_json::array();
  for (const Trial& t : trials) j["trials"].push_back(TrialJson(t));
  const std::string text = j.dump(2);
  if (!json_path.empty()) ZINF_RETURN_IF_ERROR(WriteFileAtomic(json_path, text + "\n"));
  if (html_path.empty()) return Status::Ok();

  HtmlReport report("zinf tune aio: " + std::to_string(dirs.size()) + " path(s), " + FormatBytes(per_path) +
                    " per path per trial");
  report.AddParagraph(
      "Coordinate descent over the aio knobs; each trial writes then reads the bytes through a "
      "swap store striped over all paths, as training does. Score: " +
      j["score"].get<std::string>() + ".");
  std::vector<std::vector<std::string>> rows;
  std::vector<Trial> ranked = trials;
  std::sort(ranked.begin(), ranked.end(), [](const Trial& a, const Trial& b) { return a.score > b.score; });
  for (size_t i = 0; i < ranked.size() && i < 10; ++i) {
    const Trial& t = ranked[i];
    rows.push_back({std::to_string(i + 1), FormatBytes(t.aio.block_size), std::to_string(t.aio.queue_depth),
                    std::to_string(t.aio.thread_count), t.aio.single_submit ? "true" : "false",
                    t.aio.overlap_events ? "true" : "false", FormatFigure(t.write_gbps), FormatFigure(t.read_gbps),
                    FormatFigure(t.score) + (Key(t.aio) == Key(best) ? " (best)" : "") +
                        (t.error.empty() ? "" : " failed: " + t.error)});
  }
  report.AddTable("Best trials",
                  {"rank", "block", "queue_depth", "thread_count", "single_submit", "overlap_events", "write GB/s",
                   "read GB/s", "score"},
                  rows);
  Heatmap map;
  map.title = "Score by block size and queue depth (other knobs as the best trial's)";
  map.x_label = "block size";
  map.y_label = "queue depth";
  map.value_label = "score GB/s";
  for (int64_t b : block_sizes) map.columns.push_back(FormatBytes(b));
  for (int64_t d : depths) {
    map.rows.push_back(std::to_string(d));
    std::vector<double> row;
    for (int64_t b : block_sizes) {
      double v = std::nan("");
      for (const Trial& t : trials) {
        if (t.aio.block_size == b && t.aio.queue_depth == d && t.aio.thread_count == best.thread_count &&
            t.aio.single_submit == best.single_submit && t.aio.overlap_events == best.overlap_events &&
            t.error.empty()) {
          v = std::isnan(v) ? t.score : std::max(v, t.score);
        }
      }
      row.push_back(v);
    }
    map.values.push_back(row);
  }
  report.AddHeatmap(map);
  BarChart chart;
  chart.title = "Trials in the order run (GB/s)";
  chart.x_label = "trial";
  chart.y_label = "GB/s";
  chart.lines = true;
  chart.series = {{"write", {}}, {"read", {}}, {"score", {}}};
  for (size_t i = 0; i < trials.size(); ++i) {
    chart.categories.push_back(std::to_string(i + 1));
    const bool ok = trials[i].error.empty();
    chart.series[0].values.push_back(ok ? trials[i].write_gbps : std::nan(""));
    chart.series[1].values.push_back(ok ? trials[i].read_gbps : std::nan(""));
    chart.series[2].values.push_back(ok ? trials[i].score : std::nan(""));
  }
  report.AddBarChart(chart);
  report.SetJson(text);
  return report.WriteFile(html_path);
}

// OUT = IN with the aio keys replaced by `best`'s; the rest kept as written.
// Checks that OUT parses as a config.
Status WriteTunedConfig(const std::string& in_path, const std::string& out_path, const AioConfig& best) {
  std::ifstream in(in_path);
  std::stringstream text;
  text << in.rdbuf();
  auto json = nlohmann::ordered_json::parse(text.str(), nullptr, false);
  if (json.is_discarded() || !json.is_object()) return Status::InvalidArgument(in_path + ": not a JSON object");
  auto& aio = json["aio"];
  if (!aio.is_object()) aio = nlohmann::ordered_json::object();
  aio["block_size"] = best.block_size;
  aio["queue_depth"] = best.queue_depth;
  aio["thread_count"] = best.thread_count;
  aio["single_submit"] = best.single_submit;
  aio["overlap_events"] = best.overlap_events;
  ZINF_RETURN_IF_ERROR(WriteFileAtomic(out_path, json.dump(2) + "\n"));
  auto check = LoadConfigFile(out_path);
  if (!check.ok()) return check.status().WithContext("the written config does not parse");
  return Status::Ok();
}

int Run(const std::vector<std::string>& args) {
  auto flags = cli::Flags::Parse(args, {"config", "out", "size", "budget-s", "nvme", "html", "json"}, {"grid"});
  if (!flags.ok()) return cli::Fail("tune aio", flags.status(), 2);
  const auto in_path = flags->Get("config");
  const auto out_path = flags->Get("out");
  if (!in_path || !out_path) {
    return cli::Fail("tune aio", Status::InvalidArgument("--config IN and --out OUT are required"), 2);
  }
  auto size = flags->GetInt("size", 512 * kMiB);
  auto budget = flags->GetInt("budget-s", 120);
  for (const auto* v : {&size, &budget}) {
    if (!v->ok()) return cli::Fail("tune aio", v->status(), 2);
  }
  auto config = LoadConfigFile(*in_path);
  if (!config.ok()) return cli::Fail("tune aio", config.status(), 2);
  Config resolved = *config;
  Status st = ResolveAuto(resolved, AutoContext{});
  if (!st.ok()) return cli::Fail("tune aio", st, 2);

  std::vector<std::string> dirs = flags->GetAll("nvme");
  if (dirs.empty()) {
    std::set<std::string> seen;
    for (const auto* list : {&resolved.zero.offload_param.nvme_paths, &resolved.zero.offload_optimizer.nvme_paths}) {
      for (const auto& p : *list) {
        if (seen.insert(p).second) dirs.push_back(p);
      }
    }
  }
  if (dirs.empty()) {
    return cli::Fail("tune aio", Status::InvalidArgument(*in_path + " names no nvme_paths (or pass --nvme DIR)"), 2);
  }
  const int64_t per_path = AlignUp(*size, 4 * kMiB);

  // The knobs and the values tried for each, in sweep order.
  const std::vector<int64_t> block_sizes = {256 * kKiB, 512 * kKiB, 1 * kMiB, 2 * kMiB, 4 * kMiB};
  const std::vector<int64_t> depths = {4, 8, 16, 32, 64};
  std::vector<int64_t> thread_counts = {1, 2, 4};
  const int64_t ndirs = static_cast<int64_t>(dirs.size());
  if (std::find(thread_counts.begin(), thread_counts.end(), ndirs) == thread_counts.end())
    thread_counts.push_back(ndirs);

  std::map<decltype(Key(AioConfig{})), Trial> done;
  std::vector<Trial> order;
  TrialFiles files;
  const auto start = std::chrono::steady_clock::now();
  auto elapsed_s = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  bool out_of_time = false;
  AioConfig best = resolved.aio;
  const int total_planned = static_cast<int>(block_sizes.size() + depths.size() + thread_counts.size() + 4);
  auto measure = [&](const AioConfig& a) -> const Trial* {
    auto it = done.find(Key(a));
    if (it != done.end()) return &it->second;
    if (elapsed_s() > static_cast<double>(*budget)) {
      out_of_time = true;
      return nullptr;
    }
    // ETA at the rate so far, within what is left of the budget.
    double eta = ProgressMeter::Eta(static_cast<int64_t>(order.size()), total_planned, elapsed_s());
    if (eta >= 0) eta = std::min(eta, std::max(0.0, static_cast<double>(*budget) - elapsed_s()));
    std::fprintf(stderr, "[%2zu/~%d %5.1fs%s] %s ... ", order.size() + 1, total_planned, elapsed_s(),
                 eta >= 0 ? (", ETA " + ProgressMeter::FormatDuration(eta)).c_str() : "", Describe(a).c_str());
    std::fflush(stderr);
    Trial t = RunTrial(dirs, per_path, a, files);
    if (t.error.empty()) {
      std::fprintf(stderr, "write %.2f read %.2f GB/s, score %.2f\n", t.write_gbps, t.read_gbps, t.score);
    } else {
      std::fprintf(stderr, "failed: %s\n", t.error.c_str());
    }
    order.push_back(t);
    return &(done[Key(a)] = t);
  };
  std::fprintf(stderr, "tune aio: %zu path(s), %s per path per trial, budget %llds\n", dirs.size(),
               FormatBytes(per_path).c_str(), static_cast<long long>(*budget));
  const Trial* base = measure(best);
  if (base == nullptr || !base->error.empty()) {
    files.Remove();
    return cli::Fail("tune aio", Status::IoError("the config's own aio settings cannot run: " +
                                                 (base ? base->error : std::string("no time"))));
  }
  auto sweep = [&](auto set, const auto& values) {
    for (const auto& v : values) {
      AioConfig a = best;
      set(a, v);
      const Trial* t = measure(a);
      if (t == nullptr) return;
      if (t->error.empty() && t->score > done[Key(best)].score) best = a;
    }
  };
  sweep([](AioConfig& a, int64_t v) { a.block_size = v; }, block_sizes);
  sweep([](AioConfig& a, int64_t v) { a.queue_depth = v; }, depths);
  sweep([](AioConfig& a, int64_t v) { a.thread_count = v; }, thread_counts);
  sweep([](AioConfig& a, bool v) { a.single_submit = v; }, std::vector<bool>{false, true});
  sweep([](AioConfig& a, bool v) { a.overlap_events = v; }, std::vector<bool>{true, false});
  if (flags->Has("grid")) {
    // The whole block size x queue depth grid at the best other knobs (for
    // the heatmap); a better cell found here becomes the best.
    const AioConfig at = best;
    for (int64_t b : block_sizes) {
      for (int64_t d : depths) {
        AioConfig a = at;
        a.block_size = b;
        a.queue_depth = d;
        const Trial* t = measure(a);
        if (t == nullptr) break;
        if (t->error.empty() && t->score > done[Key(best)].score) best = a;
      }
    }
  }
  const std::vector<Trial> measured = order;  // in the order run
  files.Remove();
  if (out_of_time) std::fprintf(stderr, "tune aio: time budget spent; best of %zu trials\n", order.size());

  std::sort(order.begin(), order.end(), [](const Trial& a, const Trial& b) { return a.score > b.score; });
  std::printf("%-4s %-9s %-11s %-12s %-13s %-14s %-10s %-10s %-8s\n", "rank", "block", "queue_depth", "thread_count",
              "single_submit", "overlap_events", "write GB/s", "read GB/s", "score");
  for (size_t i = 0; i < order.size(); ++i) {
    const Trial& t = order[i];
    std::printf("%-4zu %-9s %-11lld %-12lld %-13s %-14s %-10.2f %-10.2f %-8.2f%s\n", i + 1,
                FormatBytes(t.aio.block_size).c_str(), static_cast<long long>(t.aio.queue_depth),
                static_cast<long long>(t.aio.thread_count), t.aio.single_submit ? "true" : "false",
                t.aio.overlap_events ? "true" : "false", t.write_gbps, t.read_gbps, t.score,
                t.error.empty() ? (Key(t.aio) == Key(best) ? "  <- best" : "") : ("  failed: " + t.error).c_str());
  }

  st = WriteTunedConfig(*in_path, *out_path, best);
  if (!st.ok()) return cli::Fail("tune aio", st);
  std::fprintf(stderr, "tune aio: wrote %s (best: %s)\n", out_path->c_str(), Describe(best).c_str());
  if (Status r = WriteReports(*flags, dirs, per_path, measured, best, block_sizes, depths); !r.ok()) {
    return cli::Fail("tune aio", r);
  }
  return 0;
}

ZINF_COMMAND({"tune aio", "sweep aio settings on the config's nvme paths; write the best into a config",
              "tune aio --config IN --out OUT [--size 512M] [--budget-s 120] [--nvme DIR ...] [--grid]\n"
              "         [--html OUT.html] [--json OUT.json]\n"
              "  Sweeps block_size, queue_depth, thread_count, single_submit and overlap_events one\n"
              "  at a time (coordinate descent from IN's aio section) on IN's nvme_paths (or --nvme),\n"
              "  each trial writing then reading --size bytes per path striped over all paths.\n"
              "  Progress on stderr, a ranked table on stdout; OUT is IN with the best aio section\n"
              "  (written crash-safely). Stops starting trials after --budget-s seconds.\n"
              "  --grid then measures the whole block size x queue depth grid at the best other knobs.\n"
              "  --json writes the trials as JSON; --html a page with them, a block size x queue depth\n"
              "  heatmap of the scores and a chart of the trials.",
              Run});

}  // namespace
}  // namespace zinf::perf
