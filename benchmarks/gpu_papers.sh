#!/usr/bin/env bash
# The papers' runs that need a GPU, in one bounded script: DP-FedAvg's CNN at
# the paper's scale (Geyer, Klein & Nabi 2017, K = 100, m = 50, 11 rounds,
# preset dp-fedavg-fmnist), then its non-private row (the same run
# without noise), then as many rounds of the K = 1000 preset as the budget
# leaves, then the K = 10000 preset likewise. Every step runs under `timeout` with the smaller of its own limit and
# what is left of $GPU_PAPERS_BUDGET seconds (default 200). Run from anywhere
# on a machine with a CUDA GPU and Fashion-MNIST in
# /usr/share/datasets/fashion-mnist:
#
#     bash benchmarks/gpu_papers.sh [OUT]
#
# Each run's metrics.jsonl and guarantee.json are copied to OUT (default
# /tmp/gpu_papers), and a summary (test accuracy per round, wall time, the
# guarantee) closes the output. Packages the machine lacks are installed
# without the network from the wheels in $WHEELS (default .whl/ in the
# checkout), as benchmarks/gpu_check.sh does.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
WHEELS="${WHEELS:-$PWD/.whl}"
OUT="${1:-/tmp/gpu_papers}"
mkdir -p "$OUT"
DEADLINE=$((SECONDS + ${GPU_PAPERS_BUDGET:-200}))

echo "=== machine"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"

missing=$(python - <<'PY'
import importlib.util
need = {"dp-accounting": "dp_accounting", "dm-tree": "tree", "cryptography": "cryptography",
        "cffi": "cffi", "pycparser": "pycparser", "matplotlib": "matplotlib",
        "contourpy": "contourpy", "cycler": "cycler", "fonttools": "fontTools",
        "kiwisolver": "kiwisolver", "pillow": "PIL", "pyparsing": "pyparsing",
        "python-dateutil": "dateutil", "six": "six", "tqdm": "tqdm",
        "threadpoolctl": "threadpoolctl", "typing_extensions": "typing_extensions"}
print(" ".join(p for p, m in need.items() if importlib.util.find_spec(m) is None))
PY
)
if [ -n "$missing" ] && [ -d "$WHEELS" ]; then
    deps=$(mktemp -d)
    echo "=== installing from $WHEELS: $missing"
    timeout 60 python -m pip install -q --no-index --no-deps --find-links "$WHEELS" \
        --target "$deps" $missing || echo "=== some wheels did not install"
    export PYTHONPATH="$PYTHONPATH:$deps"
fi

run() {  # run NAME LIMIT CONFIG [--set ...]: one training run under timeout
    local name=$1 limit=$2
    shift 2
    local left=$((DEADLINE - SECONDS))
    [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -lt 15 ]; then
        echo "=== $name: SKIPPED (the budget is spent)"
        return
    fi
    echo "=== $name (limit $limit s): dpfl train $*"
    local t0=$SECONDS
    timeout --signal=INT --kill-after=10 "$limit" python -c \
        "import sys; from dpfl.cli.main import main; sys.exit(main())" \
        train "$@" --set device=cuda --set checkpoint_every=1000 --no-progress \
        --out "$OUT/runs-$name" 2>&1 | tail -5
    echo "=== $name: exit ${PIPESTATUS[0]} after $((SECONDS - t0)) s"
    for f in "$OUT"/runs-"$name"/*/metrics.jsonl "$OUT"/runs-"$name"/*/guarantee.json; do
        [ -f "$f" ] && cp "$f" "$OUT/$name.$(basename "$f")"
    done
    rm -f "$OUT"/runs-"$name"/*/checkpoint*.pt
}

run dp-fedavg-k100 110 dp-fedavg-fmnist
run dp-fedavg-k100-nonprivate 70 dp-fedavg-fmnist \
    --set privacy.noise_multiplier=0 --set privacy.guard=accountant \
    --set privacy.epsilon=.inf
run dp-fedavg-k1000 60 dp-fedavg-fmnist-k1000
run dp-fedavg-k10000 110 dp-fedavg-fmnist-k10000

echo "=== summary"
python - "$OUT" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
for m in sorted(out.glob("*.metrics.jsonl")):
    rows = [json.loads(l) for l in m.read_text().splitlines() if l.strip()]
    acc = [r.get("test_accuracy") for r in rows if r.get("test_accuracy") is not None]
    print(m.name.split(".")[0], "rounds", len(rows), "test accuracy",
          " ".join(f"{a:.3f}" for a in acc))
for g in sorted(out.glob("*.guarantee.json")):
    print(g.name.split(".")[0], g.read_text()[:600].replace("\n", " "))
PY
