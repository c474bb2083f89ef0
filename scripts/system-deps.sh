#!/usr/bin/env bash
# Installs the Debian packages the real-part tests need (headless Chromium with its
# driver, nginx, pgbouncer; `make test` adds wrk) when they are missing and we may: as root, or through sudo.
# Under CI=true a package that cannot be installed fails the run; elsewhere the tests
# that need it skip with a loud message.
# Arguments name more tools, each from the Debian package of the same name
# (`make test-loaded` asks for stress-ng).
set -u
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx)
command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] || need+=(pgbouncer)
for tool in "$@"; do
  command -v "$tool" >/dev/null 2>&1 || need+=("$tool")
done
[ ${#need[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  as_root=(sudo -n)
else
  echo "system-deps: cannot install ${need[*]} (not root, no sudo): their tests will SKIP" >&2
  [ "${CI:-}" = "true" ] && exit 1
  exit 0
fi

echo "system-deps: installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
if ! { "${as_root[@]}" apt-get update -qq && \
       "${as_root[@]}" apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null; }; then
  echo "system-deps: apt-get could not install ${need[*]}: their tests will SKIP" >&2
  [ "${CI:-}" = "true" ] && exit 1
fi
exit 0
