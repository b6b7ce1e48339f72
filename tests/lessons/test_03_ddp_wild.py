"""Lesson 03's DDP in the wild (issue 36): ddp_pitfalls.py and ddp_uneven.py under real torchrun at 1, 2 and 4
ranks. Each fix equals one process (the scripts compute the reference on every rank); each mistake shows."""
import math

import pytest

from mgpu_utils.launch.launcher import LaunchError, launch

FP32 = 1e-5   # float32 rounding of a few SGD steps on a small model


@pytest.mark.parametrize("nproc", [1, 2, 4])
def test_unused_parameters_seeding_and_clipping(nproc, starts_processes):
    r = launch("ddp_pitfalls.py", nproc=nproc, show="none", args=["--repeats", 2])
    assert r["world_size"] == nproc
    u = r["unused"]
    # plain DDP: step 1 skips the branch; the forward of step 2 raises DDP's unused-parameter error
    assert u["plain"]["steps_done"] == 2 and "not used in producing loss" in u["plain"]["error"]
    assert u["plain"]["same_on_every_rank"] is (nproc == 1)      # step 1 used each rank's own gradients
    for name in ("find_unused", "static_graph"):
        assert u[name]["error"] is None and u[name]["steps_done"] == 4 and u[name]["same_on_every_rank"]
        assert u[name]["max_diff_vs_one_process"] < FP32
    s = r["seeding"]
    assert s["dropout_same_seed_ranks_like_rank0"] == nproc - 1 and s["dropout_seed_plus_rank_ranks_like_rank0"] == 0
    same, per_rank = s["sampler_same_seed"], s["sampler_seed_per_rank"]
    assert same["missed"] == 0 and same["read"] == math.ceil(1438 / nproc) * nproc
    assert (per_rank["missed"] > 0) is (nproc > 1)
    init = s["init_max_diff_between_ranks"]
    assert init["after_ddp"] == 0 and (init["before_ddp"] > 0.01) is (nproc > 1)
    c = r["clip"]
    assert c["grad_norm_one_process"] > c["max_norm"]
    assert c["after_sync_max_diff_vs_one_process"] < FP32 < 10 * FP32 < c["every_micro_batch_max_diff_vs_one_process"]


@pytest.mark.parametrize("nproc", [1, 2, 4])
def test_join_equals_one_process_replay_and_deduplicated_eval_equals_one_process(nproc, starts_processes):
    r = launch("ddp_uneven.py", nproc=nproc, show="none", args=["--case", "join", "eval"])
    j, e = r["join"], r["eval"]
    assert j["batches_per_rank"] == [3 + q for q in range(nproc)]
    assert j["same_on_every_rank"] and j["max_diff_vs_one_process"] < FP32
    assert e["padded"] == math.ceil(101 / nproc) * nproc - 101 == e["samples_counted"] - 101
    assert e["distinct_counted"] == 101 and e["accuracy_deduplicated"] == e["accuracy_one_process"] > 0
    # 101 is prime, so counting p < 101 repeats changes the accuracy whenever it is not 0
    assert (e["accuracy_summed"] != e["accuracy_one_process"]) is (e["padded"] > 0)


def test_without_join_the_ranks_with_more_batches_time_out(starts_processes):
    with pytest.raises(LaunchError) as err:
        launch("ddp_uneven.py", nproc=3, show="none", args=["--case", "hang", "--timeout", "2"], timeout_s=120)
    assert "timed out" in err.value.message.lower() and err.value.rank in (1, 2)


@pytest.mark.parametrize("script, nproc, args, words", [
    ("ddp_uneven.py", 1, ["--case", "hang"], "--nproc-per-node 2"),
    ("ddp_uneven.py", 2, ["--per-rank-batch", "400"], "lower --per-rank-batch or --batches"),
    ("ddp_pitfalls.py", 1, ["--case", "clip", "--max-norm", "10"], "does not clip"),
    ("ddp_pitfalls.py", 2, ["--case", "clip", "--micro-batches", "5"], "divide into --micro-batches"),
])
def test_bad_input_names_the_fix(script, nproc, args, words, starts_processes):
    with pytest.raises(LaunchError) as err:
        launch(script, nproc=nproc, show="none", args=args)
    assert err.value.exc_type == "ValueError" and words in err.value.message
