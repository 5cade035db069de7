#!/usr/bin/env bash
# promtool and the prometheus server (Debian's `prometheus` package) for the rule unit tests and the alerting test.
# Installed with apt-get where this runs as root on a Debian/Ubuntu machine (CI, containers); anywhere else it says
# how to install them and exits 0: those tests then skip, naming the same command (tests/prometheus_server.py).
set -euo pipefail
if command -v promtool >/dev/null && command -v prometheus >/dev/null; then
  echo "prometheus ready: $(command -v prometheus), $(command -v promtool)"
  exit 0
fi
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  echo "prometheus ready: $(command -v prometheus), $(command -v promtool)"
  exit 0
fi
echo "note: promtool / prometheus not found and this is not a root apt-get machine; the tests that need them will" \
  "skip. To run them: sudo apt-get install prometheus (Debian/Ubuntu), or put the prometheus and promtool binaries" \
  "of a Prometheus release on PATH"
