"""Exercises 03.4 to 03.7's graders (mgpu_utils.grading.coding.data_parallel), round 2 of issue 55: right
solutions written as students write them (an explicit ReduceOp.SUM, all_reduce imported by name, one flat
tensor, futures, tensor hooks, buckets laid out in advance as DDP does, a coalesced broadcast) pass; wrong ones
get the hint that names the mistake made. Each list is graded in one launch at 3 ranks."""
import re

from helpers import red_team, remove_red_team_shm, wrong
from mgpu_utils.grading.runner import grade_many

# 03.4 ---------------------------------------------------------------------------------------------------------
REDUCE = ("        dist.all_reduce(p.grad)          "
          "# sum over the ranks (dist.ReduceOp.AVG on NCCL does both at once)\n"
          "        p.grad /= world\n")
LOOP = "    for p in model.parameters():\n        if p.grad is None:\n            continue\n" + REDUCE
IMPORT = "import torch.distributed as dist\n"

RIGHT_034 = {   # name: (text of the solution, replaced by)
    "an explicit ReduceOp.SUM, then div_": (
        REDUCE, "        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)\n        p.grad.div_(world)\n"),
    "all_reduce and ReduceOp imported by name": (
        [IMPORT, REDUCE], [IMPORT + "from torch.distributed import ReduceOp, all_reduce\n",
                           "        all_reduce(p.grad, op=ReduceOp.SUM)\n        p.grad /= world\n"]),
    "divided first, then summed": (REDUCE, "        p.grad /= world\n        dist.all_reduce(p.grad)\n"),
    "torch.distributed.nn's all_reduce, a new gradient": (
        [IMPORT, REDUCE], [IMPORT + "import torch.distributed.nn.functional as dist_nn\n",
                           "        p.grad = dist_nn.all_reduce(p.grad) / world\n"]),
    "one flat tensor (torch._utils._flatten_dense_tensors)": (
        LOOP, "    grads = [p.grad for p in model.parameters() if p.grad is not None]\n"
              "    flat = torch._utils._flatten_dense_tensors(grads)\n    dist.all_reduce(flat)\n    flat /= world\n"
              "    for g, mean in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):\n"
              "        g.copy_(mean)\n"),
    "asynchronous all-reduces, every one waited": (
        LOOP, "    works = [(p, dist.all_reduce(p.grad, async_op=True)) for p in model.parameters() "
              "if p.grad is not None]\n    for p, work in works:\n        work.wait()\n        p.grad /= world\n"),
    "on p.grad.data, times 1 / world": (
        REDUCE, "        dist.all_reduce(p.grad.data)\n        p.grad.data.mul_(1.0 / world)\n"),
}

WRONG_034 = {   # name: (text of the solution, replaced by, the hint it must get at 3 ranks)
    "the weights averaged, not the gradients": (
        REDUCE, "        dist.all_reduce(p.data)\n        p.data /= world\n",
        r"the gradient of 0.weight is still this rank's own: 6 of the 6 all-reduce\(s\) were of the parameters "
        r"themselves \(their weights\), not of p.grad"),
    "asynchronous, never waited": (
        REDUCE, "        dist.all_reduce(p.grad, async_op=True)\n        p.grad /= world\n",
        r"6 of the 6 asynchronous all-reduces were never waited for"),
    "asynchronous, divided before wait()": (
        REDUCE, "        work = dist.all_reduce(p.grad, async_op=True)\n        p.grad /= world\n        work.wait()\n",
        r"is 3 times DDP's: it was changed \(divided\?\) before its all-reduce's wait\(\) returned"),
    "a return indented into the loop: the first gradient only": (
        REDUCE, REDUCE + "        return\n",
        r"the gradient of 0.bias is still this rank's own: your all-reduces carried 2,048 of the model's 3,466 "
        r"gradient elements \(world size 3\), not this one"),
}

# 03.5 ---------------------------------------------------------------------------------------------------------
APPEND = "        self.pending.append((p, dist.all_reduce(p.grad, async_op=True)))\n"
WAIT = "            work.wait()\n            p.grad /= self.world\n"
FINISH_035 = ("        for p, work in self.pending:\n" + WAIT + "        self.pending.clear()\n")
HOOKS_035 = "        for p in model.parameters():\n            p.register_post_accumulate_grad_hook(self.ready)\n"

RIGHT_035 = {
    "get_future().wait()": (WAIT, "            work.get_future().wait()\n            p.grad /= self.world\n"),
    "torch.futures.wait_all, then divide": (
        FINISH_035, "        torch.futures.wait_all([work.get_future() for _, work in self.pending])\n"
                    "        for p, _ in self.pending:\n            p.grad.div_(self.world)\n"
                    "        self.pending.clear()\n"),
    "divided in the hook, before the all-reduce": (
        [APPEND, WAIT], ["        p.grad.div_(self.world)\n" + APPEND, "            work.wait()\n"]),
    "all_reduce imported by name, an explicit ReduceOp.SUM": (
        [IMPORT, APPEND], [IMPORT + "from torch.distributed import ReduceOp, all_reduce\n",
                           "        self.pending.append((p, all_reduce(p.grad, op=ReduceOp.SUM, async_op=True)))\n"]),
    "a tensor hook (register_hook) on the incoming gradient, copied into p.grad in finish": (
        [HOOKS_035, "    def ready(self, p: torch.Tensor) -> None:\n", APPEND, FINISH_035],
        ["        for p in model.parameters():\n"
         "            p.register_hook(lambda g, p=p: self.ready(p, g))\n",
         "    def ready(self, p: torch.Tensor, g: torch.Tensor) -> None:\n",
         "        self.pending.append((p, g, dist.all_reduce(g, async_op=True)))\n",
         "        for p, g, work in self.pending:\n            work.wait()\n            p.grad.copy_(g / self.world)\n"
         "        self.pending.clear()\n"]),
}

WRONG_035 = {
    "a blocking all-reduce in the hook": (
        [APPEND, WAIT], ["        dist.all_reduce(p.grad)\n        self.pending.append((p, None))\n",
                         "            p.grad /= self.world\n"],
        r"6 all-reduce call\(s\) for 6 parameters, 0 of them started inside backward with async_op=True"),
    "divided before wait()": (
        WAIT, "            p.grad /= self.world\n            work.wait()\n",
        r"is 3 times DDP's: it was changed \(divided\?\) before its all-reduce's wait\(\) returned"),
    "an all-reduce of a copy of each gradient": (
        APPEND, "        self.pending.append((p, dist.all_reduce(p.grad.clone(), async_op=True)))\n",
        r"is this rank's own divided by 3: the all-reduce ran on a copy, and its result never came back into "
        r"p.grad: all-reduce p.grad itself"),
}

# 03.6 ---------------------------------------------------------------------------------------------------------
SEND_036 = "        flat = torch.cat([p.grad.reshape(-1) for p in params])\n"
PENDING_036 = "        self.pending.append((params, flat, dist.all_reduce(flat, async_op=True)))\n"
WAIT_036 = ("            work.wait()\n            flat /= self.world\n            offset = 0\n"
            "            for p in params:\n"
            "                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))\n"
            "                offset += p.numel()\n")
FULL_036 = ("        if sum(q.grad.numel() * q.grad.element_size() for q in self.bucket) >= self.bucket_bytes:\n"
            "            self.send(self.bucket)\n"
            "            self.bucket = []                              # a new bucket\n")
LEFT_036 = ("        if self.bucket:                                   # what is left after backward\n"
            "            self.send(self.bucket)\n            self.bucket = []\n")

LAID_OUT = '''import torch
import torch.distributed as dist


class BucketedGradients:
    """Buckets laid out once, in reverse parameter order (the order backward completes them), as DDP does."""

    def __init__(self, model, bucket_bytes):
        self.world = dist.get_world_size()
        self.buckets, current, size = [], [], 0
        for p in reversed(list(model.parameters())):
            current.append(p)
            size += p.numel() * p.element_size()
            if size >= bucket_bytes:
                self.buckets.append(current)
                current, size = [], 0
        if current:
            self.buckets.append(current)
        self.bucket_of = {p: i for i, bucket in enumerate(self.buckets) for p in bucket}
        self.waiting = [len(b) for b in self.buckets]
        self.pending = []
        for p in model.parameters():
            p.register_post_accumulate_grad_hook(self.ready)

    def ready(self, p):
        i = self.bucket_of[p]
        self.waiting[i] -= 1
        if self.waiting[i] == 0:                  # the bucket's last gradient: send it
            flat = torch.cat([q.grad.reshape(-1) for q in self.buckets[i]])
            self.pending.append((self.buckets[i], flat, dist.all_reduce(flat, async_op=True)))

    def finish(self):
        for params, flat, work in self.pending:
            work.wait()
            flat /= self.world
            offset = 0
            for p in params:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        self.pending.clear()
        self.waiting = [len(b) for b in self.buckets]
'''

RIGHT_036 = {
    "flattened and unflattened with torch._utils": (
        [SEND_036, WAIT_036],
        ["        flat = torch._utils._flatten_dense_tensors([p.grad for p in params])\n",
         "            work.wait()\n            grads = [p.grad for p in params]\n"
         "            for g, mean in zip(grads, torch._utils._unflatten_dense_tensors(flat / self.world, grads)):\n"
         "                g.copy_(mean)\n"]),
    "a running byte count": (
        ["        self.bucket, self.pending = [], []", FULL_036, LEFT_036],
        ["        self.bucket, self.pending, self.size = [], [], 0",
         "        self.size += p.grad.numel() * p.grad.element_size()\n        if self.size >= self.bucket_bytes:\n"
         "            self.send(self.bucket)\n            self.bucket, self.size = [], 0\n",
         "        if self.bucket:\n            self.send(self.bucket)\n            self.bucket, self.size = [], 0\n"]),
    "each bucket's future divides (get_future().then)": (
        [PENDING_036, WAIT_036, "        for params, flat, work in self.pending:\n"],
        ["        fut = dist.all_reduce(flat, async_op=True).get_future().then(lambda f: f.value()[0] / self.world)\n"
         "        self.pending.append((params, fut))\n",
         "            flat = fut.wait()\n            offset = 0\n            for p in params:\n"
         "                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))\n"
         "                offset += p.numel()\n",
         "        for params, fut in self.pending:\n"]),
    "buckets laid out in __init__, in reverse parameter order": (None, LAID_OUT),
}

WRONG_036 = {
    "the means never copied back into the gradients": (
        WAIT_036, "            work.wait()\n            flat /= self.world\n",
        r"the gradient of \S+ is still this rank's own, though 2 all-reduce\(s\) ran and carried 3,466 elements, "
        r"every gradient's .* copy each parameter's slice of the averaged bucket back into p.grad"),
    "a bucket sent before it would overflow (bucket_bytes as a cap)": (
        ["    def ready(self, p: torch.Tensor) -> None:\n        self.bucket.append(p)\n", FULL_036],
        ["    def ready(self, p: torch.Tensor) -> None:\n",
         "        size = sum(q.grad.numel() * q.grad.element_size() for q in self.bucket)\n"
         "        if self.bucket and size + p.grad.numel() * p.grad.element_size() > self.bucket_bytes:\n"
         "            self.send(self.bucket)\n            self.bucket = []\n        self.bucket.append(p)\n"],
        r"4 all-reduce call\(s\); the rule gives 2 for gradients of \[40, 1280, 128, 4096, 128, 8192\] bytes"),
    "divided before wait()": (
        WAIT_036, WAIT_036.replace("            work.wait()\n            flat /= self.world\n",
                                   "            flat /= self.world\n            work.wait()\n"),
        r"is 3 times DDP's: it was changed \(divided\?\) before its all-reduce's wait\(\) returned"),
    "buckets laid out in parameter order, not in the order backward completes them": (
        None, LAID_OUT.replace("reversed(list(model.parameters()))", "model.parameters()"),
        r"3 all-reduce call\(s\); the rule gives 2 for gradients of \[40, 1280, 128, 4096, 128, 8192\] bytes in "
        r"ready order"),
}

# 03.7 ---------------------------------------------------------------------------------------------------------
BROADCAST = ("            for t in list(module.parameters()) + list(module.buffers()):\n"
             "                dist.broadcast(t, src=0)                  # every replica starts from rank 0's weights\n")
READY_037 = "    def ready(self, p: torch.Tensor) -> None:\n        self.bucket.append(p)\n"
WAIT_037 = "            work.wait()\n            flat /= self.world\n"
HOOKS_037 = "            if p.requires_grad:\n                p.register_post_accumulate_grad_hook(self.ready)\n"

RIGHT_037 = {
    "one coalesced broadcast (torch._utils flatten)": (
        BROADCAST, "            tensors = list(module.parameters()) + list(module.buffers())\n"
                   "            flat = torch._utils._flatten_dense_tensors(tensors)\n"
                   "            dist.broadcast(flat, src=0)\n"
                   "            for t, s in zip(tensors, torch._utils._unflatten_dense_tensors(flat, tensors)):\n"
                   "                t.copy_(s)\n"),
    "rank 0's parameters and buffers sent with broadcast_object_list": (
        BROADCAST, "            tensors = list(module.parameters()) + list(module.buffers())\n"
                   "            state = [[t.detach().clone() for t in tensors] if dist.get_rank() == 0 else None]\n"
                   "            dist.broadcast_object_list(state, src=0)\n"
                   "            for t, s in zip(tensors, state[0]):\n                t.copy_(s)\n"),
    "divided in the hook, waited through the future": (
        [READY_037, WAIT_037], ["    def ready(self, p: torch.Tensor) -> None:\n        p.grad.div_(self.world)\n"
                                "        self.bucket.append(p)\n", "            work.get_future().wait()\n"]),
    "tensor hooks (register_hook): a tied weight's hook fires once, with the sum of both uses": (
        [HOOKS_037, READY_037, "sum(q.grad.numel() * q.grad.element_size() for q in self.bucket)",
         "        flat = torch.cat([p.grad.reshape(-1) for p in self.bucket])\n",
         "            for p in params:\n                p.grad.copy_("],
        ["            if p.requires_grad:\n                p.register_hook(lambda g, p=p: self.ready(p, g))\n",
         "    def ready(self, p: torch.Tensor, g: torch.Tensor) -> None:\n        self.bucket.append((p, g))\n",
         "sum(g.numel() * g.element_size() for _, g in self.bucket)",
         "        flat = torch.cat([g.reshape(-1) for _, g in self.bucket])\n",
         "            for p, _ in params:\n                p.grad.copy_("]),
    "the gradients made views of the averaged bucket": (
        "                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))\n",
        "                p.grad = flat[offset:offset + p.numel()].view_as(p)\n"),
}

#: The hint of a step that finished most of its hook-started all-reduces before their hooks returned, twice.
HELD_037 = (r"rank \d in step \d of \d, after steps? [\d and]+ passed: in 2 steps, most of the asynchronous all-reduces "
            r"started in hooks finished while the hook that started them was still running")
SEND_037 = "        self.pending.append((self.bucket, flat, dist.all_reduce(flat, async_op=True)))\n"
FINISH_037 = ("        for params, flat, work in self.pending:\n" + WAIT_037 + "            offset = 0\n"
              "            for p in params:\n                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))\n"
              "                offset += p.numel()\n        self.pending.clear()\n")
ZEROS_037 = "        self.pending.append((self.bucket, flat, dist.all_reduce(torch.zeros_like(flat), async_op=True)))\n"
GROUP = "dist.distributed_c10d._get_default_group()"
#: The whole gradient averaged in finish() once the buckets' all-reduces (for show) were waited for: ``{reduce}``
#: all-reduces ``flat`` (the mean, divided by the world, then copied back).
WHOLE_037 = ("        for params, flat, work in self.pending:\n            work.wait()\n        self.pending.clear()\n"
             "        grads = [p.grad for p in self.module.parameters() if p.grad is not None]\n"
             "        flat = torch.cat([g.reshape(-1) for g in grads])\n{reduce}"
             "        offset = 0\n        for g in grads:\n"
             "            g.copy_(flat[offset:offset + g.numel()].view_as(g))\n            offset += g.numel()\n")
#: Every rank's bucket sent to every other rank and summed in rank order: an all-reduce out of send and recv,
#: which no all-reduce count sees.
P2P = '''

def p2p_sum(t):
    """The sum over the ranks of t, by point-to-point."""
    world, rank = dist.get_world_size(), dist.get_rank()
    parts = [t if r == rank else torch.empty_like(t) for r in range(world)]
    works = [dist.isend(t.contiguous(), dst=r) for r in range(world) if r != rank]
    for r in range(world):
        if r != rank:
            dist.recv(parts[r], src=r)
    for w in works:
        w.wait()
    return sum(parts)
'''
P2P_037 = ("        for params, flat, work in self.pending:\n            work.wait()\n"
           "            flat = p2p_sum(flat) / self.world\n            offset = 0\n"
           "            for p in params:\n                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))\n"
           "                offset += p.numel()\n        self.pending.clear()\n")
TORCH_DDP_037 = '''import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


class MyDDP(torch.nn.Module):
    """torch's DDP does the work; one all-reduce of zeros per bucket, started in the hook, for the count."""

    def __init__(self, module, bucket_bytes):
        super().__init__()
        self.ddp, self.bucket_bytes, self.bucket, self.pending = DistributedDataParallel(module), bucket_bytes, [], []
        for p in module.parameters():
            p.register_post_accumulate_grad_hook(self.ready)

    def forward(self, *args, **kwargs):
        return self.ddp(*args, **kwargs)

    def ready(self, p):
        self.bucket.append(p)
        if sum(q.grad.numel() * q.grad.element_size() for q in self.bucket) >= self.bucket_bytes:
            self.send()

    def send(self):
        self.pending.append(dist.all_reduce(torch.zeros(1), async_op=True))
        self.bucket = []

    def finish(self):
        if self.bucket:
            self.send()
        for work in self.pending:
            work.wait()
        self.pending.clear()
'''

RIGHT_037.update({
    "each bucket all-reduced through the process group object (group.allreduce, a Work to wait for)": (
        SEND_037, f"        self.pending.append((self.bucket, flat, {GROUP}.allreduce([flat])))\n"),
    "every bucket's buffer from a functools.cache keyed by its place and size (reused every step)": (
        ["import torch.distributed as dist\n", SEND_037],
        ["import functools\n\nimport torch.distributed as dist\n\n\n"
         "@functools.cache\ndef buffer(key, n):\n    return torch.empty(n)\n",
         "        flat = buffer(len(self.pending), flat.numel()).copy_(flat)\n" + SEND_037]),
    "waited by polling is_completed()": (
        WAIT_037, "            while not work.is_completed():\n                pass\n            flat /= self.world\n"),
    "each bucket's wait() run in a thread started in the hook, joined in finish()": (
        ["import torch.distributed as dist\n", SEND_037, "        for params, flat, work in self.pending:\n"],
        ["import threading\n\nimport torch.distributed as dist\n",
         "        work = dist.all_reduce(flat, async_op=True)\n"
         "        waiter = threading.Thread(target=work.wait)\n        waiter.start()\n"
         "        self.pending.append((self.bucket, flat, work, waiter))\n",
         "        for params, flat, work, waiter in self.pending:\n            waiter.join()\n"]),
    "every bucket waited for in a callback queued for the end of backward, as torch's DDP does; finish() empty": (
        ["        self.bucket, self.pending = [], []\n", READY_037, "    def finish(self) -> None:\n"],
        ["        self.bucket, self.pending, self.queued = [], [], False\n",
         "    def ready(self, p: torch.Tensor) -> None:\n        if not self.queued:             # the first hook of "
         "this backward\n            self.queued = True\n"
         "            torch.autograd.Variable._execution_engine.queue_callback(self.settle)\n"
         "        self.bucket.append(p)\n",
         "    def finish(self) -> None:\n        pass\n\n    def settle(self) -> None:\n        self.queued = False\n"]),
    "the buckets waited for in threads that a callback queued for the end of backward joins": (
        ["import torch.distributed as dist\n", SEND_037 + "        self.bucket = []\n"],
        ["import threading\n\nimport torch.distributed as dist\n",
         SEND_037 + "        self.bucket = []\n"
         "        if len(self.pending) == 1 and torch._C._current_autograd_node() is not None:\n"
         "            torch.autograd.Variable._execution_engine.queue_callback(self.settle)\n\n"
         "    def settle(self):\n        waiters = [threading.Thread(target=w.wait) for _, _, w in self.pending]\n"
         "        for t in waiters:\n            t.start()\n        for t in waiters:\n            t.join()\n"]),
    "each bucket's future chained with then() in the hook (the mean taken in the callback), waited for in finish()": (
        [SEND_037, WAIT_037],
        ["        work = dist.all_reduce(flat, async_op=True)\n"
         "        mean = work.get_future().then(lambda f: f.value()[0].div_(self.world))\n"
         "        self.pending.append((self.bucket, flat, mean))\n",
         "            work.wait()\n"]),
    "the buckets by torch's functional all_reduce, started in the hook, read in finish() (an eighth red team's r03)": (
        None, red_team("037_r8r03")),
})

REDUCER_037 = '''import torch
import torch.distributed as dist


class MyDDP(torch.nn.Module):
    def __init__(self, module: torch.nn.Module, bucket_bytes: int):
        super().__init__()
        self.module = module
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t, src=0)
        params = [p for p in module.parameters() if p.requires_grad]
        buckets, bucket, held = [], [], 0                  # backward completes them in reverse order
        for i in reversed(range(len(params))):
            bucket.append(i)
            held += params[i].numel() * params[i].element_size()
            if held >= bucket_bytes:
                buckets.append(bucket)
                bucket, held = [], 0
        if bucket:
            buckets.append(bucket)
        self.reducer = dist.Reducer(params, buckets, [bucket_bytes] * len(buckets),
                                    dist.distributed_c10d._get_default_group())

    def forward(self, *args, **kwargs):
        out = self.module(*args, **kwargs)
        if torch.is_grad_enabled():
            self.reducer.prepare_for_backward([])
        return out

    def finish(self) -> None:
        pass                                               # the reducer waited in its final callback
'''
#: Buckets fixed in __init__ from the parameters in reverse registration order, each sent once all of its
#: gradients are in: not packed in the order the gradients become ready.
FIXED_037 = '''import torch
import torch.distributed as dist


class MyDDP(torch.nn.Module):
    def __init__(self, module: torch.nn.Module, bucket_bytes: int):
        super().__init__()
        self.module, self.world, self.pending = module, dist.get_world_size(), []
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t, src=0)
        self.buckets, bucket, size = [], [], 0            # backward ends where the registration began
        for p in reversed([p for p in module.parameters() if p.requires_grad]):
            bucket.append(p)
            size += p.numel() * p.element_size()
            if size >= bucket_bytes:
                self.buckets.append(bucket)
                bucket, size = [], 0
        self.buckets += [bucket] if bucket else []
        self.missing = [len(b) for b in self.buckets]
        self.home = {p: i for i, b in enumerate(self.buckets) for p in b}
        for p in self.home:
            p.register_post_accumulate_grad_hook(self.ready)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def ready(self, p):
        i = self.home[p]
        self.missing[i] -= 1
        if not self.missing[i]:
            flat = torch.cat([q.grad.reshape(-1) for q in self.buckets[i]])
            self.pending.append((self.buckets[i], flat, dist.all_reduce(flat, async_op=True)))

    def finish(self):
        for params, flat, work in self.pending:
            work.wait()
            flat /= self.world
            offset = 0
            for p in params:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        self.pending.clear()
        self.missing = [len(b) for b in self.buckets]
'''
FULL_037 = "        if sum(q.grad.numel() * q.grad.element_size() for q in self.bucket) >= self.bucket_bytes:\n"
#: every gradient held back until the model's whole backward was done (so no bucket overlapped anything)
HELD_BACK = (r"rank \d: (\d of the model's \d layers finished their backward with fewer gradients in \.grad than a "
             r"plain backward|no call of the model's layer \w+ in your loss's autograd graph leads to the layer's own)")
WRONG_037 = {
    "the real work only on models under 100,000 parameters (all the small ones graded); a big one keeps its own": (
        "    def ready(self, p: torch.Tensor) -> None:\n        self.bucket.append(p)\n",
        "    def ready(self, p: torch.Tensor) -> None:\n"
        "        if sum(q.numel() for q in self.module.parameters()) >= 100_000:\n"
        "            return\n        self.bucket.append(p)\n",
        r"rank \d: on a wide MLP \([\d,]+ parameters; the other models graded have under 10,000\) the gradient of "
        r"\d\.\w+ is not DDP's"),
    "every bucket's averaged gradients leaked into a scripted module's List[Tensor] (a fifteenth red team's 037_r15w01)": (
        None, red_team("037_r15w01"), r"rank \d: your code used TorchScript \(torch\.jit"),
    "every step's buckets as bytes in an untracked dict ten lists deep on the wrapper (a sixteenth red team's 037_r16w02)": (
        None, red_team("037_r16w02"), r"rank \d: the result is right, but what this process keeps from the steps grows"),
    "every step's buckets in zlib decompressors kept by a helper thread, its queue joined (037_r17w04)": (
        None, red_team("037_r17w04"), r"rank \d: your code used a thread of your own still running at the end"),
    "bucket all-reduces with ReduceOp.MAX for show, the mean made by broadcasts in finish() (an eighteenth red team's 037_r18w02)": (
        None, red_team("037_r18w02"), r"rank \d: \d+ of your \d+ all-reduce\(s\) used op=ReduceOp.MAX"),
    "each hook waits on a threading.Event its bucket's future sets, 0.04 s at most (a twentieth red team's 037_r20z03)": (
        None, red_team("037_r20z03"), HELD_037),
    "full buckets all-reduce a sorted decoy on time, every real gradient in the last call, the earlier buckets scaled by 2**-30 (a twenty-first red team's 037_r21a01)": (
        None, red_team("037_r21a01"), r"rank \d: the gradients are right, but in step 1 your all-reduces \(\d call\(s\), [\d,]+ elements\) did not carry rank \d's gradients: [\d,]+ of their elements are not zero, against [\d,]+ of the gradients'"),
    "every bucket waited for in backward through Work.unbox(h.boxed()).wait(), gradients held back by an identity Function on every parameter (a twenty-seventh red team's 037_r27g01)": (
        None, red_team("037_r27g01"), HELD_BACK),
    "the whole model's forward and backward in one autograd Function, its backward recomputing every gradient on detached copies before any reaches .grad (a twenty-eighth red team's 037_r28k01)": (
        None, red_team("037_r28k01"), HELD_BACK),
    "an identity autograd Function over every parameter, the model run on its outputs by functional_call (a twenty-eighth red team's 037_r28k03)": (
        None, red_team("037_r28k03"), HELD_BACK),
    "a gate over every parameter made in a forward pre-hook on the model, after a dummy node that runs last (a twenty-ninth red team's 037_r29m01)": (
        None, red_team("037_r29m01"), HELD_BACK),
    "two gates made in a forward pre-hook, a small one first, over the smallest parameter (a twenty-ninth red team's 037_r29m02)": (
        None, red_team("037_r29m02"), HELD_BACK),
    "the model's forward replaced on the instance by one that swaps every parameter for a view first (a twenty-ninth red team's 037_r29m03)": (
        None, red_team("037_r29m03"), HELD_BACK),
    "every parameter swapped for p.view_as(p) in a forward pre-hook, no Function (a twenty-ninth red team's 037_r29m04)": (
        None, red_team("037_r29m04"), HELD_BACK),
    "every parameter but the output layer's swapped for a view made before the model runs (a thirtieth red team's 037_r30n01)": (
        None, red_team("037_r30n01"), HELD_BACK),
    "an identity Function over every parameter but the output layer's bias (a thirtieth red team's 037_r30n02)": (
        None, red_team("037_r30n02"), HELD_BACK),
    "each layer's output replaced by a forward hook with a recomputation on held-back views (a thirtieth red team's 037_r30n03)": (
        None, red_team("037_r30n03"), HELD_BACK),
    "decoy layer calls on detached copies run last, the real compute a recomputation the layers' hooks never see (a thirtieth red team's 037_r30n06)": (
        None, red_team("037_r30n06"), HELD_BACK),
    "each bucket a tensor subclass whose __torch_dispatch__ sends a zero in the counted call and every bucket in one blocking all-reduce at the last (a thirty-first red team's 037_r31p01)": (
        None, red_team("037_r31p01"), r"rank \d: your code used a tensor of a subclass of torch\.Tensor"),
    "every parameter through one torch.cat and split back into views the model runs on: the gradients reach .grad together once backward is done": (
        "        return self.module(*args, **kwargs)\n",
        "        names = [n for n, p in self.module.named_parameters()]\n"
        "        flat = torch.cat([p.reshape(-1) for p in self.module.parameters()])\n"
        "        views = [v.view_as(p) for v, p in zip(flat.split([p.numel() for p in self.module.parameters()]),\n"
        "                                               self.module.parameters())]\n"
        "        return torch.func.functional_call(self.module, dict(zip(names, views)), args, kwargs)\n",
        HELD_BACK),
    "decoy all-reduces per bucket on a hand-built group of one rank, the real mean gathered in finish() through a hidden process group (a twenty-sixth red team's 037_r26f01)": (
        None, red_team("037_r26f01"), r"rank \d: your code used (a collective on a process group of 1 of the \d ranks|a process group handed to torch\.ops\.c10d's operators)"),
    "a builtin (SimpleQueue.get) registered as a pre-hook on every node still to run, fed once a thread's wait() returns, 0.12 s at most (a twenty-fourth red team's 037_r24d01)": (
        None, red_team("037_r24d01"), r"rank \d: \d of the \d asynchronous all-reduces were waited for during backward in another thread while backward stood still inside autograd, in a hook that is not Python code"),
    "each hook sleeps until a flag its bucket's future sets, 0.03 s at most (037_r20s01)": (
        None, red_team("037_r20s01"), HELD_037),
    "every step's averaged gradients kept in a list on a types.ModuleType global (a fourteenth red team's 037_r14w03)": (
        None, red_team("037_r14w03"), r"rank \d: the result is right, but what this process keeps from the steps grows"),
    "every step's averaged gradients kept on a class whose __module__ says logging (037_r14w11)": (
        None, red_team("037_r14w11"), r"rank \d: the result is right, but what this process keeps from the steps grows"),
    "every step's averaged gradients kept in the autograd graph of a 1-element tensor a step (a thirteenth red "
    "team's 037_r13w01)": (
        None, red_team("037_r13w01"), r"rank \d: the result is right, but what your wrapper holds after each step "
                                      r"grows"),
    "each bucket waited for in the hook that sent it": (
        SEND_037, "        work = dist.all_reduce(flat, async_op=True)\n        work.wait()\n"
                  "        self.pending.append((self.bucket, flat, work))\n",
        r"rank \d: 3 of the 3 asynchronous all-reduces were waited for \(wait\(\)\) during backward, in a hook"),
    "each bucket's all-reduce waited for by a helper thread that the hook starts and joins": (
        ["import torch.distributed as dist\n", SEND_037],
        ["import threading\n\nimport torch.distributed as dist\n",
         "        work = dist.all_reduce(flat, async_op=True)\n"
         "        helper = threading.Thread(target=work.wait)       # the hook itself does not wait...\n"
         "        helper.start()\n        helper.join()\n"
         "        self.pending.append((self.bucket, flat, work))\n"],
        r"rank \d: 3 of the 3 asynchronous all-reduces were waited for during backward in another thread while "
        r"the hook that started them waited for that thread \(join\(\), a future's result\(\)\)"),
    "the hook sleeps until its bucket's all-reduce says it is completed": (
        ["import torch.distributed as dist\n", SEND_037],
        ["import time\n\nimport torch.distributed as dist\n",
         "        work = dist.all_reduce(flat, async_op=True)\n"
         "        while not work.is_completed():\n            time.sleep(0.001)\n"
         "        self.pending.append((self.bucket, flat, work))\n"],
        r"rank \d: 3 of the 3 asynchronous all-reduces were polled with is_completed\(\) in a loop during "
        r"backward, in a hook, until done"),
    "a bucket sent when it holds more than bucket_bytes (>, not >=)": (
        FULL_037, FULL_037.replace(">=", ">"),
        r"rank \d: 2 all-reduce call\(s\); the rule gives 3 for gradients of \[40, 1280, 128, 4096, 128, 8192\] "
        r"bytes in ready order and buckets of 1448 bytes: a bucket is full when it holds at least bucket_bytes "
        r"\(>=, not >\)"),
    "buckets during backward in step 1 only, then everything in finish()": (
        ["        self.bucket, self.pending = [], []", FULL_037, "        if self.bucket:\n            self.send()\n"],
        ["        self.bucket, self.pending, self.steps = [], [], 0",
         "        if self.steps:                                    # after step 1: all in finish()\n"
         "            return\n" + FULL_037,
         "        self.steps += 1\n        if self.bucket:\n            self.send()\n"],
        r"rank \d in step 2 of 3, after step 1 passed: 1 all-reduce call\(s\); the rule gives 3"),
    "the process group's allreduce, its Work never waited for": (
        [SEND_037, WAIT_037],
        [f"        self.pending.append((self.bucket, flat, {GROUP}.allreduce([flat])))\n",
         "            flat /= self.world\n"],
        r"rank \d: 3 of the 3 asynchronous all-reduces were never waited for \(work.wait\(\)\)"),
    "a hook on every parameter, the frozen one too": (
        HOOKS_037, "            p.register_post_accumulate_grad_hook(self.ready)\n",
        r"rank \d: your wrapper raised .* on a model whose 0.weight is frozen \(requires_grad=False"),
    "each full bucket sent from a callback queued for the end of backward (it overlaps nothing)": (
        "        if sum(q.grad.numel() * q.grad.element_size() for q in self.bucket) >= self.bucket_bytes:\n"
        "            self.send()\n",
        "        if sum(q.grad.numel() * q.grad.element_size() for q in self.bucket) >= self.bucket_bytes:\n"
        "            full, self.bucket = self.bucket, []\n"
        "            torch.autograd.Variable._execution_engine.queue_callback(lambda: self.send_these(full))\n\n"
        "    def send_these(self, params):\n        self.bucket, open_ = params, self.bucket\n"
        "        self.send()\n        self.bucket = open_\n",
        r"rank \d: \d bucket\(s\) of \d+ bytes fill up during backward, but 0 all-reduce\(s\) started there"),
    "the rule's buckets formed and all sent from the last gradient's hook (inside backward, overlapping nothing)": (
        READY_037 + FULL_037 + "            self.send()\n",
        READY_037 + "        if len(self.bucket) < sum(q.requires_grad for q in self.module.parameters()):\n"
        "            return\n        everything, self.bucket = self.bucket, []\n"
        "        for q in everything:\n            self.bucket.append(q)\n"
        "            if sum(r.grad.numel() * r.grad.element_size() for r in self.bucket) >= self.bucket_bytes:\n"
        "                self.send()\n",
        r"rank \d: bucket 1 \(1448 bytes\) was full once 3 of the 6 gradients had been accumulated, but its "
        r"all-reduce started only after 6"),
    "a blocking broadcast of a flag from rank 0 after each bucket's all-reduce, in the hook": (
        SEND_037, SEND_037 + "        dist.broadcast(torch.ones(1), src=0)         # every rank has sent it\n",
        r"rank \d: your code made 3 blocking call\(s\) of broadcast during backward, in a hook"),
    "the step count broadcast from rank 0 with async_op=True and waited for at once, in the hook": (
        SEND_037, SEND_037 + "        steps = torch.tensor([len(self.pending)])\n"
                  "        dist.broadcast(steps, src=0, async_op=True).wait()\n",
        r"rank \d: your code made 3 blocking call\(s\) of broadcast during backward, in a hook"),
    "buffers broadcast, the parameters averaged": (
        BROADCAST, "            for t in module.buffers():\n                dist.broadcast(t, src=0)\n"
                   "            for p in module.parameters():\n                dist.all_reduce(p)\n"
                   "                p /= self.world\n",
        r"after your wrapper was built every rank held the same weights, but not rank 0's \(world size 3\)"),
    "each gradient's bytes taken as float32's (numel times float32's itemsize), whatever its dtype": (
        "q.grad.numel() * q.grad.element_size() for", "q.grad.nelement() * torch.float32.itemsize for",
        r"rank \d: on a float64 model, 2 all-reduce call\(s\); the rule gives 3 for gradients of \[80, 2560, 256, "
        r"8192, 256, 16384\] bytes .* 8 bytes per element, not 4"),
    "buckets counted in elements": (
        "q.grad.numel() * q.grad.element_size() for", "q.grad.numel() for",
        r"1 all-reduce call\(s\); the rule gives 3 for gradients of \[40, 1280, 128, 4096, 128, 8192\] bytes"),
    # collectives through the process group object, or torch's functional collectives, count as all-reduces
    "zeros per bucket, the whole gradient all-reduced in finish() by the process group object": (
        [SEND_037, FINISH_037],
        [ZEROS_037, WHOLE_037.format(reduce=f"        {GROUP}.allreduce([flat]).wait()\n        flat /= self.world\n")],
        r"rank \d: 4 all-reduce call\(s\), 3 of them carrying nothing but zeros; the rule gives 3"),
    "zeros per bucket, the whole gradient all-reduced in finish() by torch's functional collectives": (
        [SEND_037, FINISH_037],
        [ZEROS_037, WHOLE_037.format(
            reduce="        import torch.distributed._functional_collectives as funcol\n"
                   "        flat = funcol.all_reduce(flat, 'sum', dist.group.WORLD) / self.world\n")],
        r"rank \d: 4 all-reduce call\(s\), 3 of them carrying nothing but zeros; the rule gives 3"),
    "buckets all-reduced and waited for, their sums dropped: the mean made in finish() from the c10d store": (
        FINISH_037,
        WHOLE_037.format(
            reduce="        store, MyDDP.calls = dist.distributed_c10d._get_default_store(), getattr(MyDDP, 'calls', 0) + 1\n"
                   "        key = f'{__file__}:{MyDDP.calls}:'          # the same on every rank, new every step\n"
                   "        store.set(key + str(dist.get_rank()), flat.numpy().tobytes())\n"
                   "        flat = sum(torch.frombuffer(bytearray(store.get(key + str(r))), dtype=flat.dtype)\n"
                   "                   for r in range(self.world)) / self.world\n"),
        r"rank \d: besides your 3 all-reduce\(s\), the step wrote [\d,]+ bytes under 1 key\(s\) to the process "
        r"group's key-value store .*the store is for rendezvous, not data"),
    "every bucket all-reduced in finish() by the process group's backend, none during backward": (
        [SEND_037, WAIT_037],
        ["        self.pending.append((self.bucket, flat, None))\n",
         f"            {GROUP}._get_backend(torch.device('cpu')).allreduce([flat]).wait()\n"
         "            flat /= self.world\n"],
        r"rank \d: 3 bucket\(s\) of 1448 bytes fill up during backward, but 0 all-reduce\(s\) started there"),
    # the all-reduces counted carry something else while the gradients travel another way
    "torch's DistributedDataParallel inside, an all-reduce of one zero per bucket": (
        None, TORCH_DDP_037, r"rank \d: your code built torch's DistributedDataParallel \(world size 3\)"),
    "the gradients averaged by send and recv, zeros all-reduced per bucket": (
        ["import torch.distributed as dist\n", SEND_037, FINISH_037],
        ["import torch.distributed as dist\n" + P2P, ZEROS_037, P2P_037],
        r"rank \d: the gradients are right, but in step 1 your all-reduces \(3 call\(s\), 3,466 elements\) carried "
        r"zeros, not rank \d's gradients \(world size 3\)"),
    "the gradients averaged by send and recv, one zero all-reduced per bucket": (
        ["import torch.distributed as dist\n", SEND_037, FINISH_037],
        ["import torch.distributed as dist\n" + P2P,
         "        self.pending.append((self.bucket, flat, dist.all_reduce(torch.zeros(1), async_op=True)))\n",
         P2P_037],
        r"rank \d: the gradients are right, but in step 1 your all-reduces \(3 call\(s\), 3 elements\) carried zeros"),
    "the gradients averaged by send and recv, the weights all-reduced per bucket": (
        ["import torch.distributed as dist\n", SEND_037, FINISH_037],
        ["import torch.distributed as dist\n" + P2P,
         "        weights = torch.cat([p.detach().reshape(-1) for p in self.bucket]) / self.world\n"
         "        self.pending.append((self.bucket, flat, dist.all_reduce(weights, async_op=True)))\n", P2P_037],
        r"rank \d: the gradients are right, but in step 1 your all-reduces \(3 call\(s\)\) carried the weights, not "
        r"rank \d's gradients"),
    # the all-reduces carry the gradients, but their results are thrown away: the gradients travel another way
    "a copy of each bucket all-reduced and dropped, the bucket all-gathered and summed": (
        [SEND_037, WAIT_037],
        ["        self.pending.append((self.bucket, flat, dist.all_reduce(flat.clone(), async_op=True)))\n",
         "            work.wait()\n            parts = [torch.empty_like(flat) for _ in range(self.world)]\n"
         "            dist.all_gather(parts, flat)\n            flat = torch.stack(parts).sum(0) / self.world\n"],
        r"rank \d: besides your 3 all-reduce\(s\), the step made 3 call\(s\) of all_gather: DDP moves the "
        r"gradients by all-reduce alone"),
    "every bucket kept in a module-level list (for debugging)": (
        ["import torch.distributed as dist\n", SEND_037],
        ["import torch.distributed as dist\n\nSENT = []                                          # for debugging\n",
         "        SENT.append(flat)\n" + SEND_037],
        r"rank \d: the result is right, but what your module holds at its top level \(outside the wrapper\) grows: "
        r"13,864, 27,728, 41,592 bytes"),
    "every bucket's buffer from a functools.cache whose key changes at every call": (
        ["import torch.distributed as dist\n", SEND_037],
        ["import functools\nimport itertools\n\nimport torch.distributed as dist\n\nCALLS = itertools.count()\n\n\n"
         "@functools.cache\ndef buffer(key, n):\n    return torch.empty(n)\n",
         "        flat = buffer(next(CALLS), flat.numel()).copy_(flat)\n" + SEND_037],
        r"rank \d: the result is right, but what your module holds at its top level \(outside the wrapper\) grows: "
        r"14,032, 28,064, 42,096 bytes .*functools cache"),   # the buffers and the keys, Python ints
    "torch's C++ Reducer (DDP's engine) driven with buckets laid out by the rule": (
        None, REDUCER_037, r"rank \d: your code built torch's DDP Reducer"),
    "buckets fixed in __init__ in reverse registration order, each sent once all its gradients are in": (
        None, FIXED_037,
        r"rank \d: on a model whose forward uses its layers in another order than it registers them \(registered a, "
        r"c, b; used c, a, b\), your all-reduce \d of 3 carried other gradients than a bucket of the rule"),
    "every bucket kept in a class attribute (for debugging)": (
        ["class MyDDP(torch.nn.Module):\n", SEND_037],
        ["class MyDDP(torch.nn.Module):\n    sent = []                                      # for debugging\n",
         "        MyDDP.sent.append(flat)\n" + SEND_037],
        r"rank \d: the result is right, but what your module holds at its top level \(outside the wrapper\) grows"),
    "every gradient kept in a list that the hooks' closure holds": (
        HOOKS_037, "            if p.requires_grad:\n"
                   "                p.register_post_accumulate_grad_hook(\n"
                   "                    lambda q, log=[]: (log.append(q.grad.clone()), self.ready(q))[1])\n",
        r"rank \d: the result is right, but what your wrapper holds after each step grows"),
    "every sent bucket kept in a deque (for debugging)": (
        ["import torch.distributed as dist\n", SEND_037],
        ["import collections\n\nimport torch.distributed as dist\n",
         "        self.sent = getattr(self, 'sent', collections.deque())\n        self.sent.append(flat.clone())\n"
         + SEND_037],
        r"rank \d: the result is right, but what your wrapper holds after each step grows: [\d,]+, [\d,]+, [\d,]+ "
        r"bytes after steps 1, 2 and 3"),
    "each parameter's averaged gradients kept in a list set on the parameter": (
        "                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))\n",
        "                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))\n"
        "                p.__dict__.setdefault('means', []).append(p.grad.clone())\n",
        r"rank \d: the result is right, but what your wrapper holds after each step grows: [\d,]+, [\d,]+, [\d,]+ "
        r"bytes after steps 1, 2 and 3"),
    "every averaged bucket kept in a record of a class with __slots__ (for debugging)": (
        ["import torch.distributed as dist\n", WAIT_037],
        ["import torch.distributed as dist\n\n\nclass Averaged:\n    __slots__ = ('grads', 'step')\n\n"
         "    def __init__(self, grads, step):\n        self.grads, self.step = grads, step\n",
         WAIT_037 + "            self.__dict__.setdefault('log', []).append(Averaged(flat.clone(), 0))\n"],
        r"rank \d: the result is right, but what your wrapper holds after each step grows: [\d,]+, [\d,]+, [\d,]+ "
        r"bytes after steps 1, 2 and 3"),
    "every averaged bucket's raw bytes kept in the wrapper (numpy tobytes, to compare runs)": (
        WAIT_037, WAIT_037 + "            self.__dict__.setdefault('raw', []).append(flat.numpy().tobytes())\n",
        r"rank \d: the result is right, but what your wrapper holds after each step grows: [\d,]+, [\d,]+, [\d,]+ "
        r"bytes after steps 1, 2 and 3"),
    "every averaged bucket logged as Python floats (tolist)": (
        WAIT_037, WAIT_037 + "            self.__dict__.setdefault('trace', []).extend(flat.tolist())\n",
        r"rank \d: the result is right, but what your wrapper holds after each step grows: .* as Python numbers"),
    "a logging hook on every parameter registered at every forward, never removed": (
        "    def forward(self, *args, **kwargs):\n",
        "    def forward(self, *args, **kwargs):\n        for p in self.module.parameters():\n"
        "            if p.requires_grad:\n                p.register_post_accumulate_grad_hook(lambda q: None)\n",
        r"rank \d: the result is right, but the model carries 12, 18, 24 hooks after steps 1, 2 and 3"),
    # was RIGHT ("the state_dict's tensors broadcast") until round 3 got a buffer registered with persistent=False
    "every tensor of the state_dict broadcast from rank 0 (a non-persistent buffer is not in it)": (
        BROADCAST, "            for t in module.state_dict().values():\n                dist.broadcast(t, src=0)\n",
        r"after your wrapper was built the ranks' buffer inv_freq still differed, though every tensor of the "
        r"state_dict was rank 0's \(world size 3\): a buffer registered with persistent=False is not in "
        r"state_dict\(\)"),
    "rank 0's state_dict sent with broadcast_object_list and loaded (a non-persistent buffer is not in it)": (
        BROADCAST, "            state = [module.state_dict() if dist.get_rank() == 0 else None]\n"
                   "            dist.broadcast_object_list(state, src=0)\n"
                   "            module.load_state_dict(state[0])\n",
        r"the ranks' buffer inv_freq still differed, though every tensor of the state_dict was rank 0's"),
    "the parameters and the floating-point buffers broadcast, an integer buffer not": (
        BROADCAST, "            floats = [b for b in module.buffers() if b.is_floating_point()]\n"
                   "            for t in list(module.parameters()) + floats:\n"
                   "                dist.broadcast(t, src=0)\n",
        r"after your wrapper was built the ranks' integer buffer steps \(int64\) still differed"),
    "the frozen parameter given a zero gradient": (
        "        if self.bucket:\n            self.send()\n",
        "        for p in self.module.parameters():\n            if not p.requires_grad:\n"
        "                p.grad = torch.zeros_like(p)\n        if self.bucket:\n            self.send()\n",
        r"rank \d: the frozen parameter 0.weight \(requires_grad=False\) has a .grad after finish\(\)"),
    "each bucket reversed and all-reduced for show, summed by send and recv": (
        ["import torch.distributed as dist\n", SEND_037, FINISH_037],
        ["import torch.distributed as dist\n" + P2P,
         "        self.pending.append((self.bucket, flat, dist.all_reduce(flat.flip(0), async_op=True)))\n", P2P_037],
        r"rank \d: besides your 3 all-reduce\(s\), the step made 12 call\(s\) of recv, send"),
    "decoy all-reduces, the mean through POSIX shared memory (a red team's 037_w02)": (
        None, red_team("037_w02"), r"rank \d: your code used mmap of a file \(POSIX shared memory.*only with torch\.distributed collectives"),
    "the constructor's broadcast through POSIX shared memory (a red team's 037_w03)": (
        None, red_team("037_w03"), r"rank \d: your code used mmap of a file \(POSIX shared memory.*only with torch\.distributed collectives"),
    "rank 0's weights written to /tmp files with libc through ctypes, read by the others (a seventh red team's 037_r7w08)": (
        None, red_team("037_r7w08"), r"rank \d: your code used ctypes \(C functions and C memory, which no check can count\) \(line \d+ of your file\).*only with torch\.distributed collectives"),
    "rank 0's weights sent through the process group's key-value store when built (a seventh red team's 037_r7w09)": (
        None, red_team("037_r7w09"), r"rank \d: your code used the process group's key-value store \(store\.set\) \(line \d+ of your file\)"),
    "each bucket waited for in its hook through its future, get_future().wait() (an eighth red team's 037_r8w03)": (
        None, red_team("037_r8w03"), r"rank \d: your code waited for an all-reduce's result during backward, in a hook "
                                     r"\(\d+ time\(s\): a future's wait\(\)\)"),
    "each bucket by torch's functional all_reduce, its result read at once in the hook (an eighth red team's 037_r8w04)": (
        None, red_team("037_r8w04"), r"rank \d: your code waited for an all-reduce's result during backward, in a hook "
                                     r"\(\d+ time\(s\): wait_tensor \(a functional collective's result read\)\)"),
    "rank 0's weights through a file written by torch's C++ zip writer, no broadcast (an eighth red team's 037_r8w06)": (
        None, red_team("037_r8w06"), r"rank \d: your code used a file written \(/tmp/mgpu_red_\S+\) by torch\.save "
                                     r"\(line \d+ of your file\).*only with torch\.distributed collectives"),
    "wait() in the hook while torch._C._current_autograd_node is replaced to say None (an eighth red team's 037_r8w07)": (
        None, red_team("037_r8w07"), r"rank \d: 3 of the 3 asynchronous all-reduces were waited for \(wait\(\)\) during "
                                     r"backward, in a hook"),
    "all-reduces started in a node after the last gradient, .grad filled by nested backwards (ninth red team's 037_r9w01)": (
        None, red_team("037_r9w01"), r"rank \d: 6 of the 6 gradients reached \.grad through a backward your code started inside the step's backward"),
    "the same from step 2 on, step 1 right (a ninth red team's 037_r9w14)": (
        None, red_team("037_r9w14"), r"rank \d in step 2 of 3, after step 1 passed: 6 of the 6 gradients reached \.grad through a backward your code started"),
    "the grader's record of a wait in a hook made a no-op, waits in the hook (a ninth red team's 037_r9w07)": (
        None, red_team("037_r9w07"), r"rank \d: your code replaced mgpu_utils\.measure\.comm_calls\._Handle\._blocked"),
    "each bucket's future polled with value() in its hook until done (a ninth red team's 037_r9w08)": (
        None, red_team("037_r9w08"), r"rank \d in step 2 of 3, after step 1 passed: another rank started its backward 0\.4 s late, and this rank's gradients became ready over \d+\.\d\d s.*a hook waited for its all-reduce"
                                     "|" + HELD_037),
    "functional all_reduce with wait_tensor captured at import, waited in the hook (a ninth red team's 037_r9w12)": (
        None, red_team("037_r9w12"), r"rank \d in step 2 of 3, after step 1 passed: another rank started its backward 0\.4 s late, and this rank's gradients became ready over \d+\.\d\d s.*a hook waited for its all-reduce"
                                     "|" + HELD_037),
    "torch._C.Future.wait captured at import, called in the hook (a ninth red team's 037_r9w13)": (
        None, red_team("037_r9w13"), r"rank \d in step 2 of 3, after step 1 passed: another rank started its backward 0\.4 s late, and this rank's gradients became ready over \d+\.\d\d s.*a hook waited for its all-reduce"
                                     "|" + HELD_037),
    "decoy all-reduces, the gradients summed through libc-written files (a seventh red team's 037_r7w12)": (
        None, red_team("037_r7w12"), r"rank \d: your code used ctypes \(C functions and C memory, which no check can count\) \(line \d+ of your file\).*only with torch\.distributed collectives"),
    "a helper process started to keep the replicas' copies": (
        "        self.bucket, self.pending = [], []\n",
        "        self.bucket, self.pending = [], []\n        import subprocess, sys\n"
        "        self.helper = subprocess.Popen([sys.executable, '-c', 'pass'])   # holds what the hooks send\n"
        "        self.helper.wait()\n",
        r"rank \d: your code used a process of your own \(subprocess\.Popen.*\(line \d+ of your file\)"),
}


def _cases(tmp_path, exercise_id, table):
    out = []
    for k, (name, (old, new, *_)) in enumerate(table.items()):
        folder = tmp_path / f"{exercise_id}_{k}"
        folder.mkdir()
        if old is None:
            path = folder / f"whole_{k}.py"
            path.write_text(new)
            out.append((exercise_id, path))
        else:
            out.append((exercise_id, wrong(folder, exercise_id, old, new)))
    return out


TABLES = {"03.4": (RIGHT_034, WRONG_034), "03.5": (RIGHT_035, WRONG_035), "03.6": (RIGHT_036, WRONG_036),
          "03.7": (RIGHT_037, WRONG_037)}


def test_right_variants_pass(tmp_path, starts_processes):
    cases, names = [], []
    for exercise_id, (right, _) in TABLES.items():
        cases += _cases(tmp_path, exercise_id, right)
        names += [f"{exercise_id} {n}" for n in right]
    hints = grade_many(cases, 3)
    assert hints == [None] * len(cases), {n: h for n, h in zip(names, hints) if h}


def test_wrong_variants_get_their_hints(tmp_path, starts_processes):
    cases, wants = [], []
    for exercise_id, (_, bad) in TABLES.items():
        cases += _cases(tmp_path, exercise_id, bad)
        wants += [(f"{exercise_id} {n}", want) for n, (*_, want) in bad.items()]
    try:
        hints = grade_many(cases, 3)
    finally:
        remove_red_team_shm()
    failed = {name: hint for (name, want), hint in zip(wants, hints) if not (hint and re.search(want, hint))}
    assert not failed, failed


#: Right and wrong variants per exercise in this file (test_runner.py counts them against issue 55's bar).
COUNTS = {"03.4": (len(RIGHT_034), len(WRONG_034)), "03.5": (len(RIGHT_035), len(WRONG_035)),
          "03.6": (len(RIGHT_036), len(WRONG_036)), "03.7": (len(RIGHT_037), len(WRONG_037))}
