#!/usr/bin/env bash
# Usage: bash scripts/apt-install.sh WHO PACKAGE...
# Installs Debian packages with apt-get, as root or through sudo, waiting up to 5 minutes for
# another apt (a fresh machine's apt-daily or unattended-upgrades) to let go of its locks. WHO
# names the caller in the lines it prints. The set-up scripts (setup.sh, setup-chromium.sh,
# setup-firefox.sh, setup-webkit.sh) decide what is missing; this is how they install it.
set -euo pipefail
who=$1
shift
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null 2>&1; then
    echo "$who: $* must be installed, which needs root (or sudo, not found here): as root, run" \
      "apt-get install --no-install-recommends $*, then this again" >&2
    exit 1
  fi
  sudo="sudo"
fi
echo "$who: installing $* with apt-get" >&2

# DPkg::Lock::Timeout covers install's lock (dpkg's) only, not the package lists' lock that
# `update` takes: that one is retried while another apt holds it. Any other failure stops here.
for attempt in $(seq 60); do
  if output=$($sudo env LC_ALL=C apt-get update -q 2>&1); then  # (C: the message looked for below is English)
    break
  fi
  if [ "$attempt" -eq 60 ] || ! grep -q 'Could not get lock' <<<"$output"; then
    echo "$output" >&2
    echo "$who: apt-get update failed" >&2
    exit 1
  fi
  [ "$attempt" -eq 1 ] && echo "$who: waiting for another apt to release its lock (up to 5 minutes)" >&2
  sleep 5
done
# sudo resets the environment: DEBIAN_FRONTEND goes through env.
$sudo env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends "$@"
