#!/usr/bin/env bash
# Installs Debian's Firefox ESR (/usr/bin/firefox-esr, or $FIREFOX_PATH) with apt-get where it is
# missing: tests/engines/firefox.test.mjs (scripts/test-browser.sh) drives it through WebDriver BiDi with
# puppeteer-core (an npm devDependency; no browser download).
set -euo pipefail
if [ ! -x "${FIREFOX_PATH:-/usr/bin/firefox-esr}" ]; then
  bash "$(dirname "$0")/apt-install.sh" setup-firefox firefox-esr
fi
