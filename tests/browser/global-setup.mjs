// Runs once before the browser tests: the package must be built, and old screenshots go.
import { existsSync, mkdirSync, rmSync } from 'node:fs';
import { DIST_INDEX, SCREENSHOTS } from './helpers.mjs';

export default function globalSetup() {
  if (!existsSync(DIST_INDEX)) {
    throw new Error(`${DIST_INDEX} is missing: build the package first (npm run build)`);
  }
  rmSync(SCREENSHOTS, { recursive: true, force: true });
  mkdirSync(SCREENSHOTS, { recursive: true });
}
