#include "cli/train_loop.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/units.h"

namespace zinf::cli {
namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int64_t SamplesAfter(const model::Trainer& trainer) {
  return trainer.step() * (trainer.tokens_per_step() / std::max(1, trainer.model().seq_len));
}

std::string FormatTimeShares(const TrainSummary& s) {
  const double t = std::max(s.seconds, 1e-9);
  auto pct = [&](double x) { return static_cast<int>(100.0 * x / t + 0.5); };
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "%.1f s: compute %d%%, waiting on nvme %d%%, pcie/gather %d%%, comm %d%%, optimizer %d%% "
                "(device idle %d%%)",
                s.seconds, pct(s.compute_seconds), pct(s.nvme_wait_seconds), pct(s.fetch_wait_seconds),
                pct(s.comm_seconds), pct(s.optimizer_seconds), pct(s.seconds - s.compute_seconds));
  return buf;
}

std::string FormatKernelTimes(const model::KernelTimes& k, double seconds, int top) {
  std::vector<std::pair<std::string, model::KernelTime>> ops(k.by_op.begin(), k.by_op.end());
  std::sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  const double busy = std::max(k.busy_seconds, 1e-12);
  char buf[128];
  std::snprintf(buf, sizeof(buf), "%.3f s on the device, %.0f%% busy:", k.busy_seconds,
                100.0 * k.busy_seconds / std::max(seconds, 1e-9));
  std::string line = buf;
  for (size_t i = 0; i < ops.size() && i < static_cast<size_t>(top); ++i) {
    std::snprintf(buf, sizeof(buf), "%s %s %.0f%% (%lld calls)", i ? "," : "", ops[i].first.c_str(),
                  100.0 * ops[i].second.seconds / busy, static_cast<long long>(ops[i].second.calls));
    line += buf;
  }
  if (ops.size() > static_cast<size_t>(top)) line += ", ...";
  return line;
}

StatusOr<TrainSummary> RunTraining(model::Trainer& trainer, const TrainRun& run) {
  TrainSummary s;
  s.first_step = trainer.step();
  FILE* out = run.progress;
  // The monitors still written to: metrics files are for watching a run, so
  // one that fails is warned of once and left out, and training goes on.
  std::vector<RunMonitor*> monitors = run.monitors;
  auto tell = [&](const std::function<Status(RunMonitor&)>& call) {
    std::erase_if(monitors, [&](RunMonitor* m) {
      const Status st = call(*m);
      if (st.ok()) return false;
      std::fprintf(out != nullptr ? out : stderr, "zinf train: warning: %s; training goes on without that file\n",
                   st.ToString().c_str());
      return true;
    });
  };
  auto evaluate = [&](double* into) -> Status {
    if (!trainer.can_evaluate()) return Status::Ok();  // too few held-out tokens: no evaluation
    StatusOr<double> e = trainer.Evaluate(run.eval_batches);
    ZINF_RETURN_IF_ERROR(e.status());
    *into = *e;
    s.evaluated = true;
    tell([&](RunMonitor& m) { return m.OnEval(trainer.step(), SamplesAfter(trainer), *e); });
    return Status::Ok();
  };
  ZINF_RETURN_IF_ERROR(evaluate(&s.eval_before));
  if (out && s.evaluated) {
    std::fprintf(out, "step %6lld  eval loss %.4f\n", static_cast<long long>(trainer.step()), s.eval_before);
  }
  std::vector<double> tok_per_s;
  std::vector<double> window;
  const int64_t print_every = std::max<int64_t>(1, run.steps_per_print);
  while (trainer.step() < run.steps) {
    ZINF_ASSIGN_OR_RETURN(model::StepReport r, trainer.Step());
    if (trainer.step() == s.first_step + 1) s.first_loss = r.loss;
    s.seconds += r.seconds;
    s.compute_seconds += r.compute_seconds;
    s.nvme_wait_seconds += static_cast<double>(r.engine.nvme_wait_ns) / 1e9;
    s.fetch_wait_seconds += static_cast<double>(r.engine.fetch_wait_ns) / 1e9;
    s.comm_seconds += static_cast<double>(r.engine.allgather_ns + r.engine.reduce_scatter_ns) / 1e9;
    s.optimizer_seconds += static_cast<double>(r.engine.optimizer_ns) / 1e9;
    AddCounters(s.moved, r.engine);
    s.kernels.Add(r.kernels);
    if (!monitors.empty()) {
      const StepMetrics metrics = MakeStepMetrics(r, SamplesAfter(trainer));
      tell([&](RunMonitor& m) { return m.OnStep(metrics); });
    }
    tok_per_s.push_back(static_cast<double>(r.tokens) / std::max(r.seconds, 1e-9));
    window.push_back(r.loss);
    if (out && run.exact_losses) {
      std::fprintf(out, "step %6lld  exact loss %.17g\n", static_cast<long long>(trainer.step()), r.loss);
    }
    const bool last = trainer.step() == run.steps;
    if (trainer.step() % print_every == 0 || last) {
      double mean = 0.0;
      for (double l : window) mean += l;
      mean /= static_cast<double>(window.size());
      s.last_loss = mean;
      window.clear();
      if (out) {
        const EngineCounters& c = r.engine;
        std::fprintf(
            out,
            "step %6lld/%lld  loss %.4f  lr %.2e  |g| %.3f%s  %s tok/s  step %.3f s: compute %.3f, "
            "wait nvme %.3f pcie %.3f comm %.3f optim %.3f  moved: nvme r %s w %s, optim %s, grad %s, h2d %s, d2h %s\n",
            static_cast<long long>(trainer.step()), static_cast<long long>(run.steps), mean, r.lr, r.grad_norm,
            r.applied ? "" : " (overflow: skipped)", FormatCount(static_cast<int64_t>(tok_per_s.back())).c_str(),
            r.seconds, r.compute_seconds, static_cast<double>(c.nvme_wait_ns) / 1e9,
            static_cast<double>(c.fetch_wait_ns) / 1e9, static_cast<double>(c.allgather_ns + c.reduce_scatter_ns) / 1e9,
            static_cast<double>(c.optimizer_ns) / 1e9, FormatBytes(c.nvme_read_bytes).c_str(),
            FormatBytes(c.nvme_write_bytes).c_str(), FormatBytes(c.optimizer_nvme_bytes).c_str(),
            FormatBytes(c.gradient_nvme_bytes).c_str(), FormatBytes(c.h2d_bytes).c_str(),
            FormatBytes(c.d2h_bytes).c_str());
        if (!r.kernels.by_op.empty()) {
          std::fprintf(out, "            kernels %s\n", FormatKernelTimes(r.kernels, r.seconds, 6).c_str());
        }
      }
    }
    const bool save_now =
        !run.save_dir.empty() && ((run.save_every > 0 && trainer.step() % run.save_every == 0) || last);
    if (save_now) {
      ZINF_ASSIGN_OR_RETURN(s.last_checkpoint, trainer.Save(run.save_dir, run.keep_checkpoints));
      if (out)
        std::fprintf(out, "step %6lld  checkpoint %s\n", static_cast<long long>(trainer.step()),
                     s.last_checkpoint.c_str());
    }
    if (run.eval_every > 0 && trainer.step() % run.eval_every == 0 && !last) {
      double e = 0.0;
      ZINF_RETURN_IF_ERROR(evaluate(&e));
      if (out && s.evaluated) {
        std::fprintf(out, "step %6lld  eval loss %.4f\n", static_cast<long long>(trainer.step()), e);
      }
    }
  }
  // The last step's optimizer update runs on after it returned: its error
  // (an I/O error, a full disk) must fail the run.
  ZINF_RETURN_IF_ERROR(trainer.engine().WaitForUpdate());
  s.steps = trainer.step();
  if (tok_per_s.size() > 1) tok_per_s.erase(tok_per_s.begin());  // the first step records the acquire order
  s.tokens_per_second = Median(tok_per_s);
  ZINF_RETURN_IF_ERROR(evaluate(&s.eval_after));
  if (out && s.evaluated) {
    std::fprintf(out, "step %6lld  eval loss %.4f\n", static_cast<long long>(trainer.step()), s.eval_after);
  }
  tell([](RunMonitor& m) { return m.OnEnd(); });
  if (!run.export_path.empty()) {
    const std::string& p = run.export_path;
    const bool one_file = p.size() >= 12 && p.compare(p.size() - 12, 12, ".safetensors") == 0;
    if (one_file) {
      ZINF_RETURN_IF_ERROR(trainer.ExportSafetensors(p, run.export_dtype));
    } else {
      ZINF_RETURN_IF_ERROR(trainer.ExportHfFolder(p, run.export_dtype, run.export_source.get()));
    }
    if (out) {
      std::fprintf(out, "exported %s weights to %s%s\n", run.export_dtype.c_str(), p.c_str(),
                   one_file ? "" : " (Hugging Face model folder)");
    }
  }
  return s;
}

}  // namespace zinf::cli
