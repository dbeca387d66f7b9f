# syntax=docker/dockerfile:1
#
# One image for every role of a stagetune deployment: the API, the dispatcher ("worker"), the
# Ray head and worker nodes, the migration job and optuna-dashboard. The role is the first
# argument (deploy/stagetune-role is the entrypoint), e.g. `docker run IMAGE api`.
#
#   docker build -t stagetune .                                  # torch CPU wheels (default)
#   docker build -t stagetune:gpu --build-arg TORCH_INDEX=cu128 .  # torch CUDA wheels
#
# TORCH_INDEX names a wheel index of download.pytorch.org/whl/: cpu, or a CUDA variant that
# torch ${TORCH_VERSION} is published for and the hosts' NVIDIA driver supports. The CUDA
# wheels bring their own CUDA runtime, so the same slim base serves both; the GPU itself comes
# from the NVIDIA container toolkit on the host (see docs/production.md).

ARG PYTHON_VERSION=3.11

# --- build: a virtual environment with torch, stagetune's dependencies and the extras ---
FROM python:${PYTHON_VERSION}-slim AS build

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=cpu
ARG RAY_VERSION=2.60.0

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

RUN python -m venv /opt/stagetune
ENV PATH=/opt/stagetune/bin:$PATH

# torch first, from the chosen index, so that no dependency pulls another build of it.
RUN pip install --upgrade pip "setuptools>=77" wheel \
 && pip install "torch==${TORCH_VERSION}" --index-url "https://download.pytorch.org/whl/${TORCH_INDEX}"

# The dependencies (a layer that survives source changes): install the project once from its
# metadata alone, then remove it again so that the runtime stage installs it from /app.
WORKDIR /src
COPY pyproject.toml README.md ./
RUN mkdir -p tuner workers api \
 && touch tuner/__init__.py workers/__init__.py api/__init__.py \
 && pip install . "ray[default]==${RAY_VERSION}" optuna-dashboard \
 && pip uninstall -y stagetune

# --- runtime ---
FROM python:${PYTHON_VERSION}-slim AS runtime

ENV PATH=/opt/stagetune/bin:$PATH \
    VIRTUAL_ENV=/opt/stagetune \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    STAGETUNE_HOME=/app \
    STAGETUNE_DATA_DIR=/data \
    STAGETUNE_RAY_STORAGE_PATH=/data/ray

# A fixed uid/gid, so that the shared /data volume has one owner in every container.
ARG APP_UID=1000
ARG APP_GID=1000
RUN groupadd --gid "${APP_GID}" stagetune \
 && useradd --uid "${APP_UID}" --gid "${APP_GID}" --create-home --shell /bin/bash stagetune \
 && mkdir -p /data \
 && chown stagetune:stagetune /data

COPY --from=build /opt/stagetune /opt/stagetune

WORKDIR /app
# The code stays root-owned: the service user can read it, not change it.
COPY . /app
# Installed in place (editable, no dependencies: they are all in the venv already): the
# migration scripts under /app/migrations stay next to the package that looks them up.
RUN pip install --no-deps --no-build-isolation -e /app \
 && stagetune --help >/dev/null \
 && chmod 0755 /app/deploy/stagetune-role

USER stagetune
VOLUME ["/data"]
EXPOSE 8000 6379 8265 8080

ENTRYPOINT ["/app/deploy/stagetune-role"]
CMD ["api"]
