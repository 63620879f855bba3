// Helpers of the tool interface (tool.hpp).
#include "tools_mcp/tool.hpp"

namespace cedar::tools {

const char* content_kind_name(content_kind k) {
  switch (k) {
    case content_kind::text: return "text";
    case content_kind::image: return "image";
    case content_kind::audio: return "audio";
    case content_kind::resource_link: return "resource_link";
    case content_kind::resource: return "resource";
  }
  return "unknown";
}

std::string tool_result::to_text() const {
  std::string out;
  auto add = [&](const std::string& s) {
    if (!out.empty()) out += '\n';
    out += s;
  };
  for (const auto& b : content) {
    switch (b.kind) {
      case content_kind::text: add(b.text); break;
      case content_kind::image:
      case content_kind::audio:
      {
        std::string line = "[";  // built by appends: GCC 12 warns falsely on a '+' chain here
        line.append(content_kind_name(b.kind)).append(" ").append(b.mime_type).append(", ");
        line.append(std::to_string(b.data.size())).append(" bytes base64]");
        add(line);
      }
        break;
      case content_kind::resource_link:
        add("[resource link " + b.uri + (b.name.empty() ? "" : " (" + b.name + ")") + "]");
        break;
      case content_kind::resource:
        if (!b.text.empty()) add("[resource " + b.uri + "]\n" + b.text);
        else add("[resource " + b.uri + " " + b.mime_type + ", " + std::to_string(b.data.size()) + " bytes base64]");
        break;
    }
  }
  if (out.empty() && structured) out = json_dump(*structured);
  return out;
}

status tool_name_check(const std::string& name) {
  if (name.empty() || name.size() > 128)
    return make_error(errc::invalid_argument, "tool name '" + excerpt(name, 140) + "' must be 1-128 characters long");
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
              c == '.' || c == '-';
    if (!ok)
      return make_error(errc::invalid_argument, "tool name '" + excerpt(name, 140) +
                                                    "' has a character outside [A-Za-z0-9_.-]");
  }
  return {};
}

tool_result text_result(std::string text, bool is_error) {
  tool_result r;
  r.content.push_back(content_block{content_kind::text, std::move(text), {}, {}, {}, {}, json()});
  r.is_error = is_error;
  return r;
}

}  // namespace cedar::tools
