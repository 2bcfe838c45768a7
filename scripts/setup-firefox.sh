#!/usr/bin/env bash
# Installs Debian's Firefox ESR (/usr/bin/firefox-esr, or $FIREFOX_PATH) with apt-get where it is
# missing: tests/engines/firefox.test.mjs (scripts/test-browser.sh) drives it through WebDriver BiDi with
# puppeteer-core (an npm devDependency; no browser download).
set -euo pipefail
if [ ! -x "${FIREFOX_PATH:-/usr/bin/firefox-esr}" ]; then
  echo "setup-firefox: installing firefox-esr with apt-get" >&2
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get -o DPkg::Lock::Timeout=300 update -q  # waits up to 5 minutes for another apt's lock
  DEBIAN_FRONTEND=noninteractive $sudo apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends firefox-esr
fi
