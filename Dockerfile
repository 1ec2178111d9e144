# syntax=docker/dockerfile:1
# The specobs demo engine: a real EAGLE-3-style speculative decoding engine on the CPU, its
# OpenAI-style completions server (:8000), a built-in load generator and the specobs exporter
# (Prometheus /metrics on :9477; OTLP when SPECOBS_EXPORTERS lists otlp).
#
#   docker build -t specobs-demo:local .
#   docker run --rm -p 8000:8000 -p 9477:9477 specobs-demo:local
#
# The completions port is published, so /admin/fault is off in this image: no admin token is set
# here and every /admin path answers 404. To switch faults at run time, give a token of at least
# 16 characters when starting a container (callers then send "Authorization: Bearer <token>"):
#
#   docker run --rm -p 8000:8000 -e SPECOBS_DEMO_ADMIN_TOKEN="$(openssl rand -hex 16)" ...
#
# docker-compose.yml builds it once and runs three replicas of it.
FROM python:3.11.14-slim-bookworm

# torch comes from PyTorch's CPU index first, pinned: a plain `pip install torch` would pull the
# multi-GB CUDA build. `pip install .` then finds torch>=2.3 satisfied and installs nothing more.
ARG TORCH_VERSION=2.13.0
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN pip install --index-url https://download.pytorch.org/whl/cpu "torch==${TORCH_VERSION}"

WORKDIR /opt/specobs
# README.md* : the package metadata reads it when it is there, the build does not need it.
# setup.py builds the optional C extension (specobs/_speedups.c): gcc is there only for the
# build, and removed in the same layer.
COPY pyproject.toml setup.py README.md* ./
COPY specobs ./specobs
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && pip install ".[demo,otlp]" \
    && python -c "import specobs._bucketing as b; assert b.COMPILED, 'speedups not built'" \
    && apt-get purge -y --auto-remove gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*

RUN useradd --create-home --uid 10001 --user-group specobs
USER specobs
WORKDIR /home/specobs

# The exporter must listen beyond loopback to be scraped from another container.
ENV SPECOBS_PROMETHEUS_ADDR=0.0.0.0 \
    SPECOBS_PROMETHEUS_PORT=9477 \
    SPECOBS_EXPORTERS=prometheus
EXPOSE 8000 9477

# The slim image has no curl; the standard library is enough. The engine warms up its model first.
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4)"]

CMD ["specobs", "demo", "--host", "0.0.0.0", "--port", "8000", "--device", "cpu"]
