// Per-module loggers on spdlog. Library code logs; it never prints.
//
// Log(module) returns the logger named "zinf.<module>", created on first use
// with a shared stderr sink. The level comes from ZINF_LOG_LEVEL (trace,
// debug, info, warn, error, off; default info) and can be changed with
// SetLogLevel. Thread-safe.
#pragma once

#include <memory>
#include <string_view>

#include <spdlog/spdlog.h>

namespace zinf {

spdlog::logger& Log(std::string_view module);
void SetLogLevel(spdlog::level::level_enum level);

}  // namespace zinf
