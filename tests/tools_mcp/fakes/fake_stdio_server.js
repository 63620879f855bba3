// A scripted MCP server over stdio for cedar's fault tests. Usage: node fake_stdio_server.js MODE [ARG]
// Modes (behaviour of tools/call unless said otherwise):
//   ok            answers everything; tools: slow(ms | until_fast: held until the next fast call
//                 was answered), fast, progress(steps, ms), huge(bytes)
//   exit          exits with code 3 when a tool is called
//   garbage       writes a line that is not JSON when a tool is called
//   silent        never answers tools/call; logs notifications/cancelled to stderr; keeps
//                 running after stdin closes (close() must escalate to SIGTERM)
//   bad-version   answers initialize with protocolVersion 1999-01-01
// In every mode: tools/list is paginated (2 pages); after the first tools/call the server sends
// notifications/tools/list_changed and adds tool "added"; it pings the client and sends an
// unknown request "sampling/createMessage" once initialized, logging the answers to stderr.
'use strict';
const mode = process.argv[2] || 'ok';
let buf = '';
let calls = 0;
let serverReq = 1000;
const heldSlow = [];  // ids of "slow" calls held until the next "fast" call was answered
const send = (m) => process.stdout.write(JSON.stringify(m) + '\n');
const log = (s) => process.stderr.write(s + '\n');
const schema = { type: 'object', properties: { ms: { type: 'number' }, steps: { type: 'number' }, bytes: { type: 'number' } } };
const page1 = [{ name: 'slow', inputSchema: schema }, { name: 'fast', inputSchema: schema }];
const page2 = [{ name: 'progress', inputSchema: schema }, { name: 'huge', inputSchema: schema }];
function result(id, text) { send({ jsonrpc: '2.0', id, result: { content: [{ type: 'text', text }] } }); }

function onMessage(m) {
  if (m.method === 'initialize') {
    const v = mode === 'bad-version' ? '1999-01-01' : m.params.protocolVersion;
    send({ jsonrpc: '2.0', id: m.id, result: { protocolVersion: v, capabilities: { tools: { listChanged: true } }, serverInfo: { name: 'fake', version: '1' } } });
    return;
  }
  if (m.method === 'notifications/initialized') {
    send({ jsonrpc: '2.0', id: serverReq++, method: 'ping' });
    send({ jsonrpc: '2.0', id: serverReq++, method: 'sampling/createMessage', params: {} });
    return;
  }
  if (m.method === 'notifications/cancelled') { log('cancelled ' + m.params.requestId + ' reason=' + m.params.reason); return; }
  if (m.method === undefined && m.id !== undefined) { log('client answered ' + m.id + ' ' + JSON.stringify(m.result !== undefined ? { result: m.result } : { error: m.error })); return; }
  if (m.method === 'tools/list') {
    if (!m.params || !m.params.cursor) send({ jsonrpc: '2.0', id: m.id, result: { tools: page1, nextCursor: 'p2' } });
    else {
      const tools = calls > 0 ? page2.concat([{ name: 'added', inputSchema: { type: 'object' } }]) : page2;
      send({ jsonrpc: '2.0', id: m.id, result: { tools } });
    }
    return;
  }
  if (m.method === 'tools/call') {
    calls++;
    if (calls === 1) send({ jsonrpc: '2.0', method: 'notifications/tools/list_changed' });
    const a = m.params.arguments || {};
    const token = m.params._meta && m.params._meta.progressToken;
    if (mode === 'exit') { log('fake server: exiting mid-call'); process.exit(3); }
    if (mode === 'garbage') { process.stdout.write('this is not JSON {{{\n'); return; }
    if (mode === 'silent') return;
    switch (m.params.name) {
      case 'slow':
        if (a.until_fast) { heldSlow.push(m.id); log('holding slow ' + m.id); }
        else setTimeout(() => result(m.id, 'slow done'), a.ms || 300);
        return;
      case 'fast':
        result(m.id, 'fast done');
        while (heldSlow.length) result(heldSlow.shift(), 'slow done');
        return;
      case 'huge': result(m.id, 'x'.repeat(a.bytes || 1000)); return;
      case 'added': result(m.id, 'added works'); return;
      case 'progress': {
        let i = 0;
        const steps = a.steps || 5;
        const timer = setInterval(() => {
          i++;
          send({ jsonrpc: '2.0', method: 'notifications/progress', params: { progressToken: token, progress: i, total: steps, message: 'step ' + i } });
          if (i >= steps) { clearInterval(timer); result(m.id, 'progress done'); }
        }, a.ms || 100);
        return;
      }
    }
    send({ jsonrpc: '2.0', id: m.id, error: { code: -32602, message: 'unknown tool ' + m.params.name } });
    return;
  }
  if (m.id !== undefined) send({ jsonrpc: '2.0', id: m.id, error: { code: -32601, message: 'Method not found' } });
}

process.stdin.on('data', (chunk) => {
  buf += chunk.toString('utf8');
  let nl;
  while ((nl = buf.indexOf('\n')) >= 0) {
    const line = buf.slice(0, nl);
    buf = buf.slice(nl + 1);
    if (line.trim()) onMessage(JSON.parse(line));
  }
});
process.stdin.on('end', () => {
  log('fake server: stdin closed');
  if (mode === 'silent') setInterval(() => {}, 1000);  // ignores EOF: only a signal stops it
  else process.exit(0);
});
