// Recursive-descent validation over the keyword subset documented in json_schema.hpp.
// Depth is bounded (64) so a hostile, deeply nested schema or value cannot exhaust the stack.
#include "tools_mcp/json_schema.hpp"

#include <cmath>

namespace cedar::tools {
namespace {

constexpr int max_depth = 64;

error fail(const std::string& path, const std::string& what) {
  return make_error(errc::invalid_argument, path + ": " + what);
}

size_t utf8_length(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s)
    if ((c & 0xC0) != 0x80) ++n;
  return n;
}

bool type_matches(const std::string& type, const json& v) {
  if (type == "integer") return std::string(json_type_name(v)) == "integer";
  if (type == "number") return v.is_number();
  if (type == "string") return v.is_string();
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  if (type == "boolean") return v.is_boolean();
  if (type == "null") return v.is_null();
  return true;  // unknown type names are not ours to reject
}

bool numbers_equal(const json& a, const json& b) {
  if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
  return a == b;
}

bool json_equal(const json& a, const json& b) {
  if (a.is_number() && b.is_number()) return numbers_equal(a, b);
  if (a.type() != b.type()) return false;
  if (a.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (!json_equal(a[i], b[i])) return false;
    return true;
  }
  if (a.is_object()) {
    if (a.size() != b.size()) return false;
    for (auto it = a.begin(); it != a.end(); ++it) {
      auto jt = b.find(it.key());
      if (jt == b.end() || !json_equal(*it, *jt)) return false;
    }
    return true;
  }
  return a == b;
}

double num(const json& v) { return v.get<double>(); }

status validate(const json& s, const json& v, const std::string& path, int depth) {
  if (depth > max_depth) return fail(path, "schema or value nested deeper than 64 levels");
  if (s.is_boolean()) {
    if (s.get<bool>()) return {};
    return fail(path, "no value is allowed here (schema false)");
  }
  if (!s.is_object()) return {};

  if (const json* t = json_member(s, "type")) {
    bool ok = false;
    std::string names;
    if (t->is_string()) {
      ok = type_matches(t->get<std::string>(), v);
      names = t->get<std::string>();
    } else if (t->is_array()) {
      for (const auto& name : *t) {
        if (!name.is_string()) continue;
        ok = ok || type_matches(name.get<std::string>(), v);
        names += (names.empty() ? "" : " or ") + name.get<std::string>();
      }
    } else {
      ok = true;
    }
    if (!ok) return fail(path, "expected " + names + ", got " + json_type_name(v));
  }
  if (const json* e = json_member(s, "enum"); e && e->is_array()) {
    bool found = false;
    for (const auto& option : *e) found = found || json_equal(option, v);
    if (!found) return fail(path, "value " + excerpt(json_dump(v), 60) + " is not one of " + excerpt(json_dump(*e), 200));
  }
  if (const json* c = json_member(s, "const"); c && !json_equal(*c, v))
    return fail(path, "expected the constant " + excerpt(json_dump(*c), 60));

  if (v.is_number()) {
    double x = num(v);
    if (const json* m = json_member(s, "minimum"); m && m->is_number() && x < num(*m))
      return fail(path, "value " + json_dump(v) + " is below the minimum " + json_dump(*m));
    if (const json* m = json_member(s, "maximum"); m && m->is_number() && x > num(*m))
      return fail(path, "value " + json_dump(v) + " is above the maximum " + json_dump(*m));
    if (const json* m = json_member(s, "exclusiveMinimum"); m && m->is_number() && x <= num(*m))
      return fail(path, "value " + json_dump(v) + " must be greater than " + json_dump(*m));
    if (const json* m = json_member(s, "exclusiveMaximum"); m && m->is_number() && x >= num(*m))
      return fail(path, "value " + json_dump(v) + " must be less than " + json_dump(*m));
    if (const json* m = json_member(s, "multipleOf"); m && m->is_number() && num(*m) > 0) {
      double q = x / num(*m);
      if (std::fabs(q - std::round(q)) > 1e-9)
        return fail(path, "value " + json_dump(v) + " is not a multiple of " + json_dump(*m));
    }
  }
  if (v.is_string()) {
    size_t n = utf8_length(v.get_ref<const std::string&>());
    if (const json* m = json_member(s, "minLength"); m && m->is_number() && n < num(*m))
      return fail(path, "string of " + std::to_string(n) + " characters is shorter than minLength " + json_dump(*m));
    if (const json* m = json_member(s, "maxLength"); m && m->is_number() && n > num(*m))
      return fail(path, "string of " + std::to_string(n) + " characters is longer than maxLength " + json_dump(*m));
  }
  if (v.is_array()) {
    if (const json* m = json_member(s, "minItems"); m && m->is_number() && v.size() < num(*m))
      return fail(path, "array of " + std::to_string(v.size()) + " items has fewer than minItems " + json_dump(*m));
    if (const json* m = json_member(s, "maxItems"); m && m->is_number() && v.size() > num(*m))
      return fail(path, "array of " + std::to_string(v.size()) + " items has more than maxItems " + json_dump(*m));
    if (const json* items = json_member(s, "items"); items && (items->is_object() || items->is_boolean())) {
      for (size_t i = 0; i < v.size(); ++i)
        CEDAR_TRY(validate(*items, v[i], path + "[" + std::to_string(i) + "]", depth + 1));
    }
  }
  if (v.is_object()) {
    if (const json* req = json_member(s, "required"); req && req->is_array()) {
      for (const auto& name : *req)
        if (name.is_string() && !v.contains(name.get<std::string>()))
          return fail(path, "missing required property '" + name.get<std::string>() + "'");
    }
    const json* props = json_member(s, "properties");
    const json* extra = json_member(s, "additionalProperties");
    for (auto it = v.begin(); it != v.end(); ++it) {
      std::string sub = path + "." + it.key();
      const json* ps = props && props->is_object() ? json_member(*props, it.key()) : nullptr;
      if (ps) {
        CEDAR_TRY(validate(*ps, *it, sub, depth + 1));
      } else if (extra) {
        if (extra->is_boolean() && !extra->get<bool>())
          return fail(path, "property '" + it.key() + "' is not allowed (additionalProperties is false)");
        CEDAR_TRY(validate(*extra, *it, sub, depth + 1));
      }
    }
  }

  if (const json* all = json_member(s, "allOf"); all && all->is_array())
    for (const auto& sub : *all) CEDAR_TRY(validate(sub, v, path, depth + 1));
  if (const json* any = json_member(s, "anyOf"); any && any->is_array() && !any->empty()) {
    std::string first;
    bool ok = false;
    for (const auto& sub : *any) {
      auto r = validate(sub, v, path, depth + 1);
      if (r.ok()) { ok = true; break; }
      if (first.empty()) first = r.err().message;
    }
    if (!ok) return fail(path, "matches none of anyOf (first: " + first + ")");
  }
  if (const json* one = json_member(s, "oneOf"); one && one->is_array() && !one->empty()) {
    int n = 0;
    for (const auto& sub : *one) n += validate(sub, v, path, depth + 1).ok() ? 1 : 0;
    if (n != 1) return fail(path, "matches " + std::to_string(n) + " of oneOf's schemas, expected exactly 1");
  }
  if (const json* no = json_member(s, "not"); no && validate(*no, v, path, depth + 1).ok())
    return fail(path, "matches the schema under 'not'");
  return {};
}

status check(const json& s, const std::string& path, int depth) {
  if (depth > max_depth) return fail(path, "schema nested deeper than 64 levels");
  if (s.is_boolean()) return {};
  if (!s.is_object()) return fail(path, std::string("a schema must be an object or a boolean, got ") + json_type_name(s));
  if (const json* t = json_member(s, "type"); t && !t->is_string() && !t->is_array())
    return fail(path + ".type", "must be a string or an array of strings");
  if (const json* r = json_member(s, "required"); r && !r->is_array())
    return fail(path + ".required", "must be an array of property names");
  if (const json* p = json_member(s, "properties")) {
    if (!p->is_object()) return fail(path + ".properties", "must be an object");
    for (auto it = p->begin(); it != p->end(); ++it)
      CEDAR_TRY(check(*it, path + ".properties." + it.key(), depth + 1));
  }
  if (const json* i = json_member(s, "items"); i && !i->is_array()) CEDAR_TRY(check(*i, path + ".items", depth + 1));
  for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength",
                        "minItems", "maxItems", "multipleOf"}) {
    if (const json* m = json_member(s, k); m && !m->is_number() && !m->is_boolean())
      return fail(path + "." + k, "must be a number");
  }
  return {};
}

}  // namespace

status schema_validate(const json& schema, const json& value) { return validate(schema, value, "$", 0); }

status schema_check(const json& schema) { return check(schema, "$", 0); }

}  // namespace cedar::tools
