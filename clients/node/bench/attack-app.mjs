// The attack bench's HTTP server (attack.mjs forks it, so its CPU is its own):
// an Express app on node:http, loopback, GET / limited by xcloak's Express
// middleware keyed by the `x-id` header (10 per 60 s), the block cache on or
// off; or the same route without the middleware (the latency baseline).
//   node bench/attack-app.mjs none|off|on REDIS_PORT WINDOW_MS LIMIT
import http from 'node:http';
import express from 'express';
import Redis from 'ioredis';
import { Limiter } from 'xcloak';
import { rateLimit } from 'xcloak/express';

const [mode, redisPort, windowMs, limit] = process.argv.slice(2);
const redis = new Redis({ port: Number(redisPort), host: '127.0.0.1' });
const limiter = new Limiter(redis, mode === 'off' ? { blockCache: 0 } : {});
const app = express();
if (mode !== 'none') {
  app.use(rateLimit({ limiter, key: (req) => String(req.headers['x-id']), limits: { window: Number(windowMs), limit: Number(limit) } }));
}
app.get('/', (req, res) => res.send('ok'));
const server = http.createServer({ keepAlive: true }, app);
server.listen(0, '127.0.0.1', () => process.send({ port: server.address().port }));
process.on('message', (m) => {
  if (m === 'cpu') {
    const { user, system } = process.cpuUsage();
    process.send({ cpu: user + system, stats: limiter.stats });
  }
});
