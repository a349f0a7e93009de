// What an Engine is built on, for code inside zinf: the trainer, the
// benchmarks and the tests hand the engine their own device, communicators
// and I/O engine (a fault-injecting one, say) through EngineOptions::hooks,
// and reach the engine's device through EngineAccess. These types are not
// part of the public face (include/zinf/), which names EngineHooks only as
// an opaque pointer a user leaves null.
//
// Thread-safety: plain values.
#pragma once

#include "zinf/engine.h"

namespace zinf {

class Device;
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
};

}  // namespace zinf
