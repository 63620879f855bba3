// Remote runtimes (ARCHITECTURE "Scale-out": CAF's io middleman, no home-made RPC).
//
// Every runtime's actor system loads the io middleman. publish() spawns a gateway actor that
// answers (endpoints_atom) with the executor, the store and the model hash, and publishes it on
// 127.0.0.1 — one port for both actors. A client opened with runtime_options::remote_port asks
// the gateway once, checks the model hash against its own model directory, and from then on its
// agents talk to the remote executor and store exactly as they talk to local ones (actor handles
// and the registered message types cross the wire; token streams flow back to the local
// agents). A client never stops the remote actors; agent::ask watches the remote executor so
// that a vanished server fails a turn instead of hanging it.
//
// Who holds what across the wire:
//   server  impl --owns--> exec, store, gateway;  gateway --weak--> exec, store
//   client  impl --owns--> agents, proxies of exec and store (never sends them an exit)
//
// Shutdown of a published runtime (stop_published, first thing in impl::~impl), and why:
// once a client has a proxy of the executor or the store, the server's BASP broker monitors
// that actor, and the actor's down message to the broker carries a strong reference to it (the
// sender). CAF 0.17.6 stops the middleman as soon as no actor is *running*, which an actor stops
// being before its attachables (monitors) have run; and middleman::stop leaves the broker's
// mailbox undrained (scheduled_actor::finalize does nothing while the broker still has its
// behavior). A down message that arrives then is never destroyed, the detached actor it
// references is never destroyed either, and ~actor_system waits for that actor's thread forever
// (await_detached_threads: the store, in ~1 of 3 runs under load). So, in order:
//   1. exit messages to the gateway, the executor and the store;
//   2. wait on an exit latch: a functor attached to each of them at publish(), before any proxy
//      of them existed, hence the last of their attachables to run (CAF runs them newest
//      first): when it fires, the broker's down message is in the broker's mailbox;
//   3. unpublish, a request that passes through the same broker mailbox after those down
//      messages: when it returns, the broker has handled them and released the references;
//   4. the actor system goes down (impl::~impl).
#include "runtime/remote.hpp"

#include <caf/io/all.hpp>
#include <chrono>
#include <condition_variable>
#include <mutex>

#include "model/config.hpp"
#include "model/engine.hpp"
#include "model/tokenizer.hpp"
#include "runtime/builtin_tools.hpp"
#include "runtime/mcp_setup.hpp"

namespace cedar {

using namespace cedar::runtime;

namespace runtime {

// Counts the actors of a published runtime whose attachables have not all run yet.
struct exit_latch {
  std::mutex mu;
  std::condition_variable cv;
  int pending = 0;

  // Call before `a` is known to any other process (see the top of this file).
  static void watch(const std::shared_ptr<exit_latch>& latch, const caf::actor& a) {
    {
      std::lock_guard<std::mutex> lk(latch->mu);
      ++latch->pending;
    }
    caf::actor_cast<caf::abstract_actor*>(a)->attach_functor([latch] {
      std::lock_guard<std::mutex> lk(latch->mu);
      if (--latch->pending == 0) latch->cv.notify_all();
    });
  }
  void wait() {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [this] { return pending == 0; });
  }
};

}  // namespace runtime

namespace {

// The gateway points at the executor and the store without owning them (the runtime does).
gateway_actor::behavior_type gateway_fn(gateway_actor::pointer, caf::actor_addr exec, caf::actor_addr store,
                                        uint64_t hash) {
  return {[exec, store, hash](endpoints_atom) -> caf::result<caf::actor, caf::actor, uint64_t> {
    return {caf::actor_cast<caf::actor>(exec), caf::actor_cast<caf::actor>(store), hash};
  }};
}

}  // namespace

namespace runtime {

void configure_middleman(caf::actor_system_config& cfg) {
  cfg.load<caf::io::middleman>();
  // The middleman's own actor runs on the scheduler rather than on a detached thread of its own.
  cfg.set("middleman.attach-utility-actors", true);
}

result<std::unique_ptr<agent_runtime::impl>> open_remote(const runtime_options& o, uint64_t model_hash) {
  auto p = std::make_unique<agent_runtime::impl>();
  p->opts = o;
  p->remote = true;
  p->model_hash = model_hash;
  if (o.engine && o.tokenizer) {
    p->engine = o.engine;
    p->tok = o.tokenizer;
    p->config = std::make_shared<const model::model_config>(o.engine->config());
  } else {
    if (o.model_dir.empty()) return make_error(errc::invalid_argument, "runtime: no model_dir given");
    auto cfg = model::load_model_config(o.model_dir + "/config.json");
    if (!cfg) return cfg.take_err();
    auto tok = model::tokenizer::load(o.model_dir + "/tokenizer.json");
    if (!tok) return tok.take_err();
    p->config = std::make_shared<const model::model_config>(std::move(*cfg));
    p->tok = std::make_shared<const model::tokenizer>(std::move(*tok));
  }
  if (o.builtin_tools)
    for (auto& t : builtin_tools(o.files_root)) CEDAR_TRY(p->reg->add(std::move(t)));
  if (!o.mcp_config.empty()) CEDAR_TRY(add_mcp_servers(*p->reg, o.mcp_config));

  register_message_types(p->cfg);
  configure_middleman(p->cfg);
  p->cfg.set("scheduler.max-threads", std::max(1, o.scheduler_threads));
  p->cfg.set("logger.verbosity", caf::atom("quiet"));
  p->sys = std::make_unique<caf::actor_system>(p->cfg);

  const std::string where = o.remote_host + ":" + std::to_string(o.remote_port);
  auto gw = p->sys->middleman().remote_actor<gateway_actor>(o.remote_host, o.remote_port);
  if (!gw) return make_error(errc::unavailable, "remote runtime at " + where + ": " + p->sys->render(gw.error()));
  status got = make_error(errc::unavailable, "remote runtime at " + where + " did not answer");
  {
    caf::scoped_actor self{*p->sys};  // scoped: a live scoped_actor blocks the system's shutdown
    self->request(*gw, std::chrono::seconds(30), endpoints_atom::value)
        .receive(
            [&](caf::actor& exec, caf::actor& store, uint64_t hash) {
              if (hash != p->model_hash) {
                got = make_error(errc::mismatch, "remote runtime at " + where +
                                                     " serves a different model than this runtime's (model hash " +
                                                     std::to_string(hash) + " vs " + std::to_string(p->model_hash) +
                                                     "): open both from the same model directory");
                return;
              }
              if (!exec || !store) {
                got = make_error(errc::unavailable, "remote runtime at " + where + " is shutting down");
                return;
              }
              p->exec = caf::actor_cast<executor_actor>(exec);
              p->store = caf::actor_cast<store_actor>(store);
              got = status{};
            },
            [&](caf::error& e) {
              got = make_error(errc::unavailable, "remote runtime at " + where + ": " + p->sys->render(e));
            });
  }
  if (!got) return got.take_err();
  return p;
}

void stop_published(agent_runtime::impl& rt) {
  if (!rt.gateway) return;
  caf::anon_send_exit(rt.gateway, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(rt.exec, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(rt.store, caf::exit_reason::user_shutdown);
  rt.published_exits->wait();
  // The reply travels through the BASP broker's mailbox behind the down messages (a fence);
  // the gateway is gone by now, so the reply is an error worth nothing but its arrival.
  (void)rt.sys->middleman().unpublish(rt.gateway, rt.published_port);
  rt.gateway = nullptr;
}

}  // namespace runtime

bool agent_runtime::is_remote() const { return p_->remote; }

result<uint16_t> agent_runtime::publish(uint16_t port) {
  if (p_->remote) return make_error(errc::invalid_argument, "publish: this runtime's executor and store are remote");
  std::lock_guard<std::mutex> lk(p_->mu);
  if (p_->gateway) {
    if (port != 0 && port != p_->published_port)
      return make_error(errc::invalid_argument,
                        "publish: already published on port " + std::to_string(p_->published_port));
    return p_->published_port;
  }
  auto gw = p_->sys->spawn(gateway_fn, p_->exec.address(), p_->store.address(), p_->model_hash);
  auto latch = std::make_shared<exit_latch>();
  for (const caf::actor& a : {caf::actor_cast<caf::actor>(gw), caf::actor_cast<caf::actor>(p_->exec),
                              caf::actor_cast<caf::actor>(p_->store)})
    exit_latch::watch(latch, a);
  auto bound = p_->sys->middleman().publish(gw, port, "127.0.0.1", /*reuse_addr=*/true);
  if (!bound) {
    caf::anon_send_exit(gw, caf::exit_reason::user_shutdown);
    return make_error(errc::unavailable,
                      "publish on 127.0.0.1:" + std::to_string(port) + ": " + p_->sys->render(bound.error()));
  }
  p_->published_exits = latch;
  p_->gateway = gw;
  p_->published_port = *bound;
  return *bound;
}

}  // namespace cedar
