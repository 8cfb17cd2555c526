#!/usr/bin/env bash
# Idempotent set-up on Debian: system packages, a venv in .venv, the project and its test extras.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(libxerial-sqlite-jdbc-java libpostgresql-jdbc-java postgresql chromium chromium-driver python3-venv)
command -v java >/dev/null 2>&1 || APT_PACKAGES+=(openjdk-17-jre-headless)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "==> apt-get install ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
if [ ! -x .venv/bin/uv ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check "uv>=0.4,<1"
fi
echo "==> installing the project into .venv"
.venv/bin/uv pip install -q --python .venv/bin/python -e ".[test]"
# With PYTHONDONTWRITEBYTECODE set (it is, on CI and here) Python never caches .pyc files, and every
# run process (lakehouse run, dagster dev, the daemon) would compile Dagster from source again:
# about 6 s of CPU each. Compile once here; a no-op when the .pyc files are current.
echo "==> compiling bytecode"
.venv/bin/python -m compileall -q -j 0 "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
  lakehouse lakehouse_assets resources sensors schedules >/dev/null || echo "   (a few files did not compile; Python compiles them on import)"
