// A scripted Streamable HTTP MCP server for cedar's fault tests, bound to 127.0.0.1:$PORT.
// Usage: PORT=p node fake_http_server.js
//   - initialize creates session "s<n>"; every other request must carry the current session.
//   - tool "drop": answers, then forgets the session: the next request gets 400
//     "Bad Request: No valid session ID provided" (what the reference server says).
//   - tool "inits": returns the number of initialize requests seen (text).
//   - tool "resume": replies with SSE: a priming event (id "e1", retry 150, empty data), then
//     closes the stream; the response comes on GET with Last-Event-ID: e1.
//   - tool "hang": never answers (stream stays open); notifications/cancelled are counted.
//   - tool "cancels": returns the number of notifications/cancelled received.
//   - GET without Last-Event-ID: 405 (no server stream). DELETE: ends the session.
'use strict';
const http = require('http');
let inits = 0, cancels = 0, deletes = 0, nextSession = 1;
let session = null;
const pendingResume = new Map();  // event id -> response message
function sseHeaders(res) { res.writeHead(200, { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache', 'Mcp-Session-Id': session }); }
function text(id, t) { return { jsonrpc: '2.0', id, result: { content: [{ type: 'text', text: String(t) }] } }; }

const server = http.createServer((req, res) => {
  let body = '';
  req.on('data', (c) => { body += c; });
  req.on('end', () => {
    if (req.method === 'DELETE') { deletes++; session = null; res.writeHead(200); res.end(); return; }
    if (req.method === 'GET') {
      const last = req.headers['last-event-id'];
      if (!last) { res.writeHead(405); res.end(); return; }
      const msg = pendingResume.get(last);
      if (!msg) { res.writeHead(404); res.end(); return; }
      pendingResume.delete(last);
      sseHeaders(res);
      res.end('id: e2\ndata: ' + JSON.stringify(msg) + '\n\n');
      return;
    }
    const accept = req.headers['accept'] || '';
    if (!accept.includes('application/json') || !accept.includes('text/event-stream')) { res.writeHead(406); res.end('need both accept types'); return; }
    const m = JSON.parse(body);
    if (m.method === 'initialize') {
      inits++;
      session = 's' + (nextSession++);
      res.writeHead(200, { 'Content-Type': 'application/json', 'Mcp-Session-Id': session });
      res.end(JSON.stringify({ jsonrpc: '2.0', id: m.id, result: { protocolVersion: m.params.protocolVersion, capabilities: { tools: {} }, serverInfo: { name: 'fake-http', version: '1' } } }));
      return;
    }
    if (!session || req.headers['mcp-session-id'] !== session) {
      res.writeHead(400, { 'Content-Type': 'application/json' });
      res.end(JSON.stringify({ jsonrpc: '2.0', error: { code: -32000, message: 'Bad Request: No valid session ID provided' }, id: null }));
      return;
    }
    if (!req.headers['mcp-protocol-version']) { res.writeHead(400); res.end('missing MCP-Protocol-Version'); return; }
    if (m.id === undefined) {  // notification or response
      if (m.method === 'notifications/cancelled') cancels++;
      res.writeHead(202); res.end(); return;
    }
    if (m.method === 'tools/list') {
      const tools = ['drop', 'inits', 'resume', 'hang', 'cancels', 'deletes'].map((name) => ({ name, inputSchema: { type: 'object' } }));
      res.writeHead(200, { 'Content-Type': 'application/json' });
      res.end(JSON.stringify({ jsonrpc: '2.0', id: m.id, result: { tools } }));
      return;
    }
    if (m.method === 'tools/call') {
      const name = m.params.name;
      if (name === 'hang') { sseHeaders(res); res.write(': waiting\n\n'); return; }
      if (name === 'resume') {
        pendingResume.set('e1', text(m.id, 'resumed'));
        sseHeaders(res);
        res.end('id: e1\nretry: 150\ndata:\n\n');
        return;
      }
      let reply;
      if (name === 'drop') { reply = text(m.id, 'dropping session'); }
      else if (name === 'inits') reply = text(m.id, inits);
      else if (name === 'cancels') reply = text(m.id, cancels);
      else if (name === 'deletes') reply = text(m.id, deletes);
      else reply = { jsonrpc: '2.0', id: m.id, error: { code: -32602, message: 'unknown tool' } };
      sseHeaders(res);
      res.end('event: message\ndata: ' + JSON.stringify(reply) + '\n\n');
      if (name === 'drop') session = null;
      return;
    }
    res.writeHead(200, { 'Content-Type': 'application/json' });
    res.end(JSON.stringify({ jsonrpc: '2.0', id: m.id, error: { code: -32601, message: 'Method not found' } }));
  });
});
server.listen(Number(process.env.PORT), '127.0.0.1', () => process.stderr.write('fake http server on ' + process.env.PORT + '\n'));
process.on('SIGTERM', () => process.exit(0));
