#!/bin/sh
# create-bucket ENDPOINT BUCKET: create BUCKET on the S3 server at ENDPOINT, signed with
# AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (AWS_REGION, default us-east-1), then write one
# object (BUCKET/write-probe, outside every store prefix) and delete it: the store takes
# writes, not only bucket creation (on a cluster, a write needs volume servers enough for
# the replication). Succeeds when the bucket is created or already there and the probe was
# written; retries while the server is starting (up to CREATE_BUCKET_TIMEOUT seconds,
# default 60); fails at once when the credentials are refused.
set -eu
endpoint="$1"
bucket="$2"
deadline=$(( $(date +%s) + ${CREATE_BUCKET_TIMEOUT:-60} ))
: "${AWS_ACCESS_KEY_ID:?AWS_ACCESS_KEY_ID is not set}"
: "${AWS_SECRET_ACCESS_KEY:?AWS_SECRET_ACCESS_KEY is not set}"

# signed METHOD URL [curl options...]: prints the HTTP status; the answer's body is in
# /tmp/create-bucket.out. The key pair goes to curl on stdin, never on its command line.
signed() {
    method="$1"
    url="$2"
    shift 2
    printf 'user = "%s:%s"\n' "$AWS_ACCESS_KEY_ID" "$AWS_SECRET_ACCESS_KEY" \
        | curl -sS -K - -o /tmp/create-bucket.out -w '%{http_code}' -X "$method" \
            --aws-sigv4 "aws:amz:${AWS_REGION:-us-east-1}:s3" "$@" "$url" || true
}

# give_up WHAT CODE: fails once the deadline has passed, else returns (to retry)
give_up() {
    if [ "$(date +%s)" -ge "$deadline" ]; then
        echo "could not $1 at $endpoint (last status: $2)" >&2
        cat /tmp/create-bucket.out >&2 2>/dev/null || true
        exit 1
    fi
    sleep 1
}

refused() {
    echo "the S3 server refused the credentials:" >&2
    cat /tmp/create-bucket.out >&2
    exit 1
}

while :; do
    code=$(signed PUT "$endpoint/$bucket")
    case "$code" in
        200) echo "bucket $bucket created at $endpoint"; break ;;
        409) echo "bucket $bucket already exists at $endpoint"; break ;;
        403) refused ;;
    esac
    give_up "create bucket $bucket" "$code"
done

# curl signs a body's hash only when told it (x-amz-content-sha256)
probe="write probe"
probe_sha256=$(printf '%s' "$probe" | sha256sum | cut -d ' ' -f 1)
while :; do
    code=$(signed PUT "$endpoint/$bucket/write-probe" --data-binary "$probe" \
        -H "x-amz-content-sha256: $probe_sha256")
    case "$code" in
        200) break ;;
        403) refused ;;
    esac
    give_up "write $bucket/write-probe" "$code"
done
code=$(signed DELETE "$endpoint/$bucket/write-probe")
case "$code" in
    200 | 204) echo "the store takes writes: $bucket/write-probe written and deleted" ;;
    *) echo "could not delete $bucket/write-probe at $endpoint (status $code)" >&2; exit 1 ;;
esac
