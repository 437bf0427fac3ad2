#!/usr/bin/env bash
# Installs Debian's headless-capable Chromium for the browser tests and `--png` exports.
# Idempotent and quiet when Chromium is already there; needs root (or sudo without a password) and
# apt, skips otherwise; DDP_NO_APT=1 (setup's --no-system) skips it too.
#   usage: bash scripts/install_chromium.sh
set -euo pipefail

for exe in chromium chromium-browser google-chrome; do
    command -v "$exe" >/dev/null 2>&1 && exit 0
done

say() { printf '[install_chromium] %s\n' "$*" >&2; }
if [ "${DDP_NO_APT:-0}" = 1 ]; then
    say "DDP_NO_APT=1: not installing Chromium with apt; the browser tests will be skipped"
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    say "no apt-get on this machine: install Chromium by hand; browser tests will be skipped"
    exit 1
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
    # -n: never wait for a password (CI has no stdin)
    sudo -n true 2>/dev/null || { say "not root and no password-less sudo: cannot install chromium"; exit 1; }
    SUDO="sudo -n"
fi
say "installing Debian's chromium package"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
$SUDO apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
command -v chromium >/dev/null 2>&1 && say "installed $(chromium --version 2>/dev/null | head -1)"
