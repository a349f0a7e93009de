#include "optim/thread_pool.h"

#include <pthread.h>

#include <algorithm>
#include <system_error>

#include <hwloc.h>

#include "core/check.h"
#include "core/log.h"

namespace zinf::optim {
namespace {

// hwloc's topology, loaded once (it is slow to load and never changes).
class Topology {
 public:
  static Topology& Get() {
    static Topology t;
    return t;
  }
  int num_cores() const { return num_cores_; }
  // Binds the calling thread to core `index` mod cores. False on failure.
  bool BindCurrentThread(int index) {
    if (!ok_ || num_cores_ == 0) return false;
    std::lock_guard<std::mutex> lock(mu_);
    hwloc_obj_t core = hwloc_get_obj_by_type(topo_, HWLOC_OBJ_CORE, static_cast<unsigned>(index % num_cores_));
    if (core == nullptr || core->cpuset == nullptr) return false;
    return hwloc_set_cpubind(topo_, core->cpuset, HWLOC_CPUBIND_THREAD) == 0;
  }

 private:
  Topology() {
    ok_ = hwloc_topology_init(&topo_) == 0 && hwloc_topology_load(topo_) == 0;
    if (ok_) num_cores_ = std::max(0, hwloc_get_nbobjs_by_type(topo_, HWLOC_OBJ_CORE));
  }
  ~Topology() { hwloc_topology_destroy(topo_); }
  std::mutex mu_;  // hwloc calls on one topology are not documented thread-safe for binding
  hwloc_topology_t topo_ = nullptr;
  bool ok_ = false;
  int num_cores_ = 0;
};

}  // namespace

int ThreadPool::NumCores() {
  const int cores = Topology::Get().num_cores();
  if (cores > 0) return cores;
  return std::max(1u, std::thread::hardware_concurrency());
}

StatusOr<std::unique_ptr<ThreadPool>> ThreadPool::Create(const Options& options) {
  if (options.num_threads < 0 || options.num_threads > 1024) {
    return Status::InvalidArgument("thread pool: num_threads must be in [0, 1024], got " +
                                   std::to_string(options.num_threads));
  }
  std::unique_ptr<ThreadPool> pool(new ThreadPool());
  ZINF_RETURN_IF_ERROR(pool->Start(options));
  return pool;
}

Status ThreadPool::Start(const Options& options) {
  const int n = options.num_threads > 0 ? options.num_threads : NumCores();
  std::atomic<int> bound_count{0};
  std::atomic<int> started{0};
  workers_.reserve(static_cast<size_t>(n));
  try {
    for (int i = 0; i < n; ++i) {
      workers_.emplace_back([this, i, &options, &bound_count, &started] {
        const std::string name = (options.name + "-" + std::to_string(i)).substr(0, 15);
        pthread_setname_np(pthread_self(), name.c_str());
        if (options.bind_threads && Topology::Get().BindCurrentThread(i)) bound_count.fetch_add(1);
        started.fetch_add(1);
        started.notify_one();
        WorkerLoop();
      });
    }
  } catch (const std::system_error& e) {
    // Let the threads that did start finish with the locals they reference;
    // the destructor then stops and joins them.
    const int running = static_cast<int>(workers_.size());
    for (int s = started.load(); s < running; s = started.load()) started.wait(s);
    return Status::ResourceExhausted("thread pool: cannot start thread " + std::to_string(workers_.size()) + " of " +
                                     std::to_string(n) + ": " + e.what());
  }
  // Wait until every worker has read `options` and tried to bind.
  for (int s = started.load(); s < n; s = started.load()) started.wait(s);
  bound_ = bound_count.load() == n;
  if (options.bind_threads && !bound_) {
    Log("optim").warn("thread pool {}: bound {} of {} threads to cores; running unbound", options.name,
                      bound_count.load(), n);
  }
  return Status::Ok();
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::RunChunks() {
  for (int64_t c = next_chunk_.fetch_add(1, std::memory_order_relaxed); c < job_chunks_;
       c = next_chunk_.fetch_add(1, std::memory_order_relaxed)) {
    const int64_t begin = c * job_grain_;
    (*job_fn_)(c, begin, std::min(job_n_, begin + job_grain_));
  }
}

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    RunChunks();
    std::lock_guard<std::mutex> lock(mu_);
    if (--pending_ == 0) done_cv_.notify_one();
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain, FunctionRef<void(int64_t, int64_t, int64_t)> fn) {
  ZINF_CHECK(grain > 0);
  if (n <= 0) return;
  const int64_t chunks = (n + grain - 1) / grain;
  if (chunks == 1 || workers_.empty()) {
    for (int64_t c = 0; c < chunks; ++c) fn(c, c * grain, std::min(n, (c + 1) * grain));
    return;
  }
  ZINF_CHECK_MSG(!busy_.exchange(true), "ThreadPool::ParallelFor called concurrently or re-entrantly");
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_fn_ = &fn;
    job_n_ = n;
    job_grain_ = grain;
    job_chunks_ = chunks;
    next_chunk_.store(0, std::memory_order_relaxed);
    pending_ = num_threads();
    ++generation_;
  }
  work_cv_.notify_all();
  {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return pending_ == 0; });
    job_fn_ = nullptr;
  }
  busy_.store(false);
}

}  // namespace zinf::optim
