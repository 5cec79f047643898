#!/usr/bin/env bash
# The GPU checks of the secure-noise, clipping and device work, in one bounded
# run: at most 4.5 minutes in all (every step runs under `timeout`, with the
# smaller of its own limit and what is left of a 255 s budget counted from
# the start, or $GPU_CHECK_BUDGET seconds). Run from anywhere on a machine
# with a CUDA GPU:
#
#     bash benchmarks/gpu_check.sh
#
# Most important first: the contract suite on CUDA (`pytest -m gpu
# tests/sim/test_contract.py`), the other GPU tests (the clipping kernels on CUDA
# and test_cuda_matches_cpu, the fused Triton noise kernels against the torch
# operations, the CUDA secure stream against the CPU's), then the figures:
# secure against seeded normals per million on CUDA and a cohort's rows of
# noise in one launch, PriFedSync's CNN round with secure against seeded
# noise, DP-FedAvg's CNN round likewise, and the engine scenario's DP round
# with secure against seeded noise. A summary of the test counts and figures
# closes the output. dpfl runs from this checkout (PYTHONPATH=src). Python
# packages the machine lacks (pytest, hypothesis, dp-accounting,
# cryptography) are installed, without the network, from the wheels in
# $WHEELS (default: .whl/ in the checkout) into a temporary folder, if that
# folder of wheels exists. To fill it (on a machine with the package index;
# these are Linux x86-64 wheels for Python 3.10-3.13, about 19 MB):
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

# the whole script stays under 4.5 minutes (GPU_CHECK_BUDGET seconds in all)
DEADLINE=$((SECONDS + ${GPU_CHECK_BUDGET:-255}))
LOG=$(mktemp)  # every step's output, for the summary at the end

step() {  # step LIMIT_SECONDS COMMAND...: run it under timeout, report its status
    local limit=$1
    shift
    local left=$((DEADLINE - SECONDS))
    [ "$left" -lt "$limit" ] && limit=$left
    echo
    if [ "$left" -lt 10 ]; then
        echo "=== $* : SKIPPED (the budget is spent)" | tee -a "$LOG"
        return
    fi
    echo "=== $* (limit ${limit} s)" | tee -a "$LOG"
    local t0=$SECONDS
    # SIGINT first: pytest then prints the counts of what ran before the limit
    timeout --signal=INT --kill-after=8 "$limit" "$@" 2>&1 | tee -a "$LOG"
    local rc=${PIPESTATUS[0]}
    echo "=== exit status $rc after $((SECONDS - t0)) s$([ "$rc" -eq 124 ] && echo ': TIMED OUT')" | tee -a "$LOG"
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

# Expected on an H200 (the first process probes and compiles the Triton
# kernels, ~10-20 s; later ones read Triton's cache): contract ~90 s, tests
# ~40 s, draws ~30 s, PriFedSync rounds ~35 s, DP-FedAvg rounds ~20 s, engine
# ~25 s; the limits add up to more than the budget, which the last steps then
# share (the engine's first to go).
step 120 python -m pytest -q -m gpu -rfEs -p no:cacheprovider tests/sim/test_contract.py
step 50 python -m pytest -q -m gpu -rfEs -s -p no:cacheprovider \
    tests/sim/test_gradients.py tests/sim/test_secure_noise_triton.py tests/sim/test_secure_noise.py
step 35 python benchmarks/secure_noise.py --device cuda --no-rounds --repeats 7
step 40 python benchmarks/secure_noise.py --device cuda --no-draws --rounds 3 \
    --runs prifedsync
step 25 python benchmarks/secure_noise.py --device cuda --no-draws --rounds 3 \
    --runs dp-fedavg-cnn
step 30 python benchmarks/engine.py --device cuda --rounds 20 --repeats 1 --warmup 2 \
    --no-memory

echo
echo "=== summary (full output above)"
grep -E "^=== (python|exit|.*SKIPPED)|^(FAILED|ERROR) |[0-9]+ (passed|failed|skipped|errors?)\b|TF32:|secure noise kernel|fused Triton kernel|fill_normal_rows_ draws|^(one million|a cohort)|^  (secure|seeded)[,:]|^  round [0-9]+:|secure / seeded|^(PriFedSync|DP-FedAvg)|paired dp secure/dp" "$LOG"
rm -f "$LOG"
