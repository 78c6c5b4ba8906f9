#!/usr/bin/env bash
# The services the store tests start servers of (tests/services.py): Debian's postgresql and
# redis-server packages, installed when missing. The tests start and stop their own servers on
# loopback ports in temporary folders; nothing is left running. Where packages cannot be
# installed (no root, no apt), the tests that need them skip with that reason.
set -euo pipefail
need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
if ! command -v initdb >/dev/null 2>&1 && ! compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
    need+=(postgresql)
fi
if [ ${#need[@]} -eq 0 ]; then
    echo "test services: postgresql and redis-server present"
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "test services: cannot install ${need[*]} (needs root and apt-get); their tests skip"
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
# (Debian starts the packaged services: the tests run their own, so stop these)
for svc in redis-server postgresql; do
    (command -v service >/dev/null 2>&1 && service "$svc" stop >/dev/null 2>&1) || true
done
echo "test services: installed ${need[*]}"
