// Unit tests of the pieces without a server: JSON Schema subset, mcpServers parsing, SSE
// parsing, tool names, call-result conversion, the registry with a C++ tool.
#include <gtest/gtest.h>

#include "tools_mcp/json_schema.hpp"
#include "tools_mcp/mcp_client.hpp"
#include "tools_mcp/mcp_config.hpp"
#include "tools_mcp/mcp_http.hpp"
#include "tools_mcp/tool_registry.hpp"

using namespace cedar;
using namespace cedar::tools;

namespace {

json J(const char* s) { return json_parse(s).value(); }

std::string why(const status& s) { return s.ok() ? "" : s.err().message; }

}  // namespace

TEST(json_schema, types_required_and_properties) {
  json s = J(R"({"type":"object","properties":{"a":{"type":"number"},"n":{"type":"integer"},
                 "s":{"type":"string","minLength":2,"maxLength":4}},"required":["a"]})");
  EXPECT_TRUE(schema_validate(s, J(R"({"a":1.5,"n":3,"s":"héé"})")).ok());
  EXPECT_EQ(why(schema_validate(s, J(R"({"n":3})"))), "$: missing required property 'a'");
  EXPECT_EQ(why(schema_validate(s, J(R"({"a":"x"})"))), "$.a: expected number, got string");
  EXPECT_EQ(why(schema_validate(s, J(R"({"a":1,"n":2.5})"))), "$.n: expected integer, got number");
  EXPECT_TRUE(schema_validate(s, J(R"({"a":1,"n":2.0})")).ok());  // whole doubles are integers
  EXPECT_NE(why(schema_validate(s, J(R"({"a":1,"s":"x"})"))).find("shorter than minLength 2"), std::string::npos);
  EXPECT_NE(why(schema_validate(s, J(R"({"a":1,"s":"abcde"})"))).find("longer than maxLength 4"), std::string::npos);
  EXPECT_EQ(why(schema_validate(s, J("[1]"))), "$: expected object, got array");
}

TEST(json_schema, enum_items_bounds_additional) {
  json s = J(R"({"type":"object","additionalProperties":false,"properties":{
      "city":{"enum":["New York","Chicago"]},
      "xs":{"type":"array","minItems":1,"maxItems":2,"items":{"type":"number","minimum":0,"exclusiveMaximum":10}},
      "t":{"type":["string","null"]}}})");
  EXPECT_TRUE(schema_validate(s, J(R"({"city":"Chicago","xs":[0,9.5],"t":null})")).ok());
  EXPECT_NE(why(schema_validate(s, J(R"({"city":"Paris"})"))).find("$.city: value \"Paris\" is not one of"), std::string::npos);
  EXPECT_EQ(why(schema_validate(s, J(R"({"xs":[1,-1]})"))), "$.xs[1]: value -1 is below the minimum 0");
  EXPECT_EQ(why(schema_validate(s, J(R"({"xs":[10]})"))), "$.xs[0]: value 10 must be less than 10");
  EXPECT_NE(why(schema_validate(s, J(R"({"xs":[]})"))).find("fewer than minItems 1"), std::string::npos);
  EXPECT_NE(why(schema_validate(s, J(R"({"xs":[1,2,3]})"))).find("more than maxItems 2"), std::string::npos);
  EXPECT_EQ(why(schema_validate(s, J(R"({"zz":1})"))), "$: property 'zz' is not allowed (additionalProperties is false)");
  EXPECT_EQ(why(schema_validate(s, J(R"({"t":5})"))), "$.t: expected string or null, got integer");
}

TEST(json_schema, combinators_and_schema_checks) {
  json s = J(R"({"anyOf":[{"type":"string"},{"type":"number","maximum":3}]})");
  EXPECT_TRUE(schema_validate(s, J(R"("x")")).ok());
  EXPECT_TRUE(schema_validate(s, J("2")).ok());
  EXPECT_NE(why(schema_validate(s, J("5"))).find("matches none of anyOf"), std::string::npos);
  EXPECT_FALSE(schema_validate(J("false"), J("1")).ok());
  EXPECT_TRUE(schema_validate(J("true"), J("1")).ok());
  EXPECT_TRUE(schema_check(J(R"({"type":"object","properties":{"a":{"type":"string"}}})")).ok());
  EXPECT_EQ(why(schema_check(J(R"({"properties":{"a":3}})"))), "$.properties.a: a schema must be an object or a boolean, got integer");
  EXPECT_EQ(why(schema_check(J(R"({"required":"a"})"))), "$.required: must be an array of property names");
  // Deep nesting is refused, not a stack overflow.
  std::string deep;
  for (int i = 0; i < 200; ++i) deep += "[";
  for (int i = 0; i < 200; ++i) deep += "]";
  json items = J(R"({"type":"array"})");
  json nested = items;
  for (int i = 0; i < 100; ++i) nested = json{{"type", "array"}, {"items", nested}};
  EXPECT_NE(why(schema_validate(nested, J(deep.c_str()))).find("deeper than 64"), std::string::npos);
}

TEST(json_dump, compact_pretty_ordered_and_invalid_utf8) {
  json v = J(R"({"b": [1, 2], "a": "x"})");
  EXPECT_EQ(json_dump(v), R"({"a":"x","b":[1,2]})");
  EXPECT_EQ(json_dump(v, 2), "{\n  \"a\": \"x\",\n  \"b\": [\n    1,\n    2\n  ]\n}");
  nlohmann::ordered_json o;
  o["z"] = 1;
  o["a"] = 2;
  EXPECT_EQ(json_dump_ordered(o), R"({"z":1,"a":2})");  // insertion order kept
  // a string that is not UTF-8 (a tool's raw bytes) is replaced, never thrown, compact or not
  json bad = {{"text", std::string("ok \xff end")}};
  EXPECT_EQ(json_dump(bad), "{\"text\":\"ok \xEF\xBF\xBD end\"}");
  EXPECT_NE(json_dump(bad, 1).find("\xEF\xBF\xBD"), std::string::npos);
  nlohmann::ordered_json bad_o;
  bad_o["text"] = std::string("\xc3");
  EXPECT_EQ(json_dump_ordered(bad_o), "{\"text\":\"\xEF\xBF\xBD\"}");
}

TEST(mcp_config, parses_both_shapes_and_rejects_bad_input) {
  auto r = mcp::parse_mcp_config(R"({"mcpServers":{
      "fs":{"command":"node","args":["a.js","/tmp"],"env":{"K":"V"}},
      "web":{"url":"http://127.0.0.1:9/mcp","headers":{"Authorization":"Bearer x"},"timeout":2.5}}})", "cfg.json");
  ASSERT_TRUE(r.ok()) << r.err().message;
  ASSERT_EQ(r->size(), 2u);
  const auto& fs = (*r)[0];
  EXPECT_EQ(fs.name, "fs");
  EXPECT_EQ(fs.type, mcp::server_config::kind::stdio);
  EXPECT_EQ(fs.args, (std::vector<std::string>{"a.js", "/tmp"}));
  EXPECT_EQ(fs.env.at("K"), "V");
  const auto& web = (*r)[1];
  EXPECT_EQ(web.type, mcp::server_config::kind::http);
  EXPECT_EQ(web.headers.at("Authorization"), "Bearer x");
  EXPECT_EQ(web.timeout.count(), 2500);

  auto msg = [](const char* text) {
    auto r = mcp::parse_mcp_config(text, "cfg.json");
    return r.ok() ? std::string("ok") : r.err().message;
  };
  EXPECT_EQ(msg(R"({"servers":{}})"), "cfg.json: no 'mcpServers' object at the top level");
  EXPECT_EQ(msg(R"({"mcpServers":{"a":{}}})"), "cfg.json: mcpServers.a needs 'command' (stdio) or 'url' (Streamable HTTP)");
  EXPECT_EQ(msg(R"({"mcpServers":{"a":{"command":"x","args":[1]}}})"), "cfg.json: mcpServers.a.args[0] must be a string");
  EXPECT_EQ(msg(R"({"mcpServers":{"a":{"url":"ftp://x"}}})"), "cfg.json: mcpServers.a.url 'ftp://x' must start with http:// or https://");
  EXPECT_NE(msg(R"({"mcpServers":{"a":{"type":"sse","url":"http://x"}}})").find("legacy SSE transport"), std::string::npos);
  EXPECT_NE(msg(R"({"mcpServers":{"a__b":{"command":"x"}}})").find("must not contain \"__\""), std::string::npos);
  EXPECT_NE(msg(R"({"mcpServers":{"a b":{"command":"x"}}})").find("outside [A-Za-z0-9_-]"), std::string::npos);
  EXPECT_NE(msg(R"({"mcpServers":)").find("cfg.json is not valid JSON"), std::string::npos);
  auto missing = mcp::load_mcp_config("/nonexistent/cedar-mcp.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.err().message, "cannot open MCP config '/nonexistent/cedar-mcp.json'");
}

TEST(sse_parser, events_priming_retry_and_line_endings) {
  mcp::sse_parser p;
  std::vector<mcp::sse_parser::event> got;
  auto sink = [&](const mcp::sse_parser::event& e) { got.push_back(e); };
  // Priming event (id, retry, empty data), split across feeds; then CRLF lines and a comment.
  p.feed("id: e1\nretry: 25", sink);
  p.feed("0\ndata:\n\n: comment\r\nevent: message\r\ndata: {\"a\":1}\r\ndata: {\"b\":2}\r\n\r\n", sink);
  p.feed("data: x\rid: e3\r\r", sink);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].id, "e1");
  EXPECT_EQ(got[0].data, "");
  EXPECT_EQ(p.retry_ms(), 250);
  EXPECT_EQ(got[1].type, "message");
  EXPECT_EQ(got[1].data, "{\"a\":1}\n{\"b\":2}");
  EXPECT_EQ(got[1].id, "e1");  // the last id carries over
  EXPECT_EQ(got[2].data, "x");
  EXPECT_EQ(p.last_event_id(), "e3");
}

TEST(mcp_result, all_content_kinds_and_output_schema) {
  json r = J(R"({"content":[
      {"type":"text","text":"hi"},
      {"type":"image","data":"iVBO","mimeType":"image/png"},
      {"type":"audio","data":"UklG","mimeType":"audio/wav"},
      {"type":"resource_link","uri":"file:///a.txt","name":"a.txt","mimeType":"text/plain"},
      {"type":"resource","resource":{"uri":"test://r/1","mimeType":"text/plain","text":"body"}},
      {"type":"resource","resource":{"uri":"test://r/2","mimeType":"application/octet-stream","blob":"AAEC"}}],
      "structuredContent":{"temperature":20,"conditions":"sunny"}})");
  json schema = J(R"({"type":"object","properties":{"temperature":{"type":"number"},"conditions":{"type":"string"}},
                      "required":["temperature","conditions"],"additionalProperties":false})");
  auto res = mcp::parse_call_result(r, schema, "weather");
  ASSERT_TRUE(res.ok()) << res.err().message;
  ASSERT_EQ(res->content.size(), 6u);
  EXPECT_EQ(res->content[0].kind, content_kind::text);
  EXPECT_EQ(res->content[1].kind, content_kind::image);
  EXPECT_EQ(res->content[1].mime_type, "image/png");
  EXPECT_EQ(res->content[2].kind, content_kind::audio);
  EXPECT_EQ(res->content[3].kind, content_kind::resource_link);
  EXPECT_EQ(res->content[3].uri, "file:///a.txt");
  EXPECT_EQ(res->content[4].text, "body");
  EXPECT_EQ(res->content[5].data, "AAEC");
  EXPECT_FALSE(res->is_error);
  std::string text = res->to_text();
  EXPECT_NE(text.find("[image image/png, 4 bytes base64]"), std::string::npos);
  EXPECT_NE(text.find("[resource link file:///a.txt (a.txt)]"), std::string::npos);

  json bad = J(R"({"content":[],"structuredContent":{"temperature":"hot","conditions":"x"}})");
  auto b = mcp::parse_call_result(bad, schema, "weather");
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.err().message, "tool 'weather': structuredContent does not match its outputSchema: $.temperature: expected number, got string");
  auto none = mcp::parse_call_result(J(R"({"content":[]})"), schema, "weather");
  ASSERT_FALSE(none.ok());
  // isError results skip the schema: they are tool errors for the model.
  auto err = mcp::parse_call_result(J(R"({"content":[{"type":"text","text":"boom"}],"isError":true})"), schema, "weather");
  ASSERT_TRUE(err.ok());
  EXPECT_TRUE(err->is_error);
  EXPECT_EQ(err->to_text(), "boom");
}

TEST(tool_registry, cpp_tool_validation_and_names) {
  tool_registry reg;
  tool add;
  add.name = "math.add";
  add.description = "adds";
  add.input_schema = J(R"({"type":"object","properties":{"a":{"type":"number"},"b":{"type":"number"}},"required":["a","b"]})");
  add.invoke = [](const json& args, const invoke_context&) -> result<tool_result> {
    return text_result(json_dump(args["a"].get<double>() + args["b"].get<double>()));
  };
  ASSERT_TRUE(reg.add(add).ok());
  EXPECT_FALSE(reg.add(add).ok());  // duplicate
  tool bad = add;
  bad.name = "has space";
  EXPECT_EQ(reg.add(bad).err().message, "tool name 'has space' has a character outside [A-Za-z0-9_.-]");
  bad.name = std::string(129, 'a');
  EXPECT_FALSE(reg.add(bad).ok());

  auto r = reg.call("math.add", J(R"({"a":2,"b":3.5})"), {});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->to_text(), "5.5");
  auto invalid = reg.call("math.add", J(R"({"a":2})"), {});
  ASSERT_TRUE(invalid.ok());
  EXPECT_TRUE(invalid->is_error);
  EXPECT_EQ(invalid->to_text(), "invalid arguments for tool 'math.add': $: missing required property 'b'");
  auto unknown = reg.call("nope", json::object(), {});
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.err().code, errc::not_found);
  EXPECT_EQ(mcp_tool_name("fs", "read_text_file"), "fs__read_text_file");
}
