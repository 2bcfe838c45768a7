#!/usr/bin/env bash
# Installs WebKitGTK's WebDriver (/usr/bin/WebKitWebDriver, with the MiniBrowser it drives) and
# Xvfb (the virtual X display WebKitGTK draws on) with apt-get where they are missing:
# tests/engines/webkit.test.mjs (scripts/test-browser.sh) runs the browser cases in WebKit,
# Safari's engine.
set -euo pipefail
missing=()
[ -x "${WEBKIT_DRIVER_PATH:-/usr/bin/WebKitWebDriver}" ] || missing+=(webkit2gtk-driver)
command -v Xvfb >/dev/null 2>&1 || missing+=(xvfb)
if [ ${#missing[@]} -gt 0 ]; then
  bash "$(dirname "$0")/apt-install.sh" setup-webkit "${missing[@]}"
fi
