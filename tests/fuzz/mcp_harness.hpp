// A real mcp::connection over an in-memory transport, for the MCP fuzz targets: deliver()
// hands raw message text to the connection exactly as a transport's reader thread would
// (transport_events::on_message), and the transport records what the connection sends back
// (answers to server requests such as ping). No process, socket or thread.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tools_mcp/mcp_connection.hpp"

namespace cedar::fuzz {

class memory_transport final : public tools::mcp::transport {
 public:
  explicit memory_transport(std::vector<std::string>* sent) : sent_(sent) {}
  status start(tools::mcp::transport_events events) override {
    events_ = std::move(events);
    return {};
  }
  status send(const tools::json& message) override {
    sent_->push_back(tools::json_dump(message));
    return {};
  }
  void close() override {}
  std::string describe() const override { return "fuzz: memory"; }
  void deliver(std::string_view text) {
    if (events_.on_message) events_.on_message(text);
  }

 private:
  tools::mcp::transport_events events_;
  std::vector<std::string>* sent_;
};

// One connection per fuzz input (its state — closed after garbage — must not leak across).
struct mcp_harness {
  std::vector<std::string> sent;
  memory_transport* wire = nullptr;
  std::unique_ptr<tools::mcp::connection> conn;
  size_t n_notes = 0;

  mcp_harness() {
    auto t = std::make_unique<memory_transport>(&sent);
    wire = t.get();
    conn = std::make_unique<tools::mcp::connection>(std::move(t));
    conn->set_notification_handler([this](const std::string& method, const tools::json& params) {
      n_notes += method.size() + (params.is_object() ? params.size() : 0);
    });
    if (!conn->open().ok()) std::abort();
  }
};

}  // namespace cedar::fuzz
