// agent_options <-> JSON: what the store keeps per session (sessions::store::set_agent_options) so
// that a session resumed later — by the dashboard, after a restart — runs with the options it was
// created with. Every field is optional on read (a missing one keeps its default); a field of the
// wrong type is an error naming it.
#pragma once

#include <string>
#include <string_view>

#include "kernels/base/result.hpp"
#include "runtime/cedar.hpp"

namespace cedar::runtime {

std::string agent_options_to_json(const agent_options& o);
// Fields missing from `json` keep the value they have in `defaults`.
result<agent_options> agent_options_from_json(std::string_view json, const agent_options& defaults = {});

}  // namespace cedar::runtime
