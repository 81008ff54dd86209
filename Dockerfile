# syntax=docker/dockerfile:1
# One image for both binaries. It has no ENTRYPOINT: the Helm chart runs `gpu-agent run` on GPU
# nodes and `gpu-scorer serve` for the extender. Without a command it serves the extender:
#   docker run --rm -p 8888:8888 IMAGE                      # gpu-scorer serve
#   docker run --rm IMAGE gpu-agent once --source simulated --dry-run
#
# Python 3.11 matches docker/constraints.txt (generated from the 3.11 environment the tests ran in).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- build: the project's wheel, then every dependency from pinned versions -----------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY docker/constraints.txt docker/build-constraints.txt /src/docker/
COPY pyproject.toml README.md /src/
COPY agent /src/agent
COPY exporter_scheduler /src/exporter_scheduler
COPY gpu_contract /src/gpu_contract
# The build backend is pinned too (PIP_CONSTRAINT reaches pip's isolated build environment).
# The environment is made without pip and filled by the base's pip (`--python`), so neither pip
# nor setuptools is in what the final stage copies. `--no-compile`: the image runs with
# PYTHONOPTIMIZE=2, which reads only the -OO bytecode compiled below (plain .pyc files would add
# about 50 MB that nothing loads).
RUN PIP_CONSTRAINT=/src/docker/build-constraints.txt \
        pip wheel --no-cache-dir --no-deps --wheel-dir /wheels /src \
    && python -m venv --without-pip /opt/gpu-live-scheduler \
    && pip --python /opt/gpu-live-scheduler/bin/python install --no-cache-dir --no-compile \
        --only-binary=:all: \
        --constraint /src/docker/constraints.txt \
        /wheels/*.whl \
    && /opt/gpu-live-scheduler/bin/python -OO -m compileall -q /opt/gpu-live-scheduler/lib \
    && PYTHONOPTIMIZE=2 /opt/gpu-live-scheduler/bin/gpu-agent --help >/dev/null \
    && PYTHONOPTIMIZE=2 /opt/gpu-live-scheduler/bin/gpu-scorer --help >/dev/null

# ---- runtime: the interpreter and the virtual environment; no pip cache, no compilers -------
FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="gpu-live-scheduler" \
      org.opencontainers.image.description="Node agent (gpu-agent) and kube-scheduler extender (gpu-scorer) that schedule GPU pods on live NVML state" \
      org.opencontainers.image.source="https://github.com/example/gpu-live-scheduler" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
COPY --from=build /opt/gpu-live-scheduler /opt/gpu-live-scheduler
# HOME on a writable emptyDir (/tmp), so a read-only root filesystem works.
# PYTHONOPTIMIZE=2 loads the -OO bytecode compiled above: the kubernetes client's generated
# docstrings alone are ~14 MB of the agent's resident memory (docs/agent.md, "Footprint").
ENV PATH=/opt/gpu-live-scheduler/bin:$PATH \
    PYTHONOPTIMIZE=2 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
# The distroless "nonroot" uid/gid; the chart's securityContext uses the same numbers.
USER 65532:65532
EXPOSE 8888 9400
CMD ["gpu-scorer", "serve"]
