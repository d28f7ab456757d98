// Teaches ioredis where the key of each XCLOAK command is, and which of them
// only read. Call it once, before creating clients:
//
//   const Redis = require('ioredis');
//   require('./xcloak-ioredis').install();
//   const cluster = new Redis.Cluster([{ host, port }], { scaleReads: 'slave' });
//   await cluster.call('xcloak.allow', 'rl:user:42', 60000, 100, 'DETAILS');
//
// Why: ioredis finds a command's keys, and whether it is read-only, only in the
// fixed table of the @ioredis/commands package. A module command is missing
// there, so a `Cluster` sends it to a random primary (two calls in three come
// back MOVED), a pipeline or auto-pipeline returns those MOVED errors to the
// caller, `keyPrefix` is not applied to its key and `scaleReads` never sends
// XCLOAK.PEEK to a replica. ioredis has no public hook for this (`defineCommand`
// is for Lua scripts), so `install` wraps the three lookups of that table that
// ioredis calls (`exists`, `hasFlag`, `getKeyIndexes`): for the names in
// XCLOAK_COMMANDS they answer from this file, for every other command they ask
// the original. Every path of ioredis goes through them: `Command` (routing and
// keyPrefix), `Pipeline`, auto-pipelining and the `scaleReads` choice.
//
// That reaches inside ioredis, so `install` accepts only the versions it was
// tested with (TESTED below) and throws on others, then checks that the lookups
// really changed. Call XCLOAK commands in lowercase, as ioredis's own commands
// are: `call('xcloak.allow', ...)` (`call('XCLOAK.ALLOW', ...)` routes as well:
// the names are matched in any case).
'use strict';

const path = require('node:path');

// Every xcloak command: the position of its key (1 = the first argument, as in
// COMMAND INFO) and whether it only reads (then `scaleReads` may send it to a
// replica). Add a command here and ioredis routes it.
const XCLOAK_COMMANDS = {
  'xcloak.allow': { key: 1, readonly: false },
  'xcloak.peek': { key: 1, readonly: true },
  'xcloak.refund': { key: 1, readonly: false },
  'xcloak.convert': { key: 1, readonly: false },
};

// Versions this file was tested with (tests/examples.rs runs it). ioredis
// 6.0.0 declares Node >= 20; every run of tests/examples.rs also passed on
// Debian 12's Node 18.20.4, which CI installs.
const TESTED = {
  ioredis: ['6.0.0'],
  '@ioredis/commands': ['2.0.0'],
};

const INSTALLED = Symbol.for('xcloak.ioredis.installed');

function packageDir(name, fromDir) {
  return path.dirname(require.resolve(`${name}/package.json`, { paths: [fromDir] }));
}

function checkVersion(name, dir) {
  const { version } = require(path.join(dir, 'package.json'));
  if (!TESTED[name].includes(version)) {
    throw new Error(
      `xcloak-ioredis: ${name} ${version} is not a tested version (tested: ${TESTED[name].join(', ')}). ` +
        'This helper wraps functions inside it: test it with this version, then add the version to TESTED.',
    );
  }
}

function spec(name) {
  return Object.prototype.hasOwnProperty.call(XCLOAK_COMMANDS, String(name).toLowerCase())
    ? XCLOAK_COMMANDS[String(name).toLowerCase()]
    : undefined;
}

// Installs the routing for XCLOAK_COMMANDS into the ioredis found from
// `fromDir` (default: the one this file resolves). Idempotent.
function install(fromDir = __dirname) {
  const ioredisDir = packageDir('ioredis', fromDir);
  const commandsDir = packageDir('@ioredis/commands', ioredisDir);
  checkVersion('ioredis', ioredisDir);
  checkVersion('@ioredis/commands', commandsDir);

  // The same module instance ioredis uses (resolved from ioredis's folder).
  const commands = require(commandsDir);
  if (!commands[INSTALLED]) {
    const { exists, hasFlag, getKeyIndexes } = commands;
    commands.exists = (name, options) => spec(name) !== undefined || exists(name, options);
    commands.hasFlag = (name, flag, options) => {
      const command = spec(name);
      if (command === undefined) return hasFlag(name, flag, options);
      return flag === (command.readonly ? 'readonly' : 'write');
    };
    commands.getKeyIndexes = (name, args, options) => {
      const command = spec(name);
      if (command === undefined) return getKeyIndexes(name, args, options);
      return args.length >= command.key ? [command.key - 1] : [];
    };
    commands[INSTALLED] = true;
  }

  // Fail now, not with MOVED later, if ioredis stopped reading the table
  // through these exports.
  const Command = require(path.join(ioredisDir, 'built/Command')).default;
  const probe = new Command('xcloak.peek', ['k', 1, 1], { keyPrefix: 'p:' });
  if (probe.getKeys()[0] !== 'p:k' || probe.args[0] !== 'p:k') {
    throw new Error('xcloak-ioredis: ioredis did not take the XCLOAK key positions; this version is not supported');
  }
  return XCLOAK_COMMANDS;
}

module.exports = { install, XCLOAK_COMMANDS, TESTED };
