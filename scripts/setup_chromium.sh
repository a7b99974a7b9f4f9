#!/usr/bin/env bash
# Headless Chromium for the demo-page test (tests/test_serve_browser.py drives it with Playwright),
# run by `bash scripts/setup.sh --dev`, so the README's test command and CI install the same.
#   - a Chromium already there (CHROMIUM=/path, or chromium / chromium-browser on PATH): nothing to do;
#   - else, where apt-get is usable (as root, or with passwordless sudo): apt-get install chromium;
#   - else: a message saying how to install it; the browser test is then skipped (exit 0), unless
#     NOULENGINE_REQUIRE_CHROMIUM=1 (CI), which makes a missing Chromium an error (exit 1).
# NOULENGINE_NO_APT=1 never runs apt-get.
set -euo pipefail
say() { echo "setup: $*"; }
find_chromium() {
  if [ -n "${CHROMIUM:-}" ] && [ -x "${CHROMIUM}" ]; then echo "$CHROMIUM"; return 0; fi
  command -v chromium 2>/dev/null || command -v chromium-browser 2>/dev/null || return 1
}
if found=$(find_chromium); then
  say "chromium for the browser test: $found"
  exit 0
fi
why="no apt-get on this machine"
if [ "${NOULENGINE_NO_APT:-}" = 1 ]; then
  why="NOULENGINE_NO_APT=1"
elif command -v apt-get >/dev/null 2>&1; then
  as=()
  if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true >/dev/null 2>&1; then as=(sudo -n); else as=(none); fi
  fi
  if [ "${as[*]:-}" = none ]; then
    why="apt-get needs root (run as root, or with passwordless sudo)"
  else
    say "installing chromium (apt-get) for the browser test"
    if ${as[@]+"${as[@]}"} env DEBIAN_FRONTEND=noninteractive apt-get update -qq \
        && ${as[@]+"${as[@]}"} env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null \
        && found=$(find_chromium); then
      say "chromium for the browser test: $found"
      exit 0
    fi
    why="apt-get install chromium failed"
  fi
fi
msg="no Chromium ($why): tests/test_serve_browser.py (the demo page) will be skipped. Install it (Debian/Ubuntu: sudo apt-get install chromium) or point CHROMIUM at a Chromium binary, then rerun the tests."
if [ "${NOULENGINE_REQUIRE_CHROMIUM:-}" = 1 ]; then
  echo "setup: error: $msg" >&2
  exit 1
fi
echo "setup: warning: $msg" >&2
exit 0
