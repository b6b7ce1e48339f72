#!/usr/bin/env bash
# The checks only a GPU can do, in one run of under 10 minutes on one GPU (`make gpu-check`):
#   1. lesson 01's roofline against the datasheet (benchmarks/gpu_check.py: matmul and HBM copy >= 70%);
#   2. the mixed tier: the DDP, hooks and sync/async tests with 4 ranks on however many GPUs there are
#      (fewer GPUs than ranks: the ranks run on CPU with the GPUs hidden, the references on the GPU);
#   3. warm launches (mgpu_utils.launch.warm) on the GPU, against torchrun;
#   4. lessons 01, 03 and 10 top to bottom under nbval (their GPU cells run and assert instead of SKIPPED;
#      lesson 10 times a CUDA matmul both ways, feeds the GPU from the DataLoader with pinned memory and,
#      with 2 or more GPUs, runs its scaling study and its traces on NCCL);
#   5. with 2 or more GPUs, the NCCL collectives bench (busbw per op and size, one rank per GPU) and
#      benchmarks/scaling.py over all GPUs.
# Usage: bash benchmarks/gpu_smoke.sh [PYTHON]   (default: .venv/bin/python if it exists, else python3;
# torch must already be installed there). Exit 0 when every step passed or there is no GPU (SKIPPED).
set -u
cd "$(dirname "$0")/.."
# the course's package without installing it: a bare torchrun below imports mgpu_utils from here
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${1:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "SKIPPED: needs a CUDA GPU, found 0 (make gpu-check runs the checks that only a GPU can do)"
    exit 0
fi
NGPU=$("$PY" -c "import torch; print(torch.cuda.device_count())")
"$PY" -c "import torch; print('torch', torch.__version__, '|', torch.cuda.get_device_name(0), '| GPUs:', torch.cuda.device_count())"
failed=()
step() {
    local name=$1; shift
    local t0=$SECONDS
    echo "== $name"
    if "$@"; then echo "== ok: $name ($((SECONDS - t0)) s)"; else echo "== FAILED: $name ($((SECONDS - t0)) s)"; failed+=("$name"); fi
}
# gpu_check.py exits 4 for a GPU with no datasheet on file: measured, not judged (not a failure)
step "roofline vs datasheet (gpu_check.py)" bash -c \
    '"$0" benchmarks/gpu_check.py; rc=$?; [ $rc -eq 4 ] && echo "no datasheet on file: measured, not judged"; [ $rc -eq 4 ] || exit $rc' "$PY"
step "mixed tier, 4 ranks on $NGPU GPU(s): DDP, hooks, sync/async" \
    env MGPU_NPROC=4 "$PY" -m pytest -q -p no:cacheprovider tests/test_ddp.py tests/test_sync_async.py tests/test_checks.py
step "warm launches on the GPU: ranks forked from the template use CUDA and NCCL as torchrun's do" \
    "$PY" -m pytest -q -p no:cacheprovider tests/test_warm.py -k "gpu_ranks or environment"
step "lessons 01, 03 and 10 under nbval" env MGPU_NPROC=4 "$PY" -m pytest -q -p no:cacheprovider \
    notebooks/01_gpu_architecture.ipynb notebooks/03_ddp.ipynb notebooks/10_benchmarking.ipynb
if [ "$NGPU" -ge 2 ]; then
    step "NCCL collectives bench on $NGPU GPUs" "$PY" -m torch.distributed.run --standalone --nproc-per-node "$NGPU" \
        launch_scripts/collectives_bench.py --max-mib 256
    step "scaling study on $NGPU GPUs (NCCL)" "$PY" benchmarks/scaling.py --max-nproc "$NGPU" --out build/scaling_gpu
else
    echo "SKIPPED: the NCCL collectives bench needs 2 GPUs, found $NGPU"
fi
if [ ${#failed[@]} -gt 0 ]; then printf 'failed: %s\n' "${failed[@]}"; exit 1; fi
echo "all GPU checks passed"
