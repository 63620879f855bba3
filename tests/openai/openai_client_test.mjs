// The official `openai` npm client (pinned in package.json) against a real `cedar serve` with
// the shipped default model: models list, a plain and a streamed completion, a request with a
// tool that the model calls, and the follow-up with the tool's result (whose prompt must reuse
// the first request's KV: usage.prompt_tokens_details.cached_tokens > 0).
//
// Usage (ctest `openai_client` runs it with Node >= 22):
//   node openai_client_test.mjs <path to the cedar binary> <repo root>
// The server gets a free port, a temp store and a temp token file; it is stopped with SIGTERM.
import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import assert from "node:assert/strict";
import OpenAI from "openai";

const [cedar, root] = process.argv.slice(2);
if (!cedar || !root) {
  console.error("usage: node openai_client_test.mjs <cedar binary> <repo root>");
  process.exit(2);
}

const dir = mkdtempSync(join(tmpdir(), "cedar-openai-"));
const tokenFile = join(dir, "serve.token");
const server = spawn(cedar, ["serve", "--port", "0", "--model", join(root, "model/weights/cedar-agent-tiny"),
                             "--store", join(dir, "s.db"), "--token-file", tokenFile],
                     { stdio: ["ignore", "pipe", "inherit"] });

function stop() {
  if (server.exitCode === null) server.kill("SIGTERM");
}
process.on("exit", () => {
  stop();
  rmSync(dir, { recursive: true, force: true });
});

const url = await new Promise((resolve, reject) => {
  let out = "";
  const timer = setTimeout(() => reject(new Error("cedar serve did not start in 60 s: " + out)), 60000);
  server.stdout.on("data", (d) => {
    out += d;
    const m = out.match(/listening on (http:\/\/[^\s]+)/);
    if (m) {
      clearTimeout(timer);
      resolve(m[1]);
    }
  });
  server.on("exit", (code) => reject(new Error(`cedar serve exited with ${code}: ${out}`)));
});

const token = readFileSync(tokenFile, "utf8").trim();
const client = new OpenAI({ baseURL: url + "/v1", apiKey: token, maxRetries: 0, timeout: 120000 });
const system = "You are cedar, a helpful assistant. Use the tools when they help.";
const tools = [{
  type: "function",
  function: {
    name: "calculator",
    description: "Evaluate an arithmetic expression with + - * / and parentheses; returns the exact result.",
    parameters: { type: "object", properties: { expression: { type: "string", description: "e.g. (12 + 30) * 4" } },
                  required: ["expression"] },
  },
}];
let failures = 0;
async function check(name, fn) {
  try {
    await fn();
    console.log(`ok   ${name}`);
  } catch (e) {
    failures++;
    console.log(`FAIL ${name}: ${e.stack || e}`);
  }
}

let model;
await check("models.list", async () => {
  const list = [];
  for await (const m of client.models.list()) list.push(m);
  assert.equal(list.length, 1);
  model = list[0].id;
  assert.equal(model, "cedar-agent-tiny");
});

await check("a wrong token is rejected (401)", async () => {
  const bad = new OpenAI({ baseURL: url + "/v1", apiKey: "0".repeat(64), maxRetries: 0 });
  await assert.rejects(async () => { await bad.models.list(); }, (e) => e.status === 401);
});

let plain;
await check("plain completion", async () => {
  plain = await client.chat.completions.create({
    model, temperature: 0, max_tokens: 24,
    messages: [{ role: "system", content: system }, { role: "user", content: "Say hello." }],
  });
  assert.equal(plain.object, "chat.completion");
  assert.equal(plain.choices[0].message.role, "assistant");
  assert.equal(typeof plain.choices[0].message.content, "string");
  assert.ok(["stop", "length"].includes(plain.choices[0].finish_reason));
  assert.equal(plain.usage.total_tokens, plain.usage.prompt_tokens + plain.usage.completion_tokens);
});

await check("streamed completion (same text as plain under greedy decoding)", async () => {
  const stream = await client.chat.completions.create({
    model, temperature: 0, max_tokens: 24, stream: true, stream_options: { include_usage: true },
    messages: [{ role: "system", content: system }, { role: "user", content: "Say hello." }],
  });
  let text = "", finish = null, usage = null, first = true;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    if (!chunk.choices.length) continue;
    if (first) assert.equal(chunk.choices[0].delta.role, "assistant");
    first = false;
    text += chunk.choices[0].delta.content ?? "";
    finish = chunk.choices[0].finish_reason ?? finish;
  }
  assert.equal(text, plain.choices[0].message.content);
  assert.equal(finish, plain.choices[0].finish_reason);
  assert.ok(usage, "include_usage gives a usage chunk");
  assert.equal(usage.completion_tokens, plain.usage.completion_tokens);
  // The stream helper of the client assembles the same message.
  const s2 = client.chat.completions.stream({
    model, temperature: 0, max_tokens: 24,
    messages: [{ role: "system", content: system }, { role: "user", content: "Say hello." }],
  });
  const final = await s2.finalChatCompletion();
  assert.equal(final.choices[0].message.content, plain.choices[0].message.content);
});

const messages = [{ role: "system", content: system }, { role: "user", content: "What is 1234 * 5678?" }];
let first;
await check("a tool call", async () => {
  first = await client.chat.completions.create({ model, temperature: 0, max_tokens: 80, messages, tools });
  const c = first.choices[0];
  assert.equal(c.finish_reason, "tool_calls");
  const call = c.message.tool_calls[0];
  assert.equal(call.type, "function");
  assert.equal(call.function.name, "calculator");
  assert.equal(typeof JSON.parse(call.function.arguments), "object");
});

await check("a streamed tool call (runTools-style accumulation)", async () => {
  const s = client.chat.completions.stream({ model, temperature: 0, max_tokens: 80, messages, tools });
  let argPieces = 0;
  s.on("chunk", (chunk) => {
    for (const tc of chunk.choices[0]?.delta?.tool_calls || []) if (tc.function?.arguments) argPieces++;
  });
  const final = await s.finalChatCompletion();
  const call = final.choices[0].message.tool_calls[0];
  assert.equal(call.function.name, "calculator");
  assert.ok(call.id.startsWith("call_"));
  assert.equal(typeof JSON.parse(call.function.arguments), "object");
  // The arguments arrive in pieces as they are generated and add up to the unstreamed ones.
  assert.ok(argPieces >= 2, `argument pieces: ${argPieces}`);
  if (first) assert.equal(call.function.arguments, first.choices[0].message.tool_calls[0].function.arguments);
});

await check("the follow-up with the tool result reuses the first request's KV", async () => {
  assert.ok(first, "needs the tool call");
  const call = first.choices[0].message.tool_calls[0];
  const follow = await client.chat.completions.create({
    model, temperature: 0, max_tokens: 40, tools,
    messages: [...messages, first.choices[0].message, { role: "tool", tool_call_id: call.id, content: "7006652" }],
  });
  assert.equal(follow.choices[0].message.role, "assistant");
  assert.ok(follow.usage.prompt_tokens_details.cached_tokens > 0, JSON.stringify(follow.usage));
  assert.equal(follow.usage.prompt_tokens_details.cached_tokens, first.usage.total_tokens);
});

await check("a bad request is an APIError with status 400", async () => {
  await assert.rejects(
    async () => { await client.chat.completions.create({ model, messages: [{ role: "wizard", content: "x" }] }); },
    (e) => e.status === 400 && /role/.test(e.message));
});

stop();
console.log(failures ? `${failures} check(s) failed` : "all checks passed");
process.exit(failures ? 1 : 0);
