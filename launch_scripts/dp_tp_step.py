"""One step of a small Llama under dp x tp, every rank's gradients against one process (capstone lesson 13).

The step is mgpu_utils.parallel.layouts.dp_tp_gradients: a TinyLlama (--layers blocks, 4 key/value heads, seed 0)
with Megatron TP + sequence parallelism over --tp ranks, dp = world / tp replicas each on its own rows of one
seeded batch, the gradients averaged over dp. Lesson 13 runs the same function in one process under
LocalTensorMode (layouts.local_tensor_gradients) and compares the two rank by rank: --dump makes rank 0 save every
rank's gradients there (torch.save of a list, rank order). Rank 0 prints one JSON line: the world, dp and tp, and
the largest difference of any rank's gradient from one process's on the whole batch (float32).
    torchrun --standalone --nproc-per-node 4 launch_scripts/dp_tp_step.py --tp 2 --dump grads.pt
"""
import argparse

import torch
import torch.distributed as dist

from mgpu_utils.dist import distributed, emit_result
from mgpu_utils.models import LlamaConfig, tiny_llama
from mgpu_utils.parallel.layouts import dp_tp_gradients, next_token_loss

ROWS, SEQ = 2, 16       # a dp replica's rows, and tokens per row (divisible by tp)


def batch_for(dp: int, vocab: int) -> torch.Tensor:
    """(dp * ROWS, SEQ + 1) int64 tokens, the same in every process (seed 1)."""
    return torch.randint(0, vocab, (dp * ROWS, SEQ + 1), generator=torch.Generator().manual_seed(1))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = p.add_argument_group("layout and model")
    g.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (dividing the world and 4 kv heads)")
    g.add_argument("--layers", type=int, default=1, help="decoder blocks")
    g.add_argument("--dump", default="", help="rank 0 saves every rank's gradients here (torch.save, rank order)")
    a = p.parse_args()
    cfg = LlamaConfig(kv_heads=4, layers=a.layers)
    with distributed(backend="gloo") as ctx:
        if ctx.world_size % a.tp or 4 % a.tp:
            raise SystemExit(f"--tp {a.tp} must divide the world size {ctx.world_size} and the 4 key/value heads")
        dp = ctx.world_size // a.tp
        batch = batch_for(dp, cfg.vocab)
        # region step
        if ctx.world_size > 1:
            grads = dp_tp_gradients(cfg, dp, a.tp, batch)
        else:                                            # one rank: no mesh to build, the step alone
            model = tiny_llama(cfg, seed=0)
            next_token_loss(model(batch[:, :-1]), batch[:, 1:]).backward()
            grads = {n: q.grad for n, q in model.named_parameters()}
        # endregion
        grads = {n: g.detach().clone() for n, g in grads.items()}
        ref = tiny_llama(cfg, seed=0)
        next_token_loss(ref(batch[:, :-1]), batch[:, 1:]).backward()
        worst = max((g - q.grad).abs().max().item() for (n, g), (_, q) in zip(sorted(grads.items()),
                                                                               sorted(ref.named_parameters())))
        everyone = [None] * ctx.world_size if ctx.rank == 0 else None
        if ctx.world_size > 1:
            dist.gather_object(grads, everyone, dst=0)
        else:
            everyone = [grads]
        worst_all = torch.tensor(worst)
        if ctx.world_size > 1:
            dist.all_reduce(worst_all, op=dist.ReduceOp.MAX)
        if ctx.rank == 0:
            if a.dump:
                torch.save(everyone, a.dump)
            emit_result({"world_size": ctx.world_size, "dp": dp, "tp": a.tp, "names": sorted(grads),
                         "max_grad_diff": worst_all.item()})


if __name__ == "__main__":
    main()
