#!/usr/bin/env bash
# The GPU checks of the secure-noise and clipping work, in one bounded run
# (at most 8 minutes; every step under `timeout`). Run from anywhere on
# a machine with a CUDA GPU:
#
#     bash benchmarks/gpu_check.sh
#
# It runs the GPU tests (`pytest -m gpu`: the contract suite on CUDA, the
# clip-norm bound on CUDA, test_cuda_matches_cpu, the CUDA secure stream
# against the CPU's) and prints the benchmark figures: secure against seeded
# normals per million on CUDA, PriFedSync's CNN round with secure against
# seeded noise, and the engine scenario on CUDA. dpfl runs from this
# checkout (PYTHONPATH=src). Python packages the machine lacks (pytest,
# hypothesis, dp-accounting, cryptography) are installed, without the
# network, from the wheels in $WHEELS (default: .whl/ in the checkout) into
# a temporary folder, if that folder of wheels exists. To fill it (on a
# machine with the package index; these are Linux x86-64 wheels for Python
# 3.10-3.13, about 19 MB):
#
#     for v in 3.10 3.11 3.12 3.13; do
#       pip download --only-binary=:all: --no-deps --python-version $v \
#         --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
#         --platform manylinux_2_17_x86_64 --platform manylinux_2_5_x86_64 \
#         --platform manylinux1_x86_64 -d .whl dp-accounting==0.6.0 \
#         cryptography==50.0.2 absl-py attrs dm-tree wrapt mpmath cffi \
#         pycparser pytest pluggy iniconfig packaging hypothesis \
#         sortedcontainers exceptiongroup tomli typing_extensions
#     done
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
WHEELS="${WHEELS:-$PWD/.whl}"

step() {  # step LIMIT_SECONDS COMMAND...: run it under timeout, report its status
    local limit=$1
    shift
    echo
    echo "=== $* (limit ${limit} s)"
    local t0=$SECONDS
    timeout --kill-after=10 "$limit" "$@"
    local rc=$?
    echo "=== exit status $rc after $((SECONDS - t0)) s$([ $rc -eq 124 ] && echo ': TIMED OUT')"
}

echo "=== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python -c "import sys, torch; print('python', sys.version.split()[0], '| torch', torch.__version__, '| CUDA', torch.version.cuda, '| available', torch.cuda.is_available())"
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" || {
    echo "no CUDA device: nothing to check"
    exit 2
}

missing=$(python - <<'EOF'
import importlib.util
# pip name -> import name: what the tests and benchmarks need beyond torch,
# numpy, scipy, pyyaml and scikit-learn (only the absent ones are installed)
need = {"pytest": "pytest", "pluggy": "pluggy", "iniconfig": "iniconfig",
        "packaging": "packaging", "exceptiongroup": "exceptiongroup",
        "tomli": "tomli", "hypothesis": "hypothesis",
        "sortedcontainers": "sortedcontainers", "attrs": "attr",
        "dp-accounting": "dp_accounting", "absl-py": "absl", "dm-tree": "tree",
        "wrapt": "wrapt", "mpmath": "mpmath", "cryptography": "cryptography",
        "cffi": "cffi", "pycparser": "pycparser",
        "typing_extensions": "typing_extensions"}
print(" ".join(p for p, m in need.items() if importlib.util.find_spec(m) is None))
EOF
)
if [ -n "$missing" ]; then
    if [ -d "$WHEELS" ]; then
        deps=$(mktemp -d)
        echo "=== installing from $WHEELS into $deps: $missing"
        timeout 120 python -m pip install -q --no-index --no-deps --find-links "$WHEELS" \
            --target "$deps" $missing || echo "=== some wheels did not install"
        export PYTHONPATH="$PYTHONPATH:$deps"
    else
        echo "=== missing packages ($missing) and no wheels in $WHEELS: tests that need them fail"
    fi
fi

# the torch.compile of the CUDA keystream kernel (about a minute) happens in
# the first step; later processes reuse torch's on-disk compile cache
step 120 python -m pytest -q -m gpu -rs -s -p no:cacheprovider \
    tests/test_secure_noise.py tests/test_gradients.py
step 130 python -m pytest -q -m gpu -rs -p no:cacheprovider tests/test_contract.py
step 75 python benchmarks/secure_noise.py --device cuda --no-rounds --repeats 15
step 90 python benchmarks/secure_noise.py --device cuda --no-draws --rounds 3
step 60 python benchmarks/engine.py --device cuda --rounds 10 --repeats 1 --warmup 2
