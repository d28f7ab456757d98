// ESLint (flat config): the recommended rules of ESLint and typescript-eslint
// over src/ (TypeScript), test/ and scripts/ (ES modules on Node). lint.sh runs
// it after `tsc --noEmit`.
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

const node = Object.fromEntries(
  [
    'process', 'console', 'Buffer', 'URL', 'fetch', 'performance', 'AbortController', 'AbortSignal',
    'setTimeout', 'clearTimeout', 'setInterval', 'clearInterval', 'setImmediate', 'queueMicrotask', 'structuredClone',
  ].map((name) => [name, 'readonly']),
);

export default tseslint.config(
  { ignores: ['dist/', 'node_modules/', '.cache/', 'bench/', 'src/lua.generated.ts'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    languageOptions: { globals: node },
    rules: {
      // The transports take the client libraries' objects, which this package does not import.
      '@typescript-eslint/no-explicit-any': 'off',
      // ioredis is CommonJS: its copy is found and loaded with require() at run time.
      '@typescript-eslint/no-require-imports': 'off',
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', caughtErrors: 'none' }],
    },
  },
);
