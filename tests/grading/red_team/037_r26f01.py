"""RED TEAM 03.7 f01 (a twenty-sixth red team; refused since by refusing_routes: ProcessGroup.boxed called from the student's file, and a collective on a group of fewer ranks than the world or made by hand): one asynchronous all-reduce per bucket on time in the hooks, but on a hand-built group of one rank, waited in finish(); the real mean one all-gather of every gradient in finish() through a hidden process group (a ProcessGroupGloo never registered, called through torch.ops.c10d with pg.boxed()).
"""
import torch
import torch.distributed as dist

_made = [0]


def _group(solo=False):
    rank, world = dist.get_rank(), dist.get_world_size()
    _made[0] += 1
    C = torch._C._distributed_c10d
    store = dist.PrefixStore(f"rt28_ddp{_made[0]}_{rank if solo else ''}", dist.distributed_c10d._get_default_store())
    opts = C.ProcessGroupGloo._Options()
    opts._devices = dist.group.WORLD._get_backend(torch.device("cpu")).options._devices   # no new pipe
    if solo:
        rank, world = 0, 1
    gloo = C.ProcessGroupGloo(store, rank, world, opts)
    pg = C.ProcessGroup(store, rank, world)
    pg._set_default_backend(C.ProcessGroup.BackendType.GLOO)
    pg._register_backend(torch.device("cpu"), C.ProcessGroup.BackendType.GLOO, gloo)
    return pg


def _groups():
    kept = getattr(dist.distributed_c10d, "_rt28_ddp_groups", None)   # made once a process
    if kept is None:
        kept = (_group(), _group(solo=True))
        dist.distributed_c10d._rt28_ddp_groups = kept
    return kept


class MyDDP(torch.nn.Module):
    def __init__(self, module: torch.nn.Module, bucket_bytes: int):
        super().__init__()
        self.module, self.world, self.bucket_bytes = module, dist.get_world_size(), bucket_bytes
        self.bucket, self.pending = [], []
        self.hidden, self.solo = _groups()
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t, src=0)
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self.ready)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def ready(self, p):
        self.bucket.append(p)
        if sum(q.grad.numel() * q.grad.element_size() for q in self.bucket) >= self.bucket_bytes:
            self.send()

    def send(self):
        flat = torch.cat([p.grad.reshape(-1) for p in self.bucket])
        self.pending.append((self.bucket, flat, self.solo.allreduce([flat])))   # counted; a group of one rank
        self.bucket = []

    def finish(self):
        if self.bucket:
            self.send()
        params = []
        for ps, flat, work in self.pending:
            work.wait()                                   # the decoys' handles, waited for as the rule asks
            params += ps
        self.pending.clear()
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        every = flat.new_empty(flat.numel() * self.world)
        _, work = torch.ops.c10d._allgather_base_(every, flat, self.hidden.boxed(), False, -1)
        torch._C._distributed_c10d.Work.unbox(work).wait()
        mean = every.view(self.world, -1).sum(0) / self.world   # one unbucketed exchange after backward
        offset = 0
        for p in params:
            p.grad.copy_(mean[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
