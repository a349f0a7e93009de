// What an Engine is built on, for code inside zinf: the trainer, the
// benchmarks and the tests hand the engine their own device, communicators
// and I/O engine (a fault-injecting one, say) through EngineOptions::hooks,
// and reach the engine's device through EngineAccess. These types are not
// part of the public face (include/zinf/), which names EngineHooks only as
// an opaque pointer a user leaves null.
//
// Thread-safety: plain values.
#pragma once

#include <memory>
#include <vector>

#include "zinf/engine.h"

namespace zinf {

class Device;
class Event;
namespace comm {
class Communicator;
}
namespace aio {
class IoEngine;
}

struct EngineHooks {
  // The device to compute on (not owned); null: CreateDevice(auto), owned.
  Device* device = nullptr;
  // Collectives on host buffers (norms; the host device's all-gathers) (not
  // owned); null: comm::HostCommunicator's default (comm/bootstrap.h).
  comm::Communicator* host_communicator = nullptr;
  // Collectives on device buffers (all-gather, reduce-scatter) (not owned);
  // null: comm::DeviceCommunicator's default.
  comm::Communicator* device_communicator = nullptr;
  // Swap and checkpoint I/O (not owned); null: the engine creates its own
  // from the config's aio section.
  aio::IoEngine* io_engine = nullptr;
};

struct EngineAccess {
  // The device the engine computes on (its own or EngineHooks::device).
  static Device& device(Engine& engine);
  // Engine::ReduceGradients behind `stream`, except that `stream` is not
  // made to wait: `*copied` gets an event after the engine's copies out of
  // `grads`, and the caller makes `stream` wait for it (Device::WaitOn)
  // before the stream rewrites them. A caller with two gradient buffers
  // computes the next block into the other meanwhile, so the copy runs
  // beside the kernels. kInvalidArgument for a null `stream` or `copied`;
  // on any error `*copied` is left as it was and no queued copy still reads
  // `grads`. The engine's driving thread only, as Engine's calls.
  static Status ReduceGradients(Engine& engine, BlockId block, const std::vector<const void*>& grads, void* stream,
                                std::shared_ptr<Event>* copied);
};

}  // namespace zinf
