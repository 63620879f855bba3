// The local web dashboard: a mount for cedar's HTTP server (runtime/server/http_server.hpp adds
// mounts before it listens; authentication is the server's, not the dashboard's).
//
// Routes (all JSON unless said otherwise):
//   GET  /  /dashboard                 index.html (embedded; assets under /dash/)
//   GET  /dash/{app.js,style.css,uplot.js,uplot.css}
//   GET  /api/dash/sessions            sessions: status, turns, tokens, context, KV bytes (FP4 and
//                                      the bf16 equivalent), last activity, running
//   GET  /api/dash/sessions/{id}       one session: transcript items with per-generation metrics,
//                                      the stored per-turn timings (time to first token, decode
//                                      time; they survive a restart), the stored agent options,
//                                      live state (running, live text, turn summaries)
//   GET  /api/dash/executor            executor status + the kept samples (tok/s over time)
//   GET  /api/dash/mcp                 MCP servers: protocol version, tools + schemas, call stats,
//                                      stderr tail
//   GET  /api/dash/tools               every registered tool with its schema (the start form)
//   GET  /api/dash/events              SSE: observer events (`id:` = seq) from now on, or after
//                                      Last-Event-ID / ?after=N (replaying the kept ring); each
//                                      stream ends after ~15 s and the EventSource reconnects
//   POST /api/dash/agents              {system_prompt, message, tools[], name, max_new_tokens}
//                                      -> {session}: creates an agent and runs its first turn
//   POST /api/dash/sessions/{id}/cancel  cancels the session's agent: one this dashboard started
//                                      or any other agent of the runtime (the runtime's registry)
//   POST /api/dash/sessions/{id}/resume {message}: the next turn (the agent is resumed from the
//                                      store when this dashboard does not hold it, with the
//                                      agent options stored for the session)
//   POST /api/dash/sessions/{id}/fork   {turns, message?}: a new session with the first `turns`
//                                      store turns; with `message` it runs a turn at once
// Turns started here run on worker threads of the dashboard (an ask blocks its thread); the
// state behind the routes lives as long as the server's handlers, and its destructor cancels
// and joins those turns. Lifetime: the server must stop before the runtime is destroyed.
#pragma once

namespace httplib {
class Server;
}

namespace cedar {
class agent_runtime;
}

namespace cedar::runtime {

void mount_dashboard(httplib::Server& svr, agent_runtime& rt);

}  // namespace cedar::runtime
