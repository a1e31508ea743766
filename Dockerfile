# modelyard's container image. Its install and start steps are scripts/install.sh,
# scripts/serve.sh and scripts/healthcheck.sh, the scripts CI runs on every change
# (scripts/check_image.sh, from .ci/run), so the image cannot drift from what is tested.
# See docs/deployment.md.
#
#   docker build -t modelyard .                                  # no extras
#   docker build -t modelyard --build-arg EXTRAS=torch .         # extras, comma-separated
#   docker run -p 8080:8080 -p 8081:8081 -v "$PWD/models:/models:ro" \
#     -e MODELYARD_SECURITY__MANAGEMENT_TOKEN=... modelyard       # serves /models/modelyard.yaml
ARG PYTHON_VERSION=3.11
FROM python:${PYTHON_VERSION}-slim

# Extras to install (torch, and whatever pyproject.toml lists), comma-separated.
ARG EXTRAS=""
# Debian packages an extra needs to build from source (llm: "build-essential cmake").
ARG APT_PACKAGES=""

RUN if [ -n "$APT_PACKAGES" ]; then \
      apt-get update && apt-get install -y --no-install-recommends $APT_PACKAGES \
      && rm -rf /var/lib/apt/lists/*; \
    fi \
    && useradd --system --create-home --uid 10001 modelyard

WORKDIR /opt/modelyard
COPY pyproject.toml README.md ./
COPY src ./src
COPY scripts ./scripts
# A normal (not editable) install, byte-code compiled now: the image's user cannot write
# into the environment, so nothing could be compiled later.
RUN VENV=/opt/modelyard/venv EXTRAS="$EXTRAS" EDITABLE=0 COMPILE=1 PIP_NO_CACHE_DIR=1 \
    bash scripts/install.sh

USER modelyard
# Every interface: published ports need a bind address other than loopback, which the
# server refuses without a management token (MODELYARD_SECURITY__MANAGEMENT_TOKEN or a
# mounted token file); MODELYARD_GRPC_PORT=off runs without gRPC.
ENV VENV=/opt/modelyard/venv \
    MODELYARD_HOST=0.0.0.0 \
    MODELYARD_HTTP_PORT=8080 \
    MODELYARD_GRPC_PORT=8081 \
    MODELYARD_LOG_FORMAT=json
EXPOSE 8080 8081
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
    CMD ["bash", "scripts/healthcheck.sh"]
ENTRYPOINT ["bash", "scripts/serve.sh"]
CMD ["--config", "/models/modelyard.yaml"]
