#!/usr/bin/env bash
# Installs Debian's Chromium (/usr/bin/chromium, or $CHROMIUM_PATH) with apt-get where it is
# missing: the browser tests (scripts/test-browser.sh) and the benchmark's Chromium section
# (bench/browser.mjs) drive it through Playwright.
set -euo pipefail
if [ ! -x "${CHROMIUM_PATH:-/usr/bin/chromium}" ]; then
  bash "$(dirname "$0")/apt-install.sh" setup-chromium chromium
fi
