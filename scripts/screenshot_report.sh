#!/usr/bin/env bash
# Render a report.html to a PNG in headless Chromium (Debian: apt-get install chromium), to see the page as a reader
# does. Usage: scripts/screenshot_report.sh REPORT.html OUT.png [WIDTHxHEIGHT]   (default 1200x3000)
set -euo pipefail

if [[ $# -lt 2 ]]; then
  echo "usage: $0 REPORT.html OUT.png [WIDTHxHEIGHT]" >&2
  exit 2
fi
report=$1
out=$2
size=${3:-1200x3000}
if [[ ! -f $report ]]; then
  echo "$report: no such file; give the report.html a vocgraft demo, run or sweep wrote" >&2
  exit 2
fi
if [[ ! $size =~ ^[0-9]+x[0-9]+$ ]]; then
  echo "size $size: expected WIDTHxHEIGHT, e.g. 1200x3000" >&2
  exit 2
fi
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [[ -z $browser ]]; then
  echo "no Chromium found; install it: apt-get install -y chromium" >&2
  exit 2
fi

profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
mkdir -p "$(dirname "$out")"
# a fresh profile and no background traffic: the page is self-contained, so nothing needs the network
"$browser" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
  --disable-component-update --disable-sync --hide-scrollbars --user-data-dir="$profile" \
  --window-size="${size/x/,}" --screenshot="$(realpath -m "$out")" "file://$(realpath "$report")" >/dev/null 2>&1
if [[ ! -s $out ]]; then
  echo "Chromium wrote no screenshot to $out" >&2
  exit 1
fi
echo "$out"
