// Jest runs the built package (dist/), as users get it; `npm test` builds it first.
export default {
  testEnvironment: 'node',
  transform: {},
  testMatch: ['<rootDir>/tests/node/**/*.test.mjs'],
  moduleNameMapper: { '^sdpa-wasm$': '<rootDir>/dist/index.js' },
  testTimeout: 120000,
};
