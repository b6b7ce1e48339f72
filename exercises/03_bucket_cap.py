"""Exercise 03.9 (design): choose DDP's bucket size for a model and a link (notebooks/03_ddp.ipynb, section 4, the
bucket sweep, and the exercise's own cell; the all-reduce's alpha-beta cost of lesson 04).

Write choose_bucket_cap_mb(grad_bytes, backward_s, n, alpha_s, bandwidth_bps) -> float: the ``bucket_cap_mb``
(in MiB, 2**20 bytes, as DDP counts it) you would give DDP for this model on this link.

    grad_bytes[i]   bytes of the gradient of parameter i, in model.parameters() order (the first layer first)
    backward_s[i]   seconds backward spends on parameter i's layer (the same order; it is run from the last
                    entry to the first, so gradient i is ready sum(backward_s[i:]) seconds after backward starts;
                    a layer's time is given once, on the entry backward reaches first: 0 on the others)
    n               ranks; alpha_s: the link's latency per ring step (s); bandwidth_bps: its bandwidth (bytes/s)

How the grader scores a cap (mgpu_utils.costs.overlap, lesson 03): the gradients join the open bucket in the
order they become ready, and the bucket is closed once it holds at least the cap (03.6's rule; a gradient is never
split). A closed bucket's all-reduce starts as soon as the link is free, one at a time, and takes the ring all-
reduce's time 2(n-1) alpha + 2(n-1)/n S / B for S bytes (mgpu_utils.costs.bandwidth.ring_allreduce_model). What
is still sending when backward ends is exposed: the step (backward plus exposed communication) waits for it.

The grader asks your function about the four models of named_models() below and about four more of the same
kind that it does not name, and accepts a cap whose step time is at most 1.10 times that of the best cap for that
case. Several caps pass each time, but no fixed size (DDP's default of 25 MiB included) and no fixed share of the
model passes every case. A case that fails gets a hint with where your step's time goes.

bucket_timeline and best_bucket_cap of mgpu_utils.costs.overlap are switched off while your function runs (they
would choose for you; the grader scores your answer with them afterwards): decide from what each bucket costs,
its latency and its bytes, and what backward still has to do while it is sent. Try it on the named models in the
lesson's cell first (there the simulator may be used, to see how your answers score).

Grade it from a notebook cell:
    from mgpu_utils.grading.runner import check_script
    check_script("03.9")
"""


def named_models():
    """The four cases the grader names: (name, dict of choose_bucket_cap_mb's arguments). Compute runs at 40 %
    of the GPU's bf16 peak (mgpu_utils.costs.hardware.GPUS); alpha and bandwidth are the link's
    (mgpu_utils.costs.interconnect.link_alpha_beta)."""
    from mgpu_utils.costs.hardware import GPUS
    from mgpu_utils.costs.interconnect import link_alpha_beta
    from mgpu_utils.costs.overlap import resnet_gradients, transformer_gradients

    def case(model, n, link):
        (grad_bytes, backward_s), (alpha_s, bandwidth_bps) = model, link_alpha_beta(link)
        return {"grad_bytes": grad_bytes, "backward_s": backward_s, "n": n, "alpha_s": alpha_s,
                "bandwidth_bps": bandwidth_bps}
    a100, h100, l4 = (GPUS[g]["bf16_tflops"] * 1e12 * 0.4 for g in ("A100", "H100", "L4"))
    return [
        ("ResNet-50, 64 images per GPU, 8 A100 over PCIe 4.0", case(resnet_gradients(64, a100), 8, "PCIe 4.0 x16")),
        ("ResNet-50, 32 images per GPU, 32 L4 over 100 GbE", case(resnet_gradients(32, l4), 32, "Ethernet 100 GbE")),
        ("GPT-2 small (124M), 8 x 1024 tokens per GPU, 8 A100 over NVLink",
         case(transformer_gradients(12, 768, 50257, 8 * 1024, a100), 8, "NVLink 3 (A100, 12 links)")),
        ("GPT-2 medium (untied head, bf16 gradients), 8 x 1024 tokens per GPU, 64 H100 over InfiniBand",
         case(transformer_gradients(24, 1024, 50257, 8 * 1024, h100, bytes_per_grad=2, tied=False), 64,
              "InfiniBand NDR (400 Gb/s)")),
    ]


def choose_bucket_cap_mb(grad_bytes, backward_s, n, alpha_s, bandwidth_bps):
    """DDP's bucket_cap_mb (MiB) for this model on this link."""
    # TODO: weigh the latency every bucket pays against the communication left after backward when buckets are
    # big (the last one can only start when backward ends), and return your cap in MiB
    return 25.0
