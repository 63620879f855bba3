// Browser test of the dashboard (ctest: dashboard_browser). Starts dashboard_test_server (the
// default model, a temp store, the MCP filesystem server, cedar's http_server with its generated
// token) on 127.0.0.1, checks that unauthenticated requests get 401, then drives Debian's /usr/bin/chromium (headless) with playwright-core:
// opens the dashboard with ?token=, starts an agent with a calculator question, sees its live
// tokens and its tool call, cancels a second agent mid-generation, opens the first session's
// timeline, the executor and MCP views. Screenshots go to --out.
//
//   node dashboard_browser_test.mjs --server BIN --model DIR --out DIR
import { spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

const arg = (k) => { const i = process.argv.indexOf(k); return i > 0 ? process.argv[i + 1] : undefined; };
const serverBin = arg('--server'), modelDir = arg('--model'), outDir = arg('--out');
if (!serverBin || !modelDir || !outDir) { console.error('usage: --server BIN --model DIR --out DIR'); process.exit(2); }
mkdirSync(outDir, { recursive: true });

let passed = 0;
function check(cond, what) {
  if (!cond) throw new Error('FAILED: ' + what);
  passed++;
  console.log('ok   ' + what);
}

const tmp = mkdtempSync(join(tmpdir(), 'cedar-dash-'));
// The MCP filesystem server (tests/tools_mcp/servers, npm) for the MCP view.
const fsServer = new URL('../tools_mcp/servers/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js', import.meta.url).pathname;
mkdirSync(join(tmp, 'ws'));
writeFileSync(join(tmp, 'mcp.json'), JSON.stringify({ mcpServers: { filesystem: { command: 'node', args: [fsServer, join(tmp, 'ws')] } } }));
const server = spawn(serverBin, ['--model', modelDir, '--store', join(tmp, 'store.db'), '--mcp', join(tmp, 'mcp.json')],
  { stdio: ['pipe', 'pipe', 'inherit'], env: Object.assign({}, process.env, { OMP_NUM_THREADS: '2' }) });
const [port, token] = await new Promise((resolve, reject) => {
  let buf = '';
  server.stdout.on('data', (d) => {
    buf += d;
    const m = buf.match(/listening (\d+) ([0-9a-f]+)\n/);
    if (m) resolve([Number(m[1]), m[2]]);
  });
  server.on('exit', (code) => reject(new Error('server exited with ' + code)));
});
const base = `http://127.0.0.1:${port}`;
let browser;

try {
  // ---- authentication ----------------------------------------------------------------------
  for (const path of ['/', '/api/dash/sessions', '/api/dash/events', '/dash/app.js']) {
    const r = await fetch(base + path);
    check(r.status === 401, `unauthenticated GET ${path} -> 401 (got ${r.status})`);
  }
  const wrong = await fetch(base + '/api/dash/sessions', { headers: { Authorization: 'Bearer ' + 'x'.repeat(48) } });
  check(wrong.status === 401, 'wrong bearer token -> 401');
  const post = await fetch(base + '/api/dash/agents', { method: 'POST', body: '{"message":"hi"}' });
  check(post.status === 401, 'unauthenticated POST /api/dash/agents -> 401');
  const ok = await fetch(base + '/api/dash/sessions', { headers: { Authorization: 'Bearer ' + token } });
  check(ok.status === 200, 'bearer token -> 200');

  // ---- the dashboard in chromium -------------------------------------------------------------
  browser = await chromium.launch({ executablePath: '/usr/bin/chromium', headless: true, args: ['--no-sandbox'] });
  const page = await browser.newPage({ viewport: { width: 1360, height: 900 } });
  const pageErrors = [];
  page.on('pageerror', (e) => pageErrors.push(String(e)));
  await page.goto(`${base}/?token=${token}`);
  await page.waitForSelector('#f-tools input[value="calculator"]');
  check(true, 'dashboard loaded with the token; the start form lists the calculator tool');
  await page.waitForFunction(() => document.querySelector('#conn').textContent === 'live', null, { timeout: 20000 });
  check(true, 'SSE stream connected');

  // Start an agent with a calculator question; the page switches to its session.
  // Offer only the calculator (the form checks every tool, MCP ones included).
  await page.$$eval('#f-tools input', (els) => els.forEach((e) => { e.checked = e.value === 'calculator'; }));
  await page.fill('#f-message', 'What is 17 * 23?');
  await page.click('#f-start');
  await page.waitForFunction(() => /^#\/session\/\d+$/.test(location.hash));
  const first = Number((await page.evaluate(() => location.hash)).split('/').pop());
  check(first > 0, `agent started: session ${first}`);
  await page.waitForFunction(() => document.querySelector('#live-text').textContent.length > 0, null, { timeout: 60000 });
  check(true, 'live tokens appear: ' + JSON.stringify((await page.textContent('#live-text')).slice(0, 60)));
  await page.waitForSelector('#live-tools .tool-call[data-tool="calculator"], #timeline .tool-call[data-tool="calculator"]', { timeout: 90000 });
  check(true, 'the calculator tool call appears');
  await page.waitForFunction(() => { const s = document.querySelector('#s-status'); return s && s.textContent !== 'running'; }, null, { timeout: 120000 });
  await page.waitForSelector('#s-masked', { timeout: 20000 });
  const masked = await page.textContent('#s-masked');
  check(/^grammar-masked draws \d+$/.test(masked.trim()), 'the turn summary shows the grammar-masked draws: ' + masked.trim());
  const callText = await page.textContent('#timeline .tool-call[data-tool="calculator"]');
  // The default model is small and undertrained: it calls the calculator, not always with 17 * 23.
  check(/expression/.test(callText), 'the tool call shows its arguments: ' + callText.replace(/\s+/g, ' ').slice(0, 80));
  check(/→|error:/.test(callText) && /ms/.test(callText), 'the tool call shows its result and duration');
  await page.screenshot({ path: join(outDir, 'session-live.png') });

  // A second agent with a long reply, cancelled while it generates: "Min new tokens" keeps the
  // reply from ending before 4000 tokens (the small model answers a story request in a few
  // words). Should the click still miss, another agent is started (at most 3 attempts).
  let second = 0;
  for (let attempt = 1; attempt <= 3 && !second; attempt++) {
    await page.goto(`${base}/#/sessions`);
    await page.fill('#f-message', 'Write a very long story about a cedar tree, with many chapters.');
    await page.fill('#f-max', '4000');
    await page.fill('#f-min', '4000');
    await page.$$eval('#f-tools input', (els) => els.forEach((e) => { e.checked = e.value === 'clock'; }));
    const before = await page.evaluate(() => location.hash);
    await page.click('#f-start');
    await page.waitForFunction((b) => /^#\/session\/\d+$/.test(location.hash) && location.hash !== b, before);
    const id = Number((await page.evaluate(() => location.hash)).split('/').pop());
    const running = await page.waitForFunction(() => !document.querySelector('#btn-cancel').disabled, null, { timeout: 20000 })
      .then(() => true, () => false);
    if (!running) { console.log(`note: session ${id} finished before it could be cancelled; retrying`); continue; }
    const clicked = await page.click('#btn-cancel', { timeout: 3000 }).then(() => true, () => false);
    if (!clicked) { console.log(`note: session ${id} finished before the click; retrying`); continue; }
    await page.waitForFunction(() => document.querySelector('#s-cancelled') || (document.querySelector('#s-status') || {}).textContent === 'waiting', null, { timeout: 60000 });
    if (await page.$('#s-cancelled')) second = id;
    else console.log(`note: session ${id} ended before the cancel reached it; retrying`);
  }
  check(second > 0, `session ${second} cancelled mid-generation`);
  const detail = await (await fetch(`${base}/api/dash/sessions/${second}`, { headers: { Authorization: 'Bearer ' + token } })).json();
  const last = detail.turn_summaries[detail.turn_summaries.length - 1];
  check(last.cancelled === true && last.generated_tokens < 4000, `the cancelled turn stopped early (${last.generated_tokens} tokens)`);

  // The sessions list shows both, with KV bytes; the first session's timeline has its metrics.
  await page.goto(`${base}/#/sessions`);
  await page.waitForSelector(`#sessions-table tr[data-session="${second}"]`);
  const row = await page.textContent(`#sessions-table tr[data-session="${first}"]`);
  check(/waiting|done/.test(row) && /KiB|MiB/.test(row), 'sessions list: status and KV bytes: ' + row.replace(/\s+/g, ' ').slice(0, 100));
  await page.screenshot({ path: join(outDir, 'sessions.png') });
  await page.click(`#sessions-table tr[data-session="${first}"]`);
  await page.waitForSelector('#timeline .turn div.metrics');
  const metrics = await page.textContent('#timeline .turn div.metrics');
  check(/prompt/.test(metrics) && /resume (fresh|resident|replayed|reprefilled)/.test(metrics) && /tok\/s/.test(metrics),
    'timeline shows per-generation metrics: ' + metrics.replace(/\s+/g, ' ').slice(0, 120));
  await page.screenshot({ path: join(outDir, 'timeline.png'), fullPage: true });

  // Fork the first session after its first turn and resume the fork with a new question.
  await page.click('#timeline .btn-fork');
  await page.waitForFunction((f) => { const m = location.hash.match(/^#\/session\/(\d+)$/); return m && Number(m[1]) !== f; }, first);
  await page.waitForSelector('#timeline .turn');
  check(true, 'fork at a turn opens the forked session with its history');

  // A turn the repeat guard ends (max_repeated_failures 1; the default model asks for a missing
  // note, a variant, then one of them again): the timeline says why and shows the call not run.
  const guarded = await (await fetch(`${base}/api/dash/agents`, {
    method: 'POST', headers: { Authorization: 'Bearer ' + token, 'Content-Type': 'application/json' },
    body: JSON.stringify({ name: 'notes', message: 'Look up my note called ploutwo.', max_new_tokens: 120,
      tools: ['notes_read', 'notes_save', 'calculator'], max_tool_rounds: 8, max_repeated_failures: 1,
      system_prompt: 'You are cedar, a helpful assistant. Use the tools when they help.' }) })).json();
  check(guarded.session > 0, `agent with max_repeated_failures 1 started: session ${guarded.session}`);
  await page.goto(`${base}/#/session/${guarded.session}`);
  await page.waitForSelector('#timeline .turn-end[data-turn-end="repeat_limit"]', { timeout: 120000 });
  const endText = await page.textContent('#timeline .turn-end');
  check(/repeated a call that had already failed/.test(endText) && /not run: notes_read/.test(endText),
    'the timeline shows the turn ended by the repeat guard: ' + endText.replace(/\s+/g, ' ').slice(0, 120));

  await page.goto(`${base}/#/executor`);
  await page.waitForSelector('#exec-chart .uplot', { timeout: 20000 });
  check(true, 'executor view draws the tok/s chart (uPlot)');
  await page.screenshot({ path: join(outDir, 'executor.png') });
  await page.goto(`${base}/#/mcp`);
  await page.waitForSelector('#tool-stats tbody tr');
  check(/calculator/.test(await page.textContent('#tool-stats')), 'tool call statistics list the calculator');
  const mcpText = await page.textContent('#mcp-list');
  check(/filesystem/.test(mcpText) && /ready/.test(mcpText) && /20\d\d-\d\d-\d\d/.test(mcpText), 'MCP view: the filesystem server, ready, with its protocol version');
  await page.click('#mcp-list details:last-child summary');
  check(/allowed directories/i.test(await page.textContent('#mcp-list')), 'MCP view: the server\'s stderr tail');
  await page.screenshot({ path: join(outDir, 'mcp.png') });
  check(pageErrors.length === 0, 'no JavaScript errors on the page ' + pageErrors.join('; '));
  console.log(`dashboard browser test: ${passed} checks passed; screenshots in ${outDir}`);
} catch (e) {
  console.error(e.message || e);
  process.exitCode = 1;
} finally {
  if (browser) await browser.close();
  server.stdin.end();
  await new Promise((r) => { const t = setTimeout(() => { server.kill('SIGKILL'); r(); }, 30000); server.on('exit', () => { clearTimeout(t); r(); }); });
  rmSync(tmp, { recursive: true, force: true });
}
