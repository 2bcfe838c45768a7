// The browser cases in WebKit (WebCore, JavaScriptCore: Safari's engine): WebKitGTK's
// MiniBrowser, driven by WebKitGTK's WebDriver on a virtual X display (browsers.mjs). What runs:
// engine-tests.mjs. WebKit has no relaxed SIMD, as Safari has none, so feature detection must
// pick the portable build even when relaxedSimd asks for the other; and WebKitGTK gives no
// SharedArrayBuffer even to a cross-origin isolated page, so every instance runs one thread
// there (the tests check that the package falls back, and why). scripts/test-browser.sh runs
// this file (node --experimental-wasm-relaxed-simd tests/engines/webkit.test.mjs).
import { launchWebKit } from './browsers.mjs';
import { engineTests } from './engine-tests.mjs';

engineTests({ launch: () => launchWebKit(), relaxed: false });
