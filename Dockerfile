# The gradvault service: `docker build -t gradvault .`
#
# BASE_IMAGE is any Debian-based image with Python 3.11+ and its venv module; on a machine
# without a container registry, build one with deploy/build-base-image.sh and pass
# --build-arg BASE_IMAGE=gradvault-base:bookworm (docs/DEPLOY.md).
#
# Configuration is by environment (GRADVAULT_* and AWS_*, docs/SERVICE.md). With no
# GRADVAULT_TOKENS the service refuses to listen on 0.0.0.0 unless GRADVAULT_ALLOW_OPEN=true.
# The entry point is `gradvault serve`; arguments to `docker run` are its flags (one per
# setting: `gradvault serve --help`).
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

# tini is PID 1: it hands SIGTERM to the server at once and reaps children, so
# `docker stop` ends the service in well under a second; the server then ends by that
# signal (128 + 15), which tini reports as success (-e 143).
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 10001 --no-log-init --create-home --home-dir /var/lib/gradvault --shell /usr/sbin/nologin gradvault

ENV PATH=/opt/gradvault/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# only the runtime extra the service needs (the S3 client, obstore, is a core dependency)
COPY pyproject.toml setup.py README.md /tmp/gradvault-src/
COPY core /tmp/gradvault-src/core
COPY client /tmp/gradvault-src/client
COPY service /tmp/gradvault-src/service
COPY integrations /tmp/gradvault-src/integrations
# the package's root: its part folders are links to the four folders above
COPY src /tmp/gradvault-src/src
RUN python3 -m venv /opt/gradvault \
    && pip install --no-cache-dir "/tmp/gradvault-src[service]" \
    && rm -rf /tmp/gradvault-src

USER gradvault
WORKDIR /var/lib/gradvault
ENV GRADVAULT_HOST=0.0.0.0 \
    GRADVAULT_PORT=8000 \
    GRADVAULT_STORE=/var/lib/gradvault/store
EXPOSE 8000

HEALTHCHECK --interval=5s --timeout=4s --start-period=30s --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('GRADVAULT_PORT', '8000'), timeout=4)"]

ENTRYPOINT ["tini", "-e", "143", "--", "gradvault", "serve"]
