#!/usr/bin/env bash
# make deploy-check: the compose stack end to end on this machine, as root.
#
# Installs Debian's docker.io, docker-compose and debootstrap if missing, starts dockerd if
# none runs, builds the local base image (deploy/build-base-image.sh) if the engine lacks
# it, builds the images on it, brings the stack up and waits for health, pushes a snapshot
# with the client from the host and fetches it back bit-identical, scales to the gradvault
# service plus two replicas behind nginx and checks that each of the three lists and
# serves it. Then the cluster profile: SeaweedFS as its parts (3 masters, 3 volume servers,
# a filer, the S3 gateway), the service and two replicas behind nginx, the same push and
# replica checks, and the chaos phase (deploy/chaos.py: a volume server, a replica and the
# leading master killed and restarted while a client pushes and restores). Brings
# everything down with its volumes and stops what it started.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PY:-.venv/bin/python}"
export BASE_IMAGE="${BASE_IMAGE:-gradvault-base:bookworm}"
project="gradvault-check"
compose=(docker-compose -p "$project" --profile scaled)
cluster=(docker-compose -p "$project" --profile cluster)
started_dockerd=""
made_env_files=()
say() { printf '== %s: %s\n' "$(date +%T)" "$*"; }

cleanup() {
    set +e
    if command -v docker-compose >/dev/null && docker info >/dev/null 2>&1; then
        say "bringing the stack down with its volume"
        docker-compose -p "$project" --profile scaled --profile cluster down -v --remove-orphans \
            >/dev/null 2>&1
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
read -r PUBLISH_PORT LB_PUBLISH_PORT CLUSTER_PUBLISH_PORT < <("$PY" -c '
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))')
export PUBLISH_PORT LB_PUBLISH_PORT CLUSTER_PUBLISH_PORT

# one build per image: the cluster's services name the same three images
say "building the images on $BASE_IMAGE"
"${compose[@]}" build -q

wait_healthy() {  # wait_healthy SERVICE...: every container of each SERVICE reports healthy
    local ids service
    for service in "$@"; do
        for _ in $(seq 120); do
            ids=$(docker-compose -p "$project" --profile scaled --profile cluster ps -q "$service")
            if [[ -n "$ids" ]] && ! docker inspect -f '{{.State.Health.Status}}' $ids | grep -qv '^healthy$'; then
                continue 2
            fi
            sleep 1
        done
        echo "$service did not become healthy" >&2
        docker-compose -p "$project" --profile scaled --profile cluster logs --tail 30 "$service" >&2
        return 1
    done
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

say "the single-server stack down; the cluster profile up"
"${compose[@]}" down -v --remove-orphans
"${cluster[@]}" up -d --scale cluster-replica=2 cluster-nginx
wait_healthy master-1 master-2 master-3 volume-1 volume-2 volume-3 filer s3 \
    cluster-gradvault cluster-replica cluster-nginx
say "SeaweedFS's parts, the service and 2 replicas behind nginx are healthy"
url="http://127.0.0.1:$CLUSTER_PUBLISH_PORT"
snapshot=$("$PY" deploy/check_stack.py push "$url" "$token")
say "pushed $snapshot through nginx, fetched back bit-identical"
"$PY" deploy/check_stack.py replicas "$url" "$token" "$snapshot" 3

say "chaos: a volume server, a replica and the leading master killed and restarted under traffic"
"$PY" deploy/chaos.py "$url" "$token" "$project"
say "deploy check passed"
