// UpdateWorker (update_worker.h).
#include "zero3/update_worker.h"

#include <pthread.h>

#include <chrono>
#include <string>
#include <system_error>
#include <utility>

#include "core/units.h"

namespace zinf::zero3 {
namespace {

using Clock = std::chrono::steady_clock;

void AddSince(Clock::time_point t0, int64_t* ns) {
  if (ns != nullptr) *ns += NanosSince(t0);
}

}  // namespace

void UpdateWorker::Progress::Publish(int64_t n) {
  std::lock_guard<std::mutex> lock(worker_->mu_);
  if (n > worker_->done_elems_) worker_->done_elems_ = n;
  worker_->cv_.notify_all();
}

void UpdateWorker::Progress::WaitConsumed(int64_t n) {
  std::unique_lock<std::mutex> lock(worker_->mu_);
  worker_->cv_.wait(lock, [&] { return worker_->consumed_ >= n; });
}

UpdateWorker::~UpdateWorker() { Join().IgnoreError(); }

void UpdateWorker::Consume(int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  if (n > consumed_) consumed_ = n;
  cv_.notify_all();
}

Status UpdateWorker::Start(Body body) {
  if (thread_.joinable()) return Status::FailedPrecondition("update worker: Start while a body runs (Join first)");
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_elems_ = 0;
    consumed_ = 0;
    ended_ = false;
    status_ = Status::Ok();
  }
  try {
    thread_ = std::thread(&UpdateWorker::Run, this, std::move(body));
  } catch (const std::system_error& e) {
    std::lock_guard<std::mutex> lock(mu_);  // nothing ran: every prefix is done again, as before Start
    done_elems_ = INT64_MAX;
    ended_ = true;
    return Status::ResourceExhausted(std::string("cannot start the optimizer update's thread: ") + e.what());
  }
  return Status::Ok();
}

void UpdateWorker::Run(Body body) {
  pthread_setname_np(pthread_self(), "zinf-update");  // its own line in perf and top
  Progress progress(this);
  Status s = body(progress);
  std::lock_guard<std::mutex> lock(mu_);
  ended_ = true;
  status_ = std::move(s);
  cv_.notify_all();
}

StatusOr<bool> UpdateWorker::WaitFor(int64_t n, bool wait, int64_t* waited_ns) {
  const auto t0 = Clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  auto there = [&] { return ended_ || done_elems_ >= n; };
  if (!wait && !there()) return false;
  cv_.wait(lock, there);
  AddSince(t0, waited_ns);
  if (done_elems_ >= n) return true;
  return status_.ok() ? Status::Internal("the optimizer update ended before element " + std::to_string(n)) : status_;
}

Status UpdateWorker::Join(int64_t* waited_ns) {
  if (!thread_.joinable()) return Status::Ok();  // joined already: its result was returned then
  const auto t0 = Clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);  // the driver takes no more: let the body run to its end
    consumed_ = INT64_MAX;
    cv_.notify_all();
  }
  thread_.join();
  AddSince(t0, waited_ns);
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

}  // namespace zinf::zero3
