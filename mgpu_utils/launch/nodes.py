"""Several torchrun agents on one machine, as several nodes of one job (notebooks/12_fault_tolerance.ipynb).

On a cluster every node runs one torchrun *agent*; the agents meet at a rendezvous (here c10d: a
key-value store, a TCPStore), agree on the set of nodes, give every worker its global rank, and start
the workers. :func:`launch_nodes` hosts the store itself, in the calling process (as a real job keeps it
on a machine of its own, or in etcd: it must outlive any node), and starts ``nodes`` agents as local
processes, each exactly as::

    torchrun --nnodes MIN:MAX --nproc-per-node P --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT \\
             --rdzv-id JOB --rdzv-conf is_host=0,last_call_timeout=2,keep_alive_interval=1 script.py ...

It prints each node's output prefixed ``[node k]`` together with the agents' rendezvous events, can kill
one node mid-run (SIGKILL to its agent and its workers, as a lost machine), and kills whatever is still
running when it returns or is interrupted. (With the store in agent 0, ``is_host=1``, the other agents'
last store calls at exit race agent 0's exit, and torch prints a connection error with a C++ stack.)

Elastic: with ``min_nodes < nodes`` (``--nnodes 1:2``), when a node is lost the surviving agents stop
their workers, meet again without it and restart the workers with the smaller world size (this counts
as one of ``max_restarts``). The script must resume from its own snapshot and cope with the new world size.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field

from mgpu_utils.compat import check_torch_version
from mgpu_utils.dist import ERROR_MARKER, LINE_WIDTH_ENV, RESULT_MARKER, parse_result
from mgpu_utils.text import LINE_WIDTH, wrap_text
from mgpu_utils.launch.launcher import LaunchError, LaunchTimeout, decide_backend
from mgpu_utils.launch.logs import SECONDARY
from mgpu_utils.launch.processes import kill_all, process_tree, rank_environment, resolve_script

#: Rendezvous settings for one machine: close a round 2 s after the minimum number of nodes joined
#: (torch's default: 30 s), and a node's heartbeat every second (default 5 s) so a lost node is noticed fast.
RDZV_CONF = "last_call_timeout=2,keep_alive_interval=1"

_AGENT_LOG = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+\] ?(.*)$")   # torch's logging prefix


@dataclass
class NodesResult:
    """What :func:`launch_nodes` returns.

    Attributes:
        result: the JSON dict that global rank 0 printed (None if none did).
        returncodes: each node's agent exit code (-9 for a node that was killed), indexed by node.
        outputs: each node's worker output lines (the agents' own log lines left out), indexed by node.
        world_sizes: the world size of every rendezvous round, in order, as node 0's agent reported it
            (e.g. ``[2, 1]`` for a scale-down from two nodes to one).
        killed: the node that was killed, or None.
        leftover: process ids of agents or workers still alive after the cleanup (should be empty).
        seconds: wall-clock time of the whole run.
    """

    result: dict | None
    returncodes: list[int]
    outputs: list[list[str]]
    world_sizes: list[int]
    killed: int | None = None
    leftover: list[int] = field(default_factory=list)
    seconds: float = 0.0


def node_environment(env: dict | None, nodes: int, nproc_per_node: int) -> dict:
    """The environment of every agent and worker of :func:`launch_nodes` (lesson 12).

    The nodes share this machine's GPUs, so the local rank 0 of two nodes would pick the same GPU: the
    job runs on gloo on CPU, decided once here with the GPUs hidden (a preset ``CUDA_VISIBLE_DEVICES``,
    as Slurm's ``--gres`` sets it, is replaced). The agents log their rendezvous events, and the ranks
    wrap their lines earlier by the ``[node k] `` in front of them.
    """
    child_env = rank_environment(env, nodes * nproc_per_node)
    child_env.update(LOGLEVEL="INFO", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    # the nodes share this machine's GPUs, so two nodes' local rank 0 would pick the same one: gloo on CPU,
    # decided once here (a preset CUDA_VISIBLE_DEVICES, as Slurm's --gres sets it, is replaced)
    child_env.update(decide_backend(nodes * nproc_per_node, "gloo", child_env))
    # the ranks' log lines get "[node k] " in front here: they wrap that much earlier
    child_env[LINE_WIDTH_ENV] = str(int(child_env.get(LINE_WIDTH_ENV) or LINE_WIDTH) - len(f"[node {nodes - 1}] "))
    return child_env


def launch_nodes(script, nodes: int = 2, nproc_per_node: int = 1, args=(), *, min_nodes: int | None = None,
                 max_restarts: int = 0, kill_node: int | None = None, kill_when: str | None = None,
                 timeout_s: float = 300.0, show: bool = True, env: dict | None = None) -> NodesResult:
    """Run ``script`` as a job of ``nodes`` torchrun agents on this machine, each with ``nproc_per_node`` workers.

    Args:
        script: path, or file name inside ``launch_scripts/``.
        nodes: number of agents ("nodes"), >= 1. Global ranks: node k holds k·P .. k·P + P - 1.
        nproc_per_node: workers per agent (P), >= 1.
        args: command-line arguments for the script.
        min_nodes: elastic lower bound (``--nnodes min_nodes:nodes``); None: a fixed ``--nnodes nodes``.
        max_restarts: torchrun's ``--max-restarts`` for every agent (a lost node costs one restart).
        kill_node: the node to kill, 0 .. nodes-1 (by start order: node k is the k-th agent started).
        kill_when: kill it as soon as a line of any node's output contains this text.
        timeout_s: wall-clock limit in seconds; past it everything is killed.
        show: print each node's worker output and the agents' rendezvous events as they happen.
        env: extra environment variables for agents and workers.

    Returns:
        :class:`NodesResult`.

    Raises:
        ValueError: bad ``nodes``, ``min_nodes``, ``kill_node`` or a ``kill_node`` without ``kill_when``.
        LaunchError: a node that was not killed exited with an error (its last output in the message), or
            ``kill_when`` never appeared.
        LaunchTimeout: the job ran past ``timeout_s`` (every process was killed).
    """
    check_torch_version()
    if not isinstance(nodes, int) or nodes < 1 or not isinstance(nproc_per_node, int) or nproc_per_node < 1:
        raise ValueError(f"nodes and nproc_per_node must be integers >= 1, got {nodes!r} and {nproc_per_node!r}")
    if min_nodes is not None and not 1 <= min_nodes <= nodes:
        raise ValueError(f"min_nodes must be between 1 and nodes={nodes}, got {min_nodes!r}")
    if kill_node is not None:
        if not isinstance(kill_node, int) or not 0 <= kill_node < nodes:
            raise ValueError(f"kill_node must be a node index, 0 .. {nodes - 1}, got {kill_node!r}")
        if not kill_when:
            raise ValueError("kill_node needs kill_when: the output text after which the node is killed")
    path = resolve_script(script)
    child_env = node_environment(env, nodes, nproc_per_node)
    from torch.distributed import TCPStore

    # the rendezvous store, here: it lives until every agent is gone (port 0: the system picks a free one)
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    port, job = store.port, f"mgpu-{uuid.uuid4().hex[:8]}"
    nnodes = f"{min_nodes}:{nodes}" if min_nodes is not None else str(nodes)
    outputs, world_sizes, lock = [[] for _ in range(nodes)], [], threading.Lock()
    seen, killed, kill_event, quiet, node_rank = {}, None, threading.Event(), [False] * nodes, {}

    def reader(k, stream):
        pending = None                                     # inside an agent's "Rendezvous complete" block
        for raw in iter(stream.readline, ""):
            line = raw.rstrip("\n")
            m = _AGENT_LOG.match(line)
            if m:                                          # the agent's own log: keep only the events
                text = m.group(1)
                if "Rendezvous complete" in text:
                    pending = {}
                elif pending is not None and "=" in text:
                    key, _, value = text.strip().partition("=")
                    pending[key] = value
                    if key == "global_world_sizes":
                        size = int(value.strip("[]").split(",")[0])
                        with lock:
                            node_rank.setdefault(k, int(pending.get("group_rank", k)))
                            if k == 0:
                                world_sizes.append(size)
                            if show:
                                print(f"[node {k}] rendezvous: node {pending.get('group_rank')} of "
                                      f"{pending.get('group_world_size')}, world size {size}, "
                                      f"restart {pending.get('restart_count')}", flush=True)
                        pending = None
                elif "Worker group FAILED" in text and show:
                    print(wrap_text(f"[node {k}] agent: a worker failed; {text.split(';')[0].split('FAILED. ')[-1]}; "
                                    f"restarting the worker group"), flush=True)
                continue
            with lock:
                outputs[k].append(line)
                if line.startswith(ERROR_MARKER):            # one line per failed rank, not its traceback
                    err = json.loads(line[len(ERROR_MARKER):])
                    quiet[k] = True
                    if show:
                        message = re.sub(r"^\[[^\]]*\]\s*", "", err["message"])     # gloo's source path
                        print(wrap_text(f"[node {k}] [rank {err['rank']}] failed: {err['type']}: "
                                        f"{message.split('. ')[0][:160]}"), flush=True)
                    continue
                if quiet[k] and not line.startswith("[rank"):
                    continue
                quiet[k] = False
                if show and not line.startswith(RESULT_MARKER):
                    print(f"[node {k}] {line}", flush=True)
            if kill_when and kill_when in line:
                kill_event.set()

    procs, threads = [], []
    t0 = time.perf_counter()
    try:
        for k in range(nodes):
            cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}",
                   f"--nproc-per-node={nproc_per_node}", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
                   f"--rdzv-id={job}", f"--rdzv-conf=is_host=0,{RDZV_CONF}",
                   f"--max-restarts={max_restarts}", str(path), *map(str, args)]
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 text=True, env=child_env, cwd=os.getcwd(), start_new_session=True)
            procs.append(p)
            threads.append(threading.Thread(target=reader, args=(k, p.stdout), daemon=True))
            threads[-1].start()
        while any(p.poll() is None for p in procs):
            for p in procs:                               # remember every worker ever started, for the cleanup
                for q in process_tree(p.pid):
                    seen[q.pid] = q
            if time.perf_counter() - t0 > timeout_s:
                raise LaunchTimeout(wrap_text(f"{path.name} on {nodes} nodes ran past timeout_s={timeout_s:g} s; "
                                              f"every agent and worker was killed. Last output:",
                                              first=len("LaunchTimeout: ")) + "\n" + "\n".join(
                                        f"[node {k}] {line}" for k in range(nodes) for line in outputs[k][-5:]))
            if kill_event.is_set() and killed is None:
                if show:
                    print(f"[launcher] killing node {kill_node} (SIGKILL to its agent and workers), as a lost machine",
                          flush=True)
                victim = procs[kill_node]
                workers = process_tree(victim.pid)[1:]
                victim.kill()                              # the agent through Popen, so its exit code is kept
                victim.wait()
                kill_all(workers)
                killed = kill_node
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                workers = process_tree(p.pid)[1:]
                p.kill()
                p.wait()
                kill_all(workers)
        kill_all([q for q in seen.values() if q.is_running()])
        for t in threads:
            t.join(timeout=5)
        del store                                         # after the agents: none of them loses its store early
    import psutil

    leftover = [pid for pid, q in seen.items() if q.is_running() and q.status() != psutil.STATUS_ZOMBIE]
    codes = [p.returncode for p in procs]
    swapped = {k: j for k, j in node_rank.items() if j != k}
    if swapped:                     # c10d orders agents by (host, pid): node 0 started first has the lower pid
        raise LaunchError(wrap_text(f"the rendezvous numbered the agents differently from their start order "
                                    f"({swapped}: process ids wrapped around?); node 0 must be the job's node 0. "
                                    f"Run it again.", first=len("LaunchError: ")))
    if kill_node is not None and killed is None:
        raise LaunchError(wrap_text(f"the text {kill_when!r} never appeared in the output, so node {kill_node} was "
                                    f"not killed", first=len("LaunchError: ")))
    failed = [k for k, code in enumerate(codes) if k != killed and code != 0]
    if failed:                      # name the root cause: a rank whose error is not a peer's connection closing
        errors = [(k, json.loads(line[len(ERROR_MARKER):])) for k in failed for line in outputs[k]
                  if line.startswith(ERROR_MARKER)]
        errors.sort(key=lambda e: (bool(SECONDARY.search(e[1]["message"])), e[1]["time"]))
        k = errors[0][0] if errors else failed[0]
        tail = "\n".join(f"[node {k}] {line}" for line in outputs[k][-15:])
        if errors:
            err = errors[0][1]
            raise LaunchError(wrap_text(f"rank {err['rank']} on node {k} failed with {err['type']}: "
                                        f"{err['message'][:300]}", first=len("LaunchError: "))
                              + f"\nNode {k}'s last output:\n{tail}",
                              rank=err["rank"], exc_type=err["type"], message=err["message"])
        raise LaunchError(f"node {k}'s agent exited with code {codes[k]}. Its last output:\n{tail}")
    result = None
    for k in range(nodes):
        for line in outputs[k]:
            if line.startswith(RESULT_MARKER):
                result = parse_result(line)
    return NodesResult(result, codes, outputs, world_sizes, killed, leftover, time.perf_counter() - t0)
