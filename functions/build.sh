#!/usr/bin/env bash
# build.sh PLATFORM OUTDIR [go build flags...]
#
# Builds every functions/<name> (a main.go) into OUTDIR/<name>/bootstrap for PLATFORM: "host"
# (what the local stack runs) or GOOS/GOARCH (linux/arm64 for AWS). A cold Go cache compiles
# a few hundred packages (the AWS SDK, the standard library for a cross build) before the first
# function links, which takes minutes on two cores: so it says what it does, step by step,
# with a line every tenth of the packages compiled and a line per function.
set -euo pipefail
cd "$(dirname "$0")/.."

platform=${1:?usage: build.sh host|GOOS/GOARCH OUTDIR [go build flags...]}
out=${2:?usage: build.sh host|GOOS/GOARCH OUTDIR [go build flags...]}
shift 2
if [[ $platform == host ]]; then
  platform="$(go env GOHOSTOS)/$(go env GOHOSTARCH)"
fi
export CGO_ENABLED=0 GOOS=${platform%/*} GOARCH=${platform#*/}

fns=()
for main in functions/*/main.go; do
  dir=${main%/main.go}
  fns+=("${dir#functions/}")
done
pkgs=("${fns[@]/#/./functions/}")
start=$SECONDS

# Step 1: every package the functions import, compiled in one go build (in parallel); go build
# -v names each package it compiles rather than finds in the cache.
mapfile -t deps < <(go list "$@" -deps -f '{{if ne .Name "main"}}{{.ImportPath}}{{end}}' "${pkgs[@]}")
echo "==> functions for $platform, step 1/2: compile the ${#deps[@]} packages they import (a cold Go cache: minutes on two cores; then seconds)"
every=$((${#deps[@]} / 10 + 1))
go build "$@" -v "${deps[@]}" 2>&1 | {
  n=0
  while IFS= read -r line; do
    if [[ $line == *" "* || $line == "#"* ]]; then
      echo "$line" # not an import path: an error or a warning, shown as it is
      continue
    fi
    n=$((n + 1))
    if ((n % every == 0)); then
      echo "    $n of ${#deps[@]} packages compiled ($((SECONDS - start))s)"
    fi
  done
  echo "    $n compiled, $((${#deps[@]} - n)) found in the Go cache ($((SECONDS - start))s)"
}

# Step 2: each function, linked into its bootstrap.
echo "==> functions for $platform, step 2/2: link ${#fns[@]} functions into $out/<name>/bootstrap"
i=0
for fn in "${fns[@]}"; do
  i=$((i + 1))
  t=$SECONDS
  go build "$@" -o "$out/$fn/bootstrap" "./functions/$fn"
  echo "    [$i/${#fns[@]}] $fn ($((SECONDS - t))s)"
done
echo "==> functions for $platform: ${#fns[@]} built in $((SECONDS - start))s"
