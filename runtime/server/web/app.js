// cedar dashboard: plain JS. Views are rendered from the JSON endpoints under /api/dash/ and
// refreshed from the SSE stream /api/dash/events (observer events: tokens, tool calls, turns,
// executor samples). Authentication rides on the cookie the server sets when the page is opened
// with ?token=; the token is also sent as a bearer header on fetches.
'use strict';

const params = new URLSearchParams(location.search);
if (params.get('token')) sessionStorage.setItem('cedar_token', params.get('token'));
const token = sessionStorage.getItem('cedar_token') || '';

const state = { view: 'sessions', session: null, sessions: [], execSamples: [], charts: {}, refreshTimer: null };

async function api(path, opts = {}) {
  const headers = Object.assign({}, opts.headers || {});
  if (token) headers['Authorization'] = 'Bearer ' + token;
  if (opts.body) headers['Content-Type'] = 'application/json';
  const r = await fetch(path, Object.assign({}, opts, { headers, credentials: 'same-origin' }));
  const j = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error((j.error && j.error.message) || ('HTTP ' + r.status));
  return j;
}

const el = (tag, attrs = {}, ...kids) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === 'class') e.className = v; else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const k of kids) if (k !== null && k !== undefined) e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  return e;
};
const $ = (s) => document.querySelector(s);
const fmtBytes = (n) => n >= 1 << 20 ? (n / (1 << 20)).toFixed(2) + ' MiB' : n >= 1024 ? (n / 1024).toFixed(1) + ' KiB' : n + ' B';
const fmtMs = (n) => n >= 1000 ? (n / 1000).toFixed(2) + ' s' : n.toFixed(1) + ' ms';
const ago = (ms) => { const s = Math.max(0, (Date.now() - ms) / 1000); return s < 60 ? s.toFixed(0) + ' s ago' : s < 3600 ? (s / 60).toFixed(0) + ' min ago' : new Date(ms).toLocaleString(); };
const metric = (label, value) => el('span', {}, label + ' ', el('b', {}, value));

// ---- routing ---------------------------------------------------------------------------------
function route() {
  const h = location.hash || '#/sessions';
  const m = h.match(/^#\/session\/(\d+)/);
  state.view = m ? 'session' : h.slice(2) || 'sessions';
  state.session = m ? Number(m[1]) : null;
  document.querySelectorAll('.view').forEach((v) => v.classList.toggle('active', v.id === 'view-' + state.view));
  document.querySelectorAll('nav a').forEach((a) => a.classList.toggle('active', a.dataset.view === state.view));
  refresh();
}

function refresh() {
  if (state.view === 'sessions') loadSessions();
  else if (state.view === 'session') loadSession();
  else if (state.view === 'executor') loadExecutor();
  else if (state.view === 'mcp') loadMcp();
}
// Coalesces bursts of events into one refresh.
function refreshSoon() {
  if (state.refreshTimer) return;
  state.refreshTimer = setTimeout(() => { state.refreshTimer = null; refresh(); }, 250);
}

// ---- sessions --------------------------------------------------------------------------------
async function loadSessions() {
  try {
    const j = await api('/api/dash/sessions');
    state.sessions = j.sessions;
    const tb = $('#sessions-table tbody');
    tb.replaceChildren(...j.sessions.slice().reverse().map((s) => el('tr', { class: 'clickable', 'data-session': s.id, onclick: () => { location.hash = '#/session/' + s.id; } },
      el('td', {}, s.id), el('td', {}, s.agent), el('td', {}, el('span', { class: 'status ' + s.status }, s.status)),
      el('td', {}, s.turns), el('td', {}, s.tokens), el('td', {}, s.context),
      el('td', {}, fmtBytes(s.kv_fp4_bytes)), el('td', {}, fmtBytes(s.kv_bf16_bytes) + (s.kv_fp4_bytes ? ' (' + (s.kv_bf16_bytes / s.kv_fp4_bytes).toFixed(1) + '×)' : '')),
      el('td', {}, ago(s.last_activity_ms)),
      el('td', {}, s.running ? el('button', { class: 'secondary btn-cancel-row', onclick: (e) => { e.stopPropagation(); cancel(s.id); } }, 'Cancel') : ''))));
  } catch (e) { $('#f-error').textContent = e.message; }
}

async function loadTools() {
  try {
    const j = await api('/api/dash/tools');
    $('#f-tools').replaceChildren(el('legend', {}, 'Tools'), ...j.tools.map((t) =>
      el('label', { title: t.description }, el('input', { type: 'checkbox', value: t.name, checked: '' }), ' ' + t.name)));
  } catch (e) { $('#f-error').textContent = e.message; }
}

$('#start-form').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  $('#f-error').textContent = '';
  const tools = [...document.querySelectorAll('#f-tools input:checked')].map((i) => i.value);
  try {
    const j = await api('/api/dash/agents', { method: 'POST', body: JSON.stringify({
      name: $('#f-name').value, system_prompt: $('#f-system').value, message: $('#f-message').value,
      tools, max_new_tokens: Number($('#f-max').value), min_new_tokens: Number($('#f-min').value) }) });
    location.hash = '#/session/' + j.session;
  } catch (e) { $('#f-error').textContent = e.message; }
});

async function cancel(id) {
  try { await api('/api/dash/sessions/' + id + '/cancel', { method: 'POST' }); } catch (e) { $('#s-error').textContent = e.message; }
  refreshSoon();
}

// ---- one session -------------------------------------------------------------------------------
function toolCallBox(call, result) {
  const box = el('div', { class: 'tool-call' + (result && result.is_error ? ' error' : ''), 'data-tool': call.name });
  box.append(el('div', {}, el('b', {}, call.name), ' ', el('code', {}, call.arguments)));
  if (result) box.append(el('div', {}, (result.is_error ? 'error: ' : '→ ') + result.content,
    el('span', { class: 'metrics' }, '  ' + fmtMs(result.ms || 0))));
  else box.append(el('div', { class: 'metrics' }, 'running…'));
  return box;
}

// A reply whose calls a limit stopped (agent_options::max_tool_rounds or max_repeated_failures),
// with those calls. With answer_on_limit (the default) they stay in the reply's tool_calls with
// "not run" results and one more reply, without tools, ends the turn; else the turn ended here.
function turnEndBox(p) {
  const limit = p.turn_end === 'repeat_limit'
    ? 'the model repeated a call that had already failed'
    : 'tool round limit reached';
  const why = (p.tool_calls || []).length
    ? 'limit: ' + limit + ' (one final reply without tools follows)'
    : 'turn ended: ' + limit;
  const box = el('div', { class: 'turn-end', 'data-turn-end': p.turn_end }, why);
  for (const c of p.refused_calls || [])
    box.append(el('div', {}, 'not run: ', el('b', {}, c.name), ' ', el('code', {}, c.arguments)));
  return box;
}

function renderTimeline(s) {
  // Group the transcript by user turn: a user item opens a block; assistant, tool_call and
  // tool_result items belong to it.
  const blocks = [];
  for (const it of s.items) {
    if (it.kind === 'system') continue;
    if (it.kind === 'user' || !blocks.length) blocks.push({ user: null, items: [], lastTurn: it.turn });
    const b = blocks[blocks.length - 1];
    if (it.kind === 'user') b.user = it; else b.items.push(it);
    b.lastTurn = Math.max(b.lastTurn, it.turn);
  }
  const results = {};
  for (const it of s.items) if (it.kind === 'tool_result') results[it.payload.tool_call_id] = it.payload;
  return blocks.map((b, i) => {
    const div = el('div', { class: 'turn', 'data-turn': i });
    div.append(el('div', { class: 'turn-head' }, el('b', {}, 'Turn ' + (i + 1)),
      el('span', { class: 'turn-info' }, 'store turns ≤ ' + b.lastTurn),
      el('button', { class: 'secondary btn-fork', onclick: () => fork(s.id, b.lastTurn + 1) }, 'Fork after this turn')));
    if (b.user) div.append(el('div', { class: 'item' }, el('span', { class: 'kind' }, 'user'), b.user.payload.content));
    for (const it of b.items) {
      if (it.kind === 'assistant') {
        const m = it.metrics || {};
        div.append(el('div', { class: 'item' }, el('span', { class: 'kind' }, 'assistant'), it.payload.content || ''));
        div.append(el('div', { class: 'metrics' }, metric('prompt', m.prompt_tokens), metric('cached', m.cached_tokens),
          metric('replayed', m.replayed_tokens), metric('new', m.new_tokens), metric('generated', m.generated_tokens),
          metric('resume', m.resume_path), metric('TTFT', fmtMs(m.ttft_ms || 0)), metric('decode', (m.decode_tok_s || 0).toFixed(1) + ' tok/s')));
        for (const c of it.payload.tool_calls || []) div.append(toolCallBox(c, results[c.id]));
        if (it.payload.turn_end) div.append(turnEndBox(it.payload));
      }
    }
    return div;
  });
}

async function loadSession() {
  const id = state.session;
  try {
    const s = await api('/api/dash/sessions/' + id);
    if (state.session !== id) return;
    $('#s-title').textContent = 'Session ' + s.id + ' — ' + s.agent;
    const last = s.turn_summaries.length ? s.turn_summaries[s.turn_summaries.length - 1] : null;
    // The store's per-turn timings outlive the observer (a restart): the last one when no live summary.
    const stored = (s.turn_timings || []).length ? s.turn_timings[s.turn_timings.length - 1] : null;
    $('#s-summary').replaceChildren(...[el('span', { class: 'status ' + s.status, id: 's-status' }, s.status),
      metric('turns', s.turns), metric('tokens', s.tokens), metric('KV FP4', fmtBytes(s.kv_fp4_bytes)),
      metric('bf16', fmtBytes(s.kv_bf16_bytes)), s.parent >= 0 ? metric('fork of', s.parent) : null,
      last ? metric('last turn: first token', fmtMs(last.first_token_ms)) : null,
      last ? metric('total', fmtMs(last.total_ms)) : null,
      last ? metric('tool calls', last.tool_calls) : null,
      // draws the tool-call grammar rejected in the last turn (constrained decoding)
      last ? el('span', { id: 's-masked', title: 'sampled tokens the tool-call grammar rejected and redrew' },
        'grammar-masked draws ', el('b', {}, last.masked_tokens ?? 0)) : null,
      !last && stored ? metric('last turn: first token', fmtMs(stored.ttft_ms)) : null,
      !last && stored ? metric('decode', stored.decode_tok_s.toFixed(1) + ' tok/s') : null,
      last && last.cancelled ? el('b', { id: 's-cancelled' }, 'cancelled') : null,
      last && last.error ? el('span', { class: 'error' }, last.error) : null].filter((x) => x));
    $('#btn-cancel').disabled = !s.running;
    $('#live-text').textContent = s.live_text;
    renderLiveTools(s.events);
    $('#timeline').replaceChildren(...renderTimeline(s));
  } catch (e) { $('#s-error').textContent = e.message; }
}

// Tool calls of the running (or last) turn, from the observer's events.
function renderLiveTools(events) {
  let begin = 0;
  events.forEach((e, i) => { if (e.type === 'turn_begin') begin = i; });
  const calls = [], res = {};
  for (const e of events.slice(begin)) {
    if (e.type === 'tool_call') calls.push(e.data);
    if (e.type === 'tool_result') res[e.data.id] = { content: e.data.text, is_error: e.data.is_error, ms: e.data.ms };
  }
  $('#live-tools').replaceChildren(...calls.map((c) => toolCallBox(c, res[c.id])));
}

$('#btn-cancel').addEventListener('click', () => cancel(state.session));
$('#btn-resume').addEventListener('click', async () => {
  $('#s-error').textContent = '';
  try {
    await api('/api/dash/sessions/' + state.session + '/resume', { method: 'POST', body: JSON.stringify({ message: $('#s-message').value }) });
    $('#live-text').textContent = '';
  } catch (e) { $('#s-error').textContent = e.message; }
});
async function fork(id, turns) {
  try {
    const j = await api('/api/dash/sessions/' + id + '/fork', { method: 'POST', body: JSON.stringify({ turns }) });
    location.hash = '#/session/' + j.session;
  } catch (e) { $('#s-error').textContent = e.message; }
}

// ---- executor ----------------------------------------------------------------------------------
function chart(key, target, title, series, data) {
  if (!window.uPlot) return;
  const opts = { title, width: Math.min(900, target.clientWidth || 900), height: 220,
    scales: { x: { time: true } }, series: [{}].concat(series.map((s) => ({ label: s.label, stroke: s.color, width: 2 }))) };
  if (state.charts[key]) state.charts[key].setData(data);
  else state.charts[key] = new uPlot(opts, data, target);
}

async function loadExecutor() {
  try {
    const x = await api('/api/dash/executor');
    $('#exec-summary').replaceChildren(metric('resident sequences', x.n_resident), metric('active', x.n_active),
      metric('RAM', fmtBytes(x.resident_bytes) + ' / ' + fmtBytes(x.ram_budget)), metric('steps', x.steps),
      metric('tokens generated', x.tokens_generated), metric('max batch', x.max_batch));
    state.execSamples = x.samples;
    drawExec();
  } catch (e) { $('#exec-summary').textContent = e.message; }
}
function drawExec() {
  const s = state.execSamples;
  const t = s.map((p) => p.t_ms / 1000);
  chart('toks', $('#exec-chart'), 'decode tok/s', [{ label: 'tok/s', color: '#2f6f4f' }], [t, s.map((p) => p.tok_s)]);
  chart('batch', $('#exec-batch-chart'), 'batch and residents', [{ label: 'batch', color: '#0b4f8a' }, { label: 'resident', color: '#b36b00' }],
    [t, s.map((p) => p.batch), s.map((p) => p.n_resident)]);
}

// ---- MCP ---------------------------------------------------------------------------------------
async function loadMcp() {
  try {
    const [m, t] = await Promise.all([api('/api/dash/mcp'), api('/api/dash/tools')]);
    $('#mcp-list').replaceChildren(...(m.servers.length ? m.servers.map((s) => el('div', { class: 'mcp-server' },
      el('h3', {}, s.name + ' ', el('span', { class: 'status ' + (s.status === 'ready' ? 'done' : 'failed') }, s.status)),
      el('div', { class: 'summary' }, metric('protocol', s.protocol_version), metric('server', s.server_name + ' ' + s.server_version),
        metric('transport', s.transport), metric('calls', s.calls), metric('errors', s.errors),
        metric('mean latency', s.calls ? fmtMs(s.total_ms / s.calls) : '–'), metric('re-initialized', s.reinitialized)),
      ...s.tools.map((tl) => el('details', {}, el('summary', {}, tl.name + (tl.stats ? ' — ' + tl.stats.calls + ' calls, ' + tl.stats.errors + ' errors' : '')),
        el('div', {}, tl.description), el('pre', {}, JSON.stringify(tl.input_schema, null, 2)))),
      el('details', {}, el('summary', {}, 'stderr tail'), el('pre', {}, s.stderr_tail || '(empty)')))) : [el('p', {}, 'No MCP servers configured.')]));
    $('#tool-stats tbody').replaceChildren(...t.tools.filter((x) => x.stats).map((x) => el('tr', {}, el('td', {}, x.name),
      el('td', {}, x.stats.calls), el('td', {}, x.stats.errors), el('td', {}, (x.stats.total_ms / x.stats.calls).toFixed(1)),
      el('td', {}, x.stats.max_ms.toFixed(1)), el('td', {}, x.stats.last_error))));
  } catch (e) { $('#mcp-list').textContent = e.message; }
}

// ---- live events -------------------------------------------------------------------------------
function connect() {
  const es = new EventSource('/api/dash/events');
  es.onopen = () => { $('#conn').textContent = 'live'; };
  es.onerror = () => { $('#conn').textContent = 'reconnecting…'; };
  es.onmessage = (m) => {
    const e = JSON.parse(m.data);
    if (e.type === 'executor') {
      state.execSamples.push(Object.assign({ t_ms: e.t_ms }, e.data));
      if (state.execSamples.length > 900) state.execSamples.shift();
      if (state.view === 'executor') drawExec();
      return;
    }
    if (state.view === 'session' && e.session === state.session) {
      if (e.type === 'token') $('#live-text').textContent += e.data.text;
      else if (e.type === 'turn_begin') { $('#live-text').textContent = ''; $('#btn-cancel').disabled = false; refreshSoon(); }
      else refreshSoon();
    } else if (state.view === 'sessions' && e.type !== 'token') refreshSoon();
    else if (state.view === 'mcp' && e.type === 'tool_result') refreshSoon();
  };
}

window.addEventListener('hashchange', route);
loadTools();
route();
connect();
