"""Solution of exercise 12.5: a snapshot that resumes exactly (for instructors)."""
import os

import torch
import torch.distributed as dist


def save_snapshot(path, model, opt, sched, step):
    """Called on every rank after ``step`` steps; rank 0 writes one file at ``path``, atomically."""
    rngs = [None] * dist.get_world_size()
    dist.all_gather_object(rngs, torch.get_rng_state())  # every rank's dropout stream, not only rank 0's
    if dist.get_rank() == 0:
        state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                 "step": step, "rng": rngs}
        tmp = f"{path}.tmp"
        torch.save(state, tmp)                           # a crash here leaves the old snapshot at path
        os.replace(tmp, path)                            # atomic: path is the old file or the new one
    dist.barrier()                                       # no rank reads or writes ahead of the snapshot


def load_snapshot(path, model, opt, sched):
    """Restore what save_snapshot wrote, on every rank; returns the number of steps already done."""
    state = torch.load(path, weights_only=False)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["rng"][dist.get_rank()])
    return state["step"]
