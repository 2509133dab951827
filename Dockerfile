# syntax=docker/dockerfile:1
#
# One image, two commands: `vidrec serve` (the default CMD: the HTTP API on
# port 8000, scoring with onnxruntime-gpu, which uses CUDA when the container
# gets a GPU and falls back to CPU otherwise) and `vidrec train` (the online
# trainer). One image keeps the two sides on the same code and the same
# feature schema, which serving checks against every model it loads.
#
#   docker build -t vidrec .
#   docker build -t vidrec --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126 .
#
# The trainer's dense network is small and its sparse tables live in Redis, so
# the CPU build of torch is the default (about 1 GB smaller than a CUDA one);
# pass a CUDA wheel index as TORCH_INDEX_URL to train on the GPU.
# See docs/deploy.md.

ARG CUDA_IMAGE=nvidia/cuda:12.6.3-cudnn-runtime-ubuntu24.04

# --- base: CUDA + cuDNN runtime (what onnxruntime-gpu links against), Python --
FROM ${CUDA_IMAGE} AS base
ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 ca-certificates \
    && rm -rf /var/lib/apt/lists/*

# --- build: a virtual environment with torch and vidrec, copied whole below --
FROM base AS build
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# ONNX Runtime's build (an extra of pyproject.toml): gpu (CUDA, falls back to the CPU) or cpu.
ARG ONNXRUNTIME=gpu
# Other extras of pyproject.toml, e.g. --build-arg EXTRAS=tracing (OpenTelemetry export).
ARG EXTRAS=
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3-venv python3-dev build-essential \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
RUN pip install --no-cache-dir --upgrade pip \
    && pip install --no-cache-dir --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"
WORKDIR /src
# Dependencies first, from pyproject alone, so code edits reuse this layer.
COPY pyproject.toml README.md ./
RUN mkdir -p app trainer feature_store \
    && touch app/__init__.py trainer/__init__.py feature_store/__init__.py \
    && pip install --no-cache-dir ".[${ONNXRUNTIME}${EXTRAS:+,${EXTRAS}}]" \
    && pip uninstall -y vidrec
COPY app ./app
COPY trainer ./trainer
COPY feature_store ./feature_store
RUN pip install --no-cache-dir --no-deps . \
    && python -c "import app.cli, feature_store.settings"

# --- runtime: the venv, a non-root user, the data directory -----------------
FROM base AS runtime
LABEL org.opencontainers.image.title="vidrec" \
      org.opencontainers.image.description="Real-time video recommendations: API and online trainer" \
      org.opencontainers.image.licenses="Apache-2.0"
ARG UID=10001
RUN groupadd --system --gid ${UID} vidrec \
    && useradd --system --uid ${UID} --gid vidrec --home-dir /home/vidrec --create-home vidrec \
    && mkdir -p /data/registry \
    && chown -R vidrec:vidrec /data
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    VIDREC_DATA_DIR=/data
# /data holds the trainer's checkpoints; /data/registry the
# exported models, shared by the trainer and the API (a volume in compose,
# a ReadWriteMany PersistentVolumeClaim in Kubernetes). Both exist in the
# image owned by vidrec, so a fresh named volume mounted there inherits it.
WORKDIR /home/vidrec
USER vidrec:vidrec
EXPOSE 8000
# For the API (the default command). The trainer has no port: compose and
# Kubernetes replace this with a check of its heartbeat key in Redis.
HEALTHCHECK --interval=15s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2).status != 200)"]
ENTRYPOINT ["vidrec"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
