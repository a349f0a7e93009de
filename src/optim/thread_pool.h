// ThreadPool: a fixed set of worker threads for the optimizer's data-parallel
// loops (Adam update, gradient norm, casts, the bandwidth probe).
//
// The optimizer step is bound by memory bandwidth, so the pool is built once
// and reused: no thread is created per step. ParallelFor cuts [0, n) into
// chunks of `grain` elements (the last one shorter) and the workers take
// chunks in turn from a shared counter, so a core slowed by other work costs
// only its share. Chunk boundaries depend on n and grain only, never on the
// number of threads; callers that reduce per chunk (the gradient norm) get the
// same result with any thread count.
//
// With Options::bind_threads, worker i is bound (hwloc) to core i mod cores,
// so each worker keeps its caches and its NUMA node; binding failures are
// logged once and otherwise ignored (binding is an optimisation).
//
// Thread-safety: ParallelFor may be called by one thread at a time (checked);
// `fn` runs concurrently on distinct chunks and must not throw. The pool is
// not re-entrant: `fn` must not call ParallelFor on the same pool.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "zinf/status.h"

namespace zinf::optim {

// A non-owning reference to a callable (no allocation, unlike std::function).
// The callable must outlive the FunctionRef.
template <typename Fn>
class FunctionRef;

template <typename R, typename... Args>
class FunctionRef<R(Args...)> {
 public:
  template <typename F, typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, FunctionRef>>>
  FunctionRef(F&& f)  // NOLINT: implicit by design
      : obj_(const_cast<void*>(static_cast<const void*>(&f))), call_([](void* obj, Args... args) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(obj))(std::forward<Args>(args)...);
        }) {}
  R operator()(Args... args) const { return call_(obj_, std::forward<Args>(args)...); }

 private:
  void* obj_;
  R (*call_)(void*, Args...);
};

class ThreadPool {
 public:
  struct Options {
    int num_threads = 0;              // 0: one per physical core
    bool bind_threads = true;         // bind worker i to core i mod cores (hwloc)
    std::string name = "zinf-optim";  // thread names: "<name>-<i>", cut to 15 chars
  };

  // Starts the workers. Errors: num_threads < 0 or > 1024 (kInvalidArgument);
  // the OS refusing a thread (kResourceExhausted).
  static StatusOr<std::unique_ptr<ThreadPool>> Create(const Options& options);
  // Stops and joins the workers. Must not race with ParallelFor.
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()); }
  // Whether every worker was bound to a core.
  bool bound() const { return bound_; }

  // Calls fn(chunk_index, begin, end) for every chunk [begin, end) of [0, n),
  // chunk k being [k*grain, min(n, (k+1)*grain)); returns when all are done.
  // Runs on the calling thread when there is a single chunk. grain > 0.
  void ParallelFor(int64_t n, int64_t grain, FunctionRef<void(int64_t, int64_t, int64_t)> fn);

  // The number of physical cores hwloc sees (at least 1).
  static int NumCores();

 private:
  ThreadPool() = default;
  Status Start(const Options& options);
  void WorkerLoop();
  void RunChunks();

  std::vector<std::thread> workers_;
  bool bound_ = false;

  // The current job; written under mu_ before generation_ moves on.
  std::mutex mu_;
  std::condition_variable work_cv_;  // workers wait for a new generation
  std::condition_variable done_cv_;  // the caller waits for pending_ == 0
  uint64_t generation_ = 0;          // guarded by mu_
  int pending_ = 0;                  // workers yet to finish this job; guarded by mu_
  bool stop_ = false;                // guarded by mu_
  const FunctionRef<void(int64_t, int64_t, int64_t)>* job_fn_ = nullptr;
  int64_t job_n_ = 0;
  int64_t job_grain_ = 0;
  int64_t job_chunks_ = 0;
  std::atomic<int64_t> next_chunk_{0};
  std::atomic<bool> busy_{false};  // a ParallelFor is running (misuse check)
};

}  // namespace zinf::optim
