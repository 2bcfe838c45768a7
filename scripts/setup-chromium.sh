#!/usr/bin/env bash
# Installs Debian's Chromium (/usr/bin/chromium, or $CHROMIUM_PATH) with apt-get where it is
# missing: the browser tests (scripts/test-browser.sh) and the benchmark's Chromium section
# (bench/browser.mjs) drive it through Playwright.
set -euo pipefail
if [ ! -x "${CHROMIUM_PATH:-/usr/bin/chromium}" ]; then
  echo "setup-chromium: installing chromium with apt-get" >&2
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get -o DPkg::Lock::Timeout=300 update -q  # waits up to 5 minutes for another apt's lock
  DEBIAN_FRONTEND=noninteractive $sudo apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends chromium
fi
