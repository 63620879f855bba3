#include "runtime/mcp_setup.hpp"

#include "kernels/base/log.hpp"
#include "tools_mcp/mcp_client.hpp"
#include "tools_mcp/mcp_config.hpp"

namespace cedar::runtime {

status add_mcp_servers(tools::tool_registry& reg, const std::string& config_path) {
  auto cfgs = tools::mcp::load_mcp_config(config_path);
  if (!cfgs) return cfgs.take_err();
  for (const auto& cfg : *cfgs) {
    auto c = std::make_shared<tools::mcp::client>(cfg.name, tools::mcp::make_transport(cfg));
    if (auto st = c->connect(); !st) {
      CEDAR_LOG_ERROR("MCP server '%s' unavailable: %s", cfg.name.c_str(), st.err().message.c_str());
      continue;
    }
    if (auto st = reg.add_mcp_server(c); !st) {
      CEDAR_LOG_ERROR("MCP server '%s': %s", cfg.name.c_str(), st.err().message.c_str());
      continue;
    }
    CEDAR_LOG_INFO("MCP server '%s' connected", cfg.name.c_str());
  }
  return {};
}

}  // namespace cedar::runtime
