// Preload (`node --require loopback.cjs ...`) that forces every listening socket onto
// 127.0.0.1, whatever host the server asks for (server-everything binds all interfaces).
'use strict';
const net = require('net');
const dns = require('dns');
const original = net.Server.prototype.listen;
const LOOPBACK = '127.0.0.1';
net.Server.prototype.listen = function (...args) {
  if (args.length > 0 && typeof args[0] === 'object' && args[0] !== null && !Array.isArray(args[0])) {
    if (args[0].path === undefined) args[0] = Object.assign({}, args[0], { host: LOOPBACK });
  } else if (args.length > 0 && (typeof args[0] === 'number' || (typeof args[0] === 'string' && /^\d+$/.test(args[0])))) {
    // listen(port[, host][, backlog][, cb])
    if (typeof args[1] === 'string') args[1] = LOOPBACK;
    else args.splice(1, 0, LOOPBACK);
  } else if (args.length === 0 || typeof args[0] === 'function') {
    args.unshift(0, LOOPBACK);
  }
  return original.apply(this, args);
};

// With a host, net.Server.listen resolves it through dns.lookup before binding, which makes
// listen() asynchronous; servers that read server.address() right after listen(0) (the
// conformance suite) would break. Answer lookups of the loopback literal synchronously.
const originalLookup = dns.lookup;
dns.lookup = function (hostname, options, callback) {
  if (hostname === LOOPBACK) {
    const cb = typeof options === 'function' ? options : callback;
    const all = typeof options === 'object' && options !== null && options.all;
    if (all) cb(null, [{ address: LOOPBACK, family: 4 }]);
    else cb(null, LOOPBACK, 4);
    return {};
  }
  return originalLookup.apply(this, arguments);
};
