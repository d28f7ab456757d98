// The bundled Lua fallback (docs/clients.md, Fallback): byte-identical copies
// of src/lua/*.lua, kept in this package's lua/ by scripts/sync-lua.sh and
// embedded at build time (scripts/build.mjs writes lua.generated.ts), so the
// package needs no file access at run time and survives bundlers.

import { createHash } from 'node:crypto';
import { ALLOW_LUA, PEEK_LUA, REFUND_LUA } from './lua.generated.js';

export interface Script {
  /** The file in lua/ (and in src/lua/ of the xcloak repository). */
  readonly file: string;
  readonly text: string;
  /** SHA-1 of the text, what EVALSHA takes. */
  readonly sha: string;
  /** Whether it writes (ALLOW, REFUND): never re-sent once it may have reached the server. */
  readonly writes: boolean;
}

function script(file: string, text: string, writes: boolean): Script {
  return { file, text, sha: createHash('sha1').update(text).digest('hex'), writes };
}

export const SCRIPTS = {
  allow: script('xcloak_allow.lua', ALLOW_LUA, true),
  peek: script('xcloak_peek.lua', PEEK_LUA, false),
  refund: script('xcloak_refund.lua', REFUND_LUA, true),
} as const;
