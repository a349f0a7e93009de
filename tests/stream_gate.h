// StreamGate: holds the work queued on a stream at one point until the test
// opens it, and opens it on every way out. Declare it after the stream: it
// is then destroyed first, so the stream's worker is never left waiting
// when a test ends early (its semaphore lives as long as the queued wait).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <semaphore>
#include <thread>

#include "device/device.h"

namespace zinf::test_support {

class StreamGate {
 public:
  StreamGate() = default;
  ~StreamGate() {
    if (opener_.joinable()) opener_.join();
    Open();
  }
  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;

  // The work `stream` queues after this waits until the gate is open.
  Status HoldOn(Stream& stream) {
    return stream.LaunchHostFunc([state = state_] { state->gate.acquire(); });
  }
  void Open() { OpenState(*state_); }
  // Opens it from another thread after `delay`.
  void OpenAfter(std::chrono::milliseconds delay) {
    opener_ = std::thread([state = state_, delay] {
      std::this_thread::sleep_for(delay);
      OpenState(*state);
    });
  }
  bool opened() const { return state_->opened; }

 private:
  struct State {
    std::binary_semaphore gate{0};
    std::atomic<bool> opened{false};
  };
  static void OpenState(State& s) {
    if (!s.opened.exchange(true)) s.gate.release();
  }

  std::shared_ptr<State> state_ = std::make_shared<State>();
  std::thread opener_;
};

}  // namespace zinf::test_support
