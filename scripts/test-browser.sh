#!/usr/bin/env bash
# Browser and packaging tests, with Playwright in the system Chromium (/usr/bin/chromium), then
# the correctness, error, worker and loading cases in two more engines (tests/engines): Firefox
# ESR (/usr/bin/firefox-esr, through puppeteer-core) and WebKit (WebKitGTK's MiniBrowser, through
# its WebDriver, on Xvfb). In Chromium:
#   - the demo page (web/) driven through its controls, its numbers checked against Node;
#   - the ONNX conformance and float64 reference cases run inside Chromium;
#   - npm pack, then examples/node, examples/typescript (tsc), examples/vite (vite build),
#     examples/webpack and examples/plain-html
#     installed from the tarball in temporary directories.
# Expects dist/ to be built (npm run build). Extra arguments go to `playwright test`.
# Screenshots: test-results/screenshots/. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup-chromium.sh
bash scripts/setup-firefox.sh
bash scripts/setup-webkit.sh
if [ ! -f dist/index.js ] || [ ! -f dist/wasm/sdpa.wasm ]; then
  echo "test-browser: dist/ is not built; run npm run build first" >&2
  exit 1
fi

status=0
# Playwright's Node runs with relaxed SIMD on, as Chromium does: the tests compare the page's
# results with the same build's in Node, bit for bit.
flag=$(bash scripts/node-relaxed-simd.sh)
node $flag node_modules/@playwright/test/cli.js test "$@" || status=$?

# One plain closing line with the counts.
results=test-results/playwright/results.json
if [ -f "$results" ]; then
  node -e '
    const { stats } = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    const failed = stats.unexpected + stats.flaky;
    console.log(`browser: ${stats.expected} passed, ${failed} failed` + (stats.skipped ? `, ${stats.skipped} skipped` : ""));
  ' "$results"
fi

# The same kinds of cases in Gecko/SpiderMonkey and WebKit/JavaScriptCore, with Node's test
# runner; its reporter ends each with the counts (ℹ tests, ℹ pass, ℹ fail).
for engine in firefox webkit; do
  echo "engines: $engine"
  node $flag --test-reporter=spec "tests/engines/$engine.test.mjs" || status=$?
done
exit $status
