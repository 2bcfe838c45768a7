// The browser cases in WebKit (WebCore, JavaScriptCore: Safari's engine): WebKitGTK's
// MiniBrowser, driven by WebKitGTK's WebDriver on a virtual X display (browsers.mjs). What runs:
// engine-tests.mjs. WebKit has no relaxed SIMD, as Safari has none, so feature detection must
// pick the portable build even when relaxedSimd asks for the other. WebKitGTK gives a cross-origin
// isolated page SharedArrayBuffer only with a JavaScriptCore option, which browsers.mjs sets, as
// Safari gives it by default: so the threaded build runs in JavaScriptCore too. WebKit reports
// 4 logical processors on a 2-vCPU machine (its navigator.hardwareConcurrency rounds), so the
// isolated page runs 4 threads. scripts/test-browser.sh runs this file
// (node --experimental-wasm-relaxed-simd tests/engines/webkit.test.mjs).
import { launchWebKit } from './browsers.mjs';
import { engineTests } from './engine-tests.mjs';

engineTests({ launch: () => launchWebKit(), relaxed: false });
