// UpdateWorker: one piece of work on a thread of its own whose progress is
// a growing prefix of an array, and a driver that waits for just the prefix
// it needs.
//
// The engine's optimizer update walks the rank shard in sub-groups on a
// worker thread under the next forward pass; a fetch of block b needs only
// the elements [0, end of b's shard) to be stepped. The body publishes its
// progress with Publish(n) ("elements [0, n) are done"; n never shrinks)
// and returns its Status; WaitFor(n) blocks until the prefix is there or
// the body has ended, Join collects the result.
//
// Back-pressure (bounded output windows): the body may write its output
// into a ring that the driver drains; the driver says how far it has taken
// the output with Consume(n), and the body waits for that with
// WaitConsumed(n) before overwriting ring space. Join gives the rest up
// (consumption is treated as complete), so a body never waits on a driver
// that has stopped draining.
//
// Thread-safety: Start, WaitFor, Join, active and the destructor are called
// by one driving thread; Consume by any thread (the driver's device stream
// hands ring space back once its copy out of it is done), between a Start
// and the next one; the body runs on the worker thread and calls only the
// Progress it is given. Every shared field is guarded by mu_.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

#include "zinf/status.h"

namespace zinf::zero3 {

class UpdateWorker {
 public:
  // Handed to the body: how it reports progress.
  class Progress {
   public:
    // Elements [0, n) are done. n must not be smaller than a value
    // published before.
    void Publish(int64_t n);
    // Blocks until the driver has consumed elements [0, n) (Consume) or
    // Join has given the rest up.
    void WaitConsumed(int64_t n);

   private:
    friend class UpdateWorker;
    explicit Progress(UpdateWorker* worker) : worker_(worker) {}
    UpdateWorker* worker_;
  };
  using Body = std::function<Status(Progress&)>;

  UpdateWorker() = default;
  ~UpdateWorker();  // joins a running body (its result is dropped)
  UpdateWorker(const UpdateWorker&) = delete;
  UpdateWorker& operator=(const UpdateWorker&) = delete;

  // Runs `body` on a new thread. Precondition: !active() (Join first).
  // kResourceExhausted when no thread can be started (nothing ran).
  Status Start(Body body);

  // Whether a body was started and not yet joined.
  bool active() const { return thread_.joinable(); }

  // Waits until elements [0, n) are done (true) or the body has ended
  // without getting there (its error, or kInternal when it returned OK).
  // `wait` false: returns false at once instead of waiting. The last
  // body's progress and result stay after Join (a prefix it did not reach
  // stays an error); before the first Start every prefix is done.
  // `waited_ns` (optional) gets the time spent blocked added to it.
  StatusOr<bool> WaitFor(int64_t n, bool wait, int64_t* waited_ns = nullptr);

  // Elements [0, n) of the body's output have been taken by the driver
  // (their ring space may be reused). Reset to 0 by Start.
  void Consume(int64_t n);

  // Waits for the body to end and returns its Status (OK when none was
  // started since the last Join); the body's waits for consumption end at
  // once. `waited_ns` as in WaitFor.
  Status Join(int64_t* waited_ns = nullptr);

 private:
  void Run(Body body);

  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t done_elems_ = INT64_MAX;  // guarded by mu_
  bool ended_ = true;               // guarded by mu_
  int64_t consumed_ = INT64_MAX;    // guarded by mu_
  Status status_;                   // guarded by mu_: the body's result once ended_
};

}  // namespace zinf::zero3
