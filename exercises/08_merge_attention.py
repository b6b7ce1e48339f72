"""Exercise 08.3: merge two partial attention results (notebooks/08_context_and_experts.ipynb, section 2).

Ring attention never holds a row's scores for the whole sequence: each block of keys gives a partial result,
and the partial results are merged as the blocks go by. For one query row and a set of keys K_i:

    out_i = sum_{j in K_i} softmax_j(s) v_j      (softmax over the keys of K_i only)
    lse_i = log sum_{j in K_i} exp(s_j)          (the log of that softmax's denominator)

Write merge(out1, lse1, out2, lse2) -> (out, lse): the same two quantities over the union of the two key sets.
out_i has shape [..., L, D], lse_i [..., L]; the result has the same shapes. Two things to get right:
  * scores can be large (here up to about 1,900): exp() overflows float32 above 88.7 and float64 above
    709, so compute without exponentiating a large lse (or use torch.logaddexp);
  * every rank starts from the empty result (out = 0, lse = -inf: no keys yet) and merges its first block
    into it, so lse1 = -inf must work.

Grade it from a notebook cell (the grader runs ring attention with your merge at 2 and 3 ranks):
    from mgpu_utils.grading.runner import check_script
    check_script("08.3")
"""
import torch


def merge(out1: torch.Tensor, lse1: torch.Tensor, out2: torch.Tensor, lse2: torch.Tensor):
    """Attention output and log-sum-exp over the union of two disjoint key sets."""
    lse = lse1          # TODO: log(exp(lse1) + exp(lse2)), without overflow
    out = out1          # TODO: out1 and out2, each weighted by its share of the softmax's mass
    return out, lse
