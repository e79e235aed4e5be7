#!/usr/bin/env bash
# Containers for issue 22: Podman from Debian's packages and adf's compute
# image, built on this machine from Debian packages by `adf compute image
# build` (mmdebstrap; no registry is pulled from). The image lives in the
# engine's own storage, outside the clone, so a reused machine skips the
# build. Prints "1" when a container runs here (the tests then require
# containers), "0" with the reason on stderr when this machine cannot.
set -uo pipefail
ADF=${1:?usage: containers.sh ADF_BINARY}
if ! command -v podman >/dev/null 2>&1 || ! command -v mmdebstrap >/dev/null 2>&1 || ! command -v iptables >/dev/null 2>&1 || ! command -v runc >/dev/null 2>&1; then
  apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    podman runc crun slirp4netns uidmap fuse-overlayfs mmdebstrap iptables ca-certificates >&2
fi
ADF_HOME=$(mktemp -d) "$ADF" compute --json >&2 || true
image=$(ADF_HOME=$(mktemp -d) "$ADF" compute --json 2>/dev/null | python3 -c 'import json,sys; e=json.load(sys.stdin)["engine"]; print(e.get("image") or "")')
built=$(ADF_HOME=$(mktemp -d) "$ADF" compute --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["engine"].get("image_built", False))')
if [ -z "$image" ]; then
  echo "(no container engine runs here: the container tests say so and skip)" >&2
  echo 0
  exit 0
fi
if [ "$built" != "True" ]; then
  ADF_HOME=$(mktemp -d) "$ADF" compute image build >&2 || { echo "(the image could not be built: the container tests skip)" >&2; echo 0; exit 0; }
fi
runtime=$(ADF_HOME=$(mktemp -d) "$ADF" compute --json 2>/dev/null | python3 -c 'import json,sys; print(" ".join(json.load(sys.stdin)["engine"].get("runtime_args") or []))')
# shellcheck disable=SC2086
if podman $runtime run --rm --ulimit nofile=4096:4096 --ulimit nproc=4096:4096 "$image" true >&2; then
  echo 1
else
  echo "(a container does not run on this machine: the container tests say so and skip)" >&2
  echo 0
fi
