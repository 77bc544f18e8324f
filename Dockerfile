# syntax=docker/dockerfile:1
# The gpustack-operator image: one binary, every component (worker, device-manager, model-manager,
# worker-gateway). Build: docker build -t gpustack/gpustack-operator:0.1.0 .
#
# Stage 1 builds wheels for the project and its runtime dependencies, pinned by
# deploy/requirements.lock (regenerate: `python scripts/lock.py > deploy/requirements.lock`).
# Stage 2 installs only those wheels into a slim Python 3.11 image, with no compiler and no
# network.
#
# The image runs as the unprivileged user 65532. The manifests override it where a component
# needs root: device-manager (kubelet's root-owned device-plugin socket directory; no
# capabilities, not privileged) and model-manager (privileged: mount(2) with Bidirectional
# propagation). See docs/deploy.md, "Privileges".

ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY deploy/requirements.lock deploy/requirements.lock
COPY pyproject.toml README.md ./
COPY gpustack_operator gpustack_operator
COPY agent agent
COPY controlplane controlplane
COPY hub hub
COPY kit kit
COPY bus bus
COPY proto proto
# controlplane/applications/bundled links to the agents' manifests here (one source with kustomize).
COPY deploy/base deploy/base
RUN python -m pip wheel --wheel-dir /wheels --constraint deploy/requirements.lock .

FROM ${PYTHON_IMAGE} AS runtime
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
COPY --from=build /wheels /wheels
COPY deploy/requirements.lock /tmp/requirements.lock
RUN python -m pip install --no-index --find-links /wheels --constraint /tmp/requirements.lock \
        gpustack-operator \
    && rm -rf /wheels /tmp/requirements.lock \
    && groupadd --system --gid 65532 gpustack \
    && useradd --system --uid 65532 --gid 65532 --home-dir /nonexistent --shell /usr/sbin/nologin gpustack
USER 65532:65532
ENTRYPOINT ["gpustack-operator"]
CMD ["--help"]
