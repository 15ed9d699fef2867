#!/bin/sh
# create-bucket ENDPOINT BUCKET: create BUCKET on the S3 server at ENDPOINT, signed with
# AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (AWS_REGION, default us-east-1). Succeeds when
# the bucket is created or already there; retries while the server is starting (up to
# CREATE_BUCKET_TIMEOUT seconds, default 60); fails at once when the credentials are refused.
set -eu
endpoint="$1"
bucket="$2"
deadline=$(( $(date +%s) + ${CREATE_BUCKET_TIMEOUT:-60} ))
: "${AWS_ACCESS_KEY_ID:?AWS_ACCESS_KEY_ID is not set}"
: "${AWS_SECRET_ACCESS_KEY:?AWS_SECRET_ACCESS_KEY is not set}"
while :; do
    # the key pair goes to curl on stdin, never on its command line
    code=$(printf 'user = "%s:%s"\n' "$AWS_ACCESS_KEY_ID" "$AWS_SECRET_ACCESS_KEY" \
        | curl -sS -K - -o /tmp/create-bucket.out -w '%{http_code}' -X PUT \
            --aws-sigv4 "aws:amz:${AWS_REGION:-us-east-1}:s3" "$endpoint/$bucket" || true)
    case "$code" in
        200) echo "bucket $bucket created at $endpoint"; exit 0 ;;
        409) echo "bucket $bucket already exists at $endpoint"; exit 0 ;;
        403) echo "the S3 server refused the credentials:" >&2; cat /tmp/create-bucket.out >&2; exit 1 ;;
    esac
    if [ "$(date +%s)" -ge "$deadline" ]; then
        echo "could not create bucket $bucket at $endpoint (last status: $code)" >&2
        cat /tmp/create-bucket.out >&2 2>/dev/null || true
        exit 1
    fi
    sleep 1
done
