# KernelFleet service image. The API, Celery workers, beat and the schema migration all run from
# this one image; the command picks the role (see docker-compose.yml and docs/deployment.md).
FROM python:3.11-slim-bookworm

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    KERNELFLEET_DATA_DIR=/data

# g++ is needed at run time, not only to build: TVM compiles candidates with its bundled LLVM, but
# MetaSchedule's builder links each one into a shared library with the system compiler
# (tvm.support.cc looks for g++, gcc, clang++, ... on PATH) before the runner loads and times it.
# g++ also brings libgomp.
# Unpinned on purpose: Debian stable's g++ only gets fixes within the release.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ \
    && rm -rf /var/lib/apt/lists/*

# The dependencies get a layer of their own, listed from both pyproject.toml files, so that layer
# (TVM, XGBoost, ...) is rebuilt only when a dependency list changes, not on every source edit.
COPY pyproject.toml /tmp/kernelfleet-src/pyproject.toml
COPY clients/python/pyproject.toml /tmp/kernelfleet-src/clients/python/pyproject.toml
RUN python -c "import tomllib; \
svc = tomllib.load(open('/tmp/kernelfleet-src/pyproject.toml', 'rb'))['project']; \
sdk = tomllib.load(open('/tmp/kernelfleet-src/clients/python/pyproject.toml', 'rb'))['project']; \
print('\n'.join(svc['dependencies'] + sdk['dependencies'] + sdk['optional-dependencies']['cli']))" \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

# Both packages: kernelfleet-service (the `service` package) and the kernelfleet SDK, whose CLI
# (`kernelfleet api|worker|beat|migrate`) starts every role and which the service imports too.
# They are installed from a scratch copy that is then removed, so no source tree is left in the
# working directory to shadow the installed packages (`python -m` puts it first on sys.path).
# KERNELFLEET_EXTRAS=gpu (compose's worker-gpu) adds the CUDA 13.0 compile toolchain from PyPI (nvcc and its
# parts, pinned to torch's CUDA) and torch (the cuBLAS/cuDNN baselines). nvcc goes on PATH as a wrapper that
# execs the wheel's binary: nvcc finds its headers relative to its own path, so a symlink cannot compile
# ("cuda_runtime.h: No such file or directory"). The worker itself compiles through service.tuning.cuda_toolchain
# (nvcc via TVM's callback) and loads the wheel's libcudart before TVM.
ARG KERNELFLEET_EXTRAS=""
# PyTorch's CPU build in the default image: CPU workers time it next to numpy and route a shape to it where it
# is the fastest vendor library (kernelfleet.vendor), and hosts calling the SDK in this image run those routes.
# The `gpu` extra brings PyTorch's CUDA build instead. A worker without PyTorch times numpy only.
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
RUN if [ -z "$KERNELFLEET_EXTRAS" ]; then pip install --index-url "$TORCH_CPU_INDEX" "torch==2.13.0"; fi
COPY . /tmp/kernelfleet-src
RUN pip install "/tmp/kernelfleet-src/clients/python[cli]" "/tmp/kernelfleet-src${KERNELFLEET_EXTRAS:+[$KERNELFLEET_EXTRAS]}" \
    && rm -rf /tmp/kernelfleet-src \
    && if [ -n "$KERNELFLEET_EXTRAS" ]; then \
        python -m service.tuning.cuda_toolchain install-nvcc /usr/local/bin/nvcc && nvcc --version; \
    fi

RUN groupadd --system --gid 10001 kernelfleet \
    && useradd --system --no-log-init --uid 10001 --gid kernelfleet \
        --create-home --home-dir /home/kernelfleet --shell /usr/sbin/nologin kernelfleet \
    && mkdir -p /app /data \
    && chown kernelfleet:kernelfleet /app /data

WORKDIR /app
USER 10001:10001

# Embedded store, Celery beat's schedule file, logs of `kernelfleet standalone`.
VOLUME ["/data"]
EXPOSE 8000

# For the API role (the default command); compose turns it off for workers, beat and migrate.
# python:slim has no curl, so the probe is Python's urllib; any error or non-2xx status exits 1.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]

CMD ["kernelfleet", "api", "--host", "0.0.0.0", "--port", "8000"]
