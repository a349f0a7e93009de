#include "core/log.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace zinf {
namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, std::shared_ptr<spdlog::logger>, std::less<>> loggers;
  spdlog::sink_ptr sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  spdlog::level::level_enum level = InitialLevel();

  static spdlog::level::level_enum InitialLevel() {
    const char* env = std::getenv("ZINF_LOG_LEVEL");
    if (env == nullptr || *env == '\0') return spdlog::level::info;
    return spdlog::level::from_str(env);
  }
};

Registry& Reg() {
  static Registry* reg = new Registry();  // never destroyed: loggers outlive static dtors
  return *reg;
}

}  // namespace

spdlog::logger& Log(std::string_view module) {
  Registry& reg = Reg();
  std::lock_guard lock(reg.mu);
  auto it = reg.loggers.find(module);
  if (it != reg.loggers.end()) return *it->second;
  auto logger = std::make_shared<spdlog::logger>("zinf." + std::string(module), reg.sink);
  logger->set_level(reg.level);
  logger->set_pattern("[%H:%M:%S.%e] [%n] [%^%l%$] %v");
  auto& ref = *logger;
  reg.loggers.emplace(std::string(module), std::move(logger));
  return ref;
}

void SetLogLevel(spdlog::level::level_enum level) {
  Registry& reg = Reg();
  std::lock_guard lock(reg.mu);
  reg.level = level;
  for (auto& [name, logger] : reg.loggers) logger->set_level(level);
}

}  // namespace zinf
