#!/usr/bin/env bash
# make deploy-check: the compose stack end to end on this machine, as root.
#
# Installs Debian's docker.io, docker-compose and debootstrap if missing, starts dockerd if
# none runs, builds the local base image (deploy/build-base-image.sh) if the engine lacks
# it, builds the images on it, brings the stack up and waits for health, pushes a snapshot
# with the client from the host and fetches it back bit-identical, scales to the gradvault
# service plus two replicas behind nginx and checks that each of the three lists and
# serves it, then brings the stack down with its volume and stops what it started.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PY:-.venv/bin/python}"
export BASE_IMAGE="${BASE_IMAGE:-gradvault-base:bookworm}"
project="gradvault-check"
compose=(docker-compose -p "$project" --profile scaled)
started_dockerd=""
made_env_files=()
say() { printf '== %s: %s\n' "$(date +%T)" "$*"; }

cleanup() {
    set +e
    if command -v docker-compose >/dev/null && docker info >/dev/null 2>&1; then
        say "bringing the stack down with its volume"
        "${compose[@]}" down -v --remove-orphans >/dev/null 2>&1
    fi
    for file in "${made_env_files[@]}"; do rm -f "$file"; done
    if [[ -n "$started_dockerd" ]]; then
        say "stopping the dockerd this check started"
        kill "$started_dockerd"
        wait "$started_dockerd" 2>/dev/null
    fi
}
trap cleanup EXIT

missing=()
for tool in docker:docker.io dockerd:docker.io docker-compose:docker-compose debootstrap:debootstrap; do
    command -v "${tool%%:*}" >/dev/null || missing+=("${tool#*:}")
done
if ((${#missing[@]})); then
    say "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
    say "starting dockerd"
    dockerd >/tmp/gradvault-check-dockerd.log 2>&1 &
    started_dockerd=$!
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null || { tail /tmp/gradvault-check-dockerd.log; exit 1; }
fi

if ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    say "building the base image $BASE_IMAGE"
    deploy/build-base-image.sh "$BASE_IMAGE"
fi

for name in s3 gradvault; do
    if [[ ! -f "deploy/$name.env" ]]; then
        made_env_files+=("deploy/$name.env")
        secret() { "$PY" -c "import secrets; print(secrets.token_urlsafe(24))"; }
        if [[ $name == s3 ]]; then
            printf 'AWS_ACCESS_KEY_ID=gradvault\nAWS_SECRET_ACCESS_KEY=%s\n' "$(secret)" >deploy/s3.env
        else
            printf 'GRADVAULT_TOKENS=%s:write\n' "$(secret)" >deploy/gradvault.env
        fi
    fi
done
token=$(sed -n 's/^GRADVAULT_TOKENS=//p' deploy/gradvault.env | tr ',' '\n' | sed -n 's/:write$//p' | head -n 1)
read -r PUBLISH_PORT LB_PUBLISH_PORT < <("$PY" -c '
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))')
export PUBLISH_PORT LB_PUBLISH_PORT

say "building the images on $BASE_IMAGE"
"${compose[@]}" build -q

wait_healthy() {  # wait_healthy SERVICE: every container of SERVICE reports healthy
    local ids
    for _ in $(seq 120); do
        ids=$("${compose[@]}" ps -q "$1")
        if [[ -n "$ids" ]] && ! docker inspect -f '{{.State.Health.Status}}' $ids | grep -qv '^healthy$'; then
            return 0
        fi
        sleep 1
    done
    echo "$1 did not become healthy" >&2
    "${compose[@]}" logs --tail 30 "$1" >&2
    return 1
}

say "starting SeaweedFS, the bucket and the service"
docker-compose -p "$project" up -d
wait_healthy gradvault
url="http://127.0.0.1:$PUBLISH_PORT"
say "pushing a snapshot to $url"
snapshot=$("$PY" deploy/check_stack.py push "$url" "$token")
say "pushed $snapshot, fetched back bit-identical"

say "scaling: the service plus 2 replicas behind nginx"
"${compose[@]}" up -d --scale replica=2
wait_healthy replica
wait_healthy nginx
"$PY" deploy/check_stack.py replicas "http://127.0.0.1:$LB_PUBLISH_PORT" "$token" "$snapshot" 3
say "deploy check passed"
