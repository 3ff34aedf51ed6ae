#!/usr/bin/env bash
# Installs the Debian packages millstream's tests need when they are missing:
# a JDK for PySpark, openssl for the mutual-TLS tests (certificates made as the README says),
# iproute2 for the tests' hosts (network namespaces). Rust, Python 3.11 and gcc are expected on the machine.
set -euo pipefail

missing=()
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)

if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
echo "installing Debian packages: ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
"${sudo_cmd[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
