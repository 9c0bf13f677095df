#!/usr/bin/env bash
# Installs MegaC's build and test dependencies from Debian 12 packages (run as root).
# Does nothing when everything is already installed.
set -euo pipefail
PKGS=(cmake gcc g++ make pkg-config
      libhdf5-dev hdf5-tools libcjson-dev libopenblas-dev libopenmpi-dev openmpi-bin
      libssl-dev zlib1g-dev
      python3 python3-h5py python3-numpy python3-jsonschema
      clang
      fortunes fortunes-min)
missing=()
for p in "${PKGS[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: missing packages and not root; run as root or install: ${missing[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
