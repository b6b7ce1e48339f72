#!/usr/bin/env bash
# Any launch script of the course on several hosts you can reach, without Slurm: the same c10d
# rendezvous as cluster/slurm/job.sbatch. Run it on every host, each with its own NODE_RANK:
#
# host0$ NNODES=2 NODE_RANK=0 RDZV_HOST=host0 bash cluster/multinode.sh launch_scripts/ddp_train.py
# host1$ NNODES=2 NODE_RANK=1 RDZV_HOST=host0 bash cluster/multinode.sh launch_scripts/ddp_train.py
#
# or from one machine over ssh (the course at the same path on every host):
#   HOSTS="host0 host1" bash cluster/multinode.sh launch_scripts/ddp_train.py --epochs 8
#
# Variables: NNODES; NODE_RANK (0 .. NNODES-1); RDZV_HOST (an address of host 0 that every host
# reaches); RDZV_PORT (default 29400; the preflight uses RDZV_PORT + 1); RDZV_ID (default
# mgpu-SCRIPT; the same on every host, a new one per job); NPROC_PER_NODE (default: the host's GPUs,
# else its usable CPUs); MAX_RESTARTS (default 1); PYTHON (default .venv/bin/python); PREFLIGHT (1:
# check first that the hosts reach each other; default 1); LOG_DIR (default logs/multinode).
set -euo pipefail
usage="NNODES=N NODE_RANK=K RDZV_HOST=HOST bash cluster/multinode.sh SCRIPT [ARGS...]"
[ $# -ge 1 ] || { echo "usage: $usage" >&2; exit 2; }
COURSE_DIR=$(cd "$(dirname "$0")/.." && pwd)
cd "$COURSE_DIR"
[ -f "$1" ] || { echo "no script $1 in $COURSE_DIR: check its name (e.g. launch_scripts/ddp_train.py)" >&2; exit 2; }
PYTHON=${PYTHON:-$COURSE_DIR/.venv/bin/python}
[ -x "$PYTHON" ] || PYTHON=$(command -v python3)
RDZV_PORT=${RDZV_PORT:-29400}
RDZV_ID=${RDZV_ID:-mgpu-$(basename "$1" .py)}

if [ -n "${HOSTS:-}" ]; then           # the launcher: this script on every host, in node-rank order
    read -r -a hosts <<< "$HOSTS"
    pids=()
    for k in "${!hosts[@]}"; do
        vars="NNODES=${#hosts[@]} NODE_RANK=$k RDZV_HOST=${RDZV_HOST:-${hosts[0]}}"
        vars+=" RDZV_PORT=$RDZV_PORT RDZV_ID=$RDZV_ID"
        cmd="cd $(printf %q "$COURSE_DIR") && $vars bash cluster/multinode.sh $(printf '%q ' "$@")"
        ssh "${hosts[$k]}" "$cmd" 2>&1 | sed -u "s/^/[${hosts[$k]}] /" &
        pids+=($!)
    done
    status=0
    for p in "${pids[@]}"; do wait "$p" || status=$?; done
    exit "$status"
fi

: "${NNODES:?set NNODES (the number of hosts)}"
: "${NODE_RANK:?set NODE_RANK (this host: 0 .. NNODES-1)}"
: "${RDZV_HOST:?set RDZV_HOST (an address of host 0 that every host reaches)}"
export PYTHONPATH="$COURSE_DIR${PYTHONPATH:+:$PYTHONPATH}"
LOG_DIR=${LOG_DIR:-$COURSE_DIR/logs/multinode}
mkdir -p "$LOG_DIR"
if [ -n "${NPROC_PER_NODE:-}" ]; then ranks=$NPROC_PER_NODE
elif [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then ranks=$(tr , "\n" <<< "$CUDA_VISIBLE_DEVICES" | wc -l)
elif nvidia-smi -L >/dev/null 2>&1; then ranks=$(nvidia-smi -L | grep -c "^GPU")
else ranks=$(nproc); fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( $(nproc) / ranks > 0 ? $(nproc) / ranks : 1 ))}
# the workers make their own store on every attempt (as in cluster/slurm/job.sbatch): with torchrun's, a retry
# can read the previous attempt's addresses and hang or fail to connect (pytorch/pytorch#135712)
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1

if [ "${PREFLIGHT:-1}" = 1 ]; then
    "$PYTHON" launch_scripts/preflight.py --endpoint "$RDZV_HOST:$((RDZV_PORT + 1))" \
        --nnodes "$NNODES" --node-rank "$NODE_RANK" --timeout 60
fi
"$PYTHON" -m torch.distributed.run --nnodes "$NNODES" --nproc-per-node "$ranks" \
    --rdzv-backend c10d --rdzv-endpoint "$RDZV_HOST:$RDZV_PORT" --rdzv-id "$RDZV_ID" \
    --rdzv-conf is_host=$([ "$NODE_RANK" = 0 ] && echo 1 || echo 0) \
    --max-restarts "${MAX_RESTARTS:-1}" --log-dir "$LOG_DIR/torchrun/node$NODE_RANK" --tee 3 \
    "$@" 2>&1 | tee "$LOG_DIR/node$NODE_RANK.log"
