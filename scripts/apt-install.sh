#!/usr/bin/env bash
# Usage: bash scripts/apt-install.sh WHO PACKAGE...
# Installs Debian packages with apt-get, as root or through sudo, waiting up to 5 minutes for
# another apt (a fresh machine's unattended-upgrades) to let go of its lock. WHO names the
# caller in the one line it prints. The set-up scripts (setup.sh, setup-chromium.sh,
# setup-firefox.sh, setup-webkit.sh) decide what is missing; this is how they install it.
set -euo pipefail
who=$1
shift
echo "$who: installing $* with apt-get" >&2
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
$sudo apt-get -o DPkg::Lock::Timeout=300 update -q
DEBIAN_FRONTEND=noninteractive $sudo apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends "$@"
