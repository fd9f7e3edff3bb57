#!/usr/bin/env bash
# Debian packages for headless MuJoCo rendering (EGL on Mesa's llvmpipe, OSMesa fallback),
# ffmpeg libs, and headless Chromium (+ a font) for the report's browser test;
# installs only what is missing, so a second run is instant.
set -euo pipefail
pkgs=(libegl1 libegl-mesa0 libgl1-mesa-dri libopengl0 libosmesa6 libglib2.0-0 chromium fonts-dejavu-core)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
