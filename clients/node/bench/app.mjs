// One HTTP server for the benchmark (bench.mjs starts it as its own process,
// so its CPU is its own): GET / limited by xcloak's Express middleware or by
// express-rate-limit with rate-limit-redis, on ioredis, same window and limit.
//   node bench/app.mjs xcloak|erl REDIS_PORT WINDOW_MS LIMIT
import express from 'express';
import Redis from 'ioredis';
import { rateLimit as erlRateLimit } from 'express-rate-limit';
import { RedisStore } from 'rate-limit-redis';
import { Limiter } from 'xcloak';
import { rateLimit } from 'xcloak/express';

const [kind, redisPort, windowMs, limit] = process.argv.slice(2);
const redis = new Redis({ port: Number(redisPort), host: '127.0.0.1' });
const app = express();
if (kind === 'xcloak') {
  app.use(rateLimit({ limiter: new Limiter(redis), limits: { window: Number(windowMs), limit: Number(limit) } }));
} else {
  app.use(
    erlRateLimit({
      windowMs: Number(windowMs),
      limit: Number(limit),
      standardHeaders: 'draft-8',
      legacyHeaders: false,
      store: new RedisStore({ sendCommand: (command, ...args) => redis.call(command, ...args), prefix: 'erl:' }),
    }),
  );
}
app.get('/', (req, res) => res.send('ok'));
const listener = app.listen(0, '127.0.0.1', () => process.send({ port: listener.address().port }));
process.on('message', (m) => {
  if (m === 'cpu') {
    const { user, system } = process.cpuUsage();
    process.send({ cpu: user + system });
  }
});
