#!/usr/bin/env bash
# Headless Chromium for the browser tier (tests marked `browser`, `make test-browser`): Debian's
# `chromium` package, installed when missing. Idempotent: once the binary is on PATH a second run exits
# at once. Installing needs root (as CI runs); nothing is downloaded outside the distribution's archive.
set -euo pipefail

if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "setup_browser: chromium is missing and installing it needs root: sudo apt-get install -y chromium" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "setup_browser: chromium is missing and this is not a Debian-like system (no apt-get); install it and re-run" >&2
    exit 1
fi
echo "setup_browser: installing Debian's chromium (apt-get update, then install) ..."
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium >/dev/null
command -v chromium >/dev/null
echo "setup_browser: $(chromium --version 2>/dev/null | head -1)"
