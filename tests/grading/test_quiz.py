"""The quiz's checker (mgpu_utils.grading.quiz): every question's right and wrong answer, the answers against
the facts they come from, bad input."""
import pytest

from mgpu_utils.grading import quiz as exercises


RIGHT = {
    "00.1": 28,
    "00.2": "gloo",
    "01.1": 1024,
    "01.2": 295,
    "01.3": 0.625,
    "02.1": 0.25,
    "02.2": 7,
    "03.1": 360,
    "03.2": 4,
    "03.3": 8,
    "03.8": 47,
    "04.1": 28,
    "04.2": 7.5,
    "04.3": 896,
    "05.1": 7 / 31,
    "05.2": 8,
    "05.3": 4,
    "05.5": 90,
    "05.6": 8384,
    "06.1": 50.33,
    "06.2": 21.83,
    "07.1": 5.625,
    "07.2": 0.956301312,
    "07.3": 8,
    "07.7": 49,
    "07.8": 0.8234,
    "09.1": 140.28,
    "09.2": 3,
    "09.3": 100,
    "09.5": 12.5,
    "09.6": 140,
    "10.1": 0.8,
    "10.2": 5.094,
    "10.3": "ddp.module.config",
    "10.4": 3,
    "10.6": 1.6,
    "12.1": 37.95,
    "11.1": 80,
    "11.2": 9.14,
    "11.3": 50,
    "11.4": 11520,
    "12.2": 20,
    "12.3": 32,
    "12.4": 6,
    "13.2": 13,
    "13.3": 82_432,
    "08.1": 896,
    "08.2": 224,
    "08.4": 160,
}
WRONG = {
    "00.1": 36,
    "00.2": "nccl",
    "01.1": 512,
    "01.2": 0.295,
    "01.3": 1.0,
    "02.1": 1,
    "02.2": 8,
    "03.1": 359,
    "03.2": 64,
    "03.3": 1,
    "03.8": 63,
    "04.1": 32,
    "04.2": 10,
    "04.3": 1792,
    "05.1": 7 / 24,
    "05.2": 24,
    "05.3": 2,
    "05.5": 108,
    "05.6": 16768,
    "06.1": 6.29,
    "06.2": 2.73,
    "07.1": 8.25,
    "07.2": 0.285,
    "07.3": 7,
    "07.7": 25,
    "07.8": 0.2684,
    "09.1": 160,
    "09.2": 4,
    "09.3": 800,
    "09.5": 100,
    "09.6": 160,
    "10.1": 0.1,
    "10.2": 3.82,
    "10.3": "ddp.config",
    "10.4": 2,
    "10.6": 4,
    "11.1": 3.2,
    "11.2": 20,
    "11.3": 16.67,
    "11.4": 4608,
    "12.1": 26.83,
    "12.2": 23,
    "12.3": 24,
    "12.4": 5,
    "13.2": 4,
    "13.3": 82_944,
    "08.1": 448,
    "08.2": 168,
    "08.4": 128,
}


@pytest.mark.parametrize("ex_id", sorted(exercises.EXERCISES))
def test_every_exercise_has_a_right_and_a_wrong_answer(ex_id, capsys):
    assert ex_id in RIGHT, "add the new exercise to RIGHT and WRONG"
    assert exercises.check(ex_id, RIGHT[ex_id]) is True
    assert "correct" in capsys.readouterr().out
    assert exercises.check(ex_id, WRONG[ex_id]) is False
    hint = capsys.readouterr().out
    assert "not yet" in hint and len(hint) > 30
    assert exercises.check(ex_id, None) is False
    assert exercises.solution(ex_id) and exercises.question(ex_id)


def test_exercise_answers_match_the_facts():
    import math
    from torch.utils.data import DistributedSampler
    from mgpu_utils.data import load_data

    from mgpu_utils.dist import choose_backend

    train, _ = load_data()
    assert len(DistributedSampler(train, num_replicas=4, rank=0)) == RIGHT["03.1"] == math.ceil(len(train) / 4)
    assert choose_backend(4, num_gpus=1, forced=None)[0] == RIGHT["00.2"]
    assert sum(range(8)) == RIGHT["00.1"]
    from mgpu_utils.costs.bandwidth import busbw_gbps
    from mgpu_utils.costs.bandwidth import ring_bytes_per_rank
    assert ring_bytes_per_rank(16, 8) == RIGHT["04.1"]
    from mgpu_utils.costs.hardware import GPUS
    from mgpu_utils.timing import matmul_intensity
    assert matmul_intensity(3072, 2) == RIGHT["01.1"]
    assert round(GPUS["H100"]["bf16_tflops"] * 1e12 / (GPUS["H100"]["hbm_gbps"] * 1e9)) == RIGHT["01.2"]
    from mgpu_utils.costs.occupancy import occupancy, sm_limits
    assert occupancy(256, 48, 0, sm_limits(capability=(9, 0)))["occupancy"] == RIGHT["01.3"]
    assert busbw_gbps("all_gather", 1e9, 0.1, 4) == RIGHT["04.2"]
    import torch
    from mgpu_utils.models import LlamaConfig
    ranks = torch.arange(16).view(2, 4, 2)                          # 13.2: (pp, dp, tp), tp fastest
    assert ranks[1][tuple(c[0] for c in torch.where(ranks[0] == 5))].item() == RIGHT["13.2"]
    cfg, hd = LlamaConfig(kv_heads=4), 16                           # 13.3: a middle stage's bytes at tp 2 and 4
    mats = 2 * cfg.heads * hd * cfg.width + 2 * cfg.kv_heads * hd * cfg.width + 3 * cfg.ffn * cfg.width
    assert 4 * (mats // 4 + 2 * cfg.width) == 41_472 and 4 * (mats // 2 + 2 * cfg.width) == RIGHT["13.3"]
    from mgpu_utils.parallel.schedules import bubble_formula, one_f_one_b_actions, peak_in_flight
    from mgpu_utils.parallel.tensor_parallel import tp_bytes_per_layer
    assert bubble_formula(8, 24) == RIGHT["05.1"]
    assert peak_in_flight(one_f_one_b_actions(8, 24))[0] == RIGHT["05.2"]
    assert 2 * tp_bytes_per_layer(1, 2048, 4096, 8)["collectives_per_pass"] == RIGHT["05.3"]
    from mgpu_utils.parallel.pipeline import balanced_split
    from mgpu_utils.parallel.schedules import unequal_stages_step
    assert balanced_split([1, 1, 1, 1, 2, 2, 2, 2], 2) == [5, 3]
    assert unequal_stages_step([6, 6], 4) == RIGHT["05.5"] and unequal_stages_step([4, 8], 4) == WRONG["05.5"]
    from mgpu_utils.costs.memory_model import model_state_bytes, transformer_params
    from mgpu_utils.costs.planner import Cluster, GPT3_175B, evaluate
    n = transformer_params(96, 12288, 50257, 2048)
    assert round(model_state_bytes(n, tp=8, pp=16).total / 1e9, 2) == RIGHT["06.2"]
    lay = evaluate(GPT3_175B, Cluster(1024), 8, 8, 16, global_batch=1536)
    one_all_reduce = lay.comm_bytes["tp"] / (96 // 16 * lay.n_micro * 4 * 2 * 7 / 8)   # planner: 4 per layer, ring 2(t-1)/t
    assert round(one_all_reduce / 1e6, 2) == RIGHT["06.1"]
    from mgpu_utils.costs.memory_model import calculate
    from mgpu_utils.costs.memory_model import activation_bytes_per_layer
    assert calculate(1.5e9, zero_stage=2, dp=8).total / 1e9 == RIGHT["07.1"]
    assert activation_bytes_per_layer(2048, 1, 4096, 32) / 1e9 == RIGHT["07.2"]
    from mgpu_utils.costs.interconnect import ring_allreduce_seconds
    from mgpu_utils.parallel.staleness import simulate_ps
    assert math.isclose(ring_allreduce_seconds(100e6, 8, "Ethernet 10 GbE") * 1e3, RIGHT["09.1"])
    sim = simulate_ps([1.0] * 4, 4000)
    assert round(sum(s for _, s in sim) / len(sim)) == RIGHT["09.2"]
    assert 800 // 8 == RIGHT["09.3"]
    from mgpu_utils.costs.bandwidth import ring_bytes_per_rank
    assert ring_bytes_per_rank(4 * 25e6, 8) / (7 * 8 * 0.01 * 25e6) == pytest.approx(RIGHT["09.5"])
    assert 20 * ring_bytes_per_rank(4e9, 8) / 1e9 == pytest.approx(RIGHT["09.6"])
    tokens, V, t = 8192, 50304, 8
    assert (t - 1) / t * tokens * V * 4 / (3 * ring_bytes_per_rank(4 * tokens, t)) == pytest.approx(RIGHT["05.6"])
    from mgpu_utils.measure.energy import run_cost
    from mgpu_utils.costs.scaling import amdahl_speedup, speedups
    assert 100 * speedups([{"world_size": 1, "samples_per_s": 1 / 0.2},
                           {"world_size": 4, "samples_per_s": 1 / 0.0625}])[4]["efficiency"] == pytest.approx(RIGHT["11.1"])
    assert round(float(amdahl_speedup(16, 0.05)), 2) == RIGHT["11.2"]
    assert 100 * 6 * 1.3e9 * 20_000 / 312e12 == pytest.approx(RIGHT["11.3"])
    assert run_cost(64, 72, 2.50) == RIGHT["11.4"]
    assert 0.1 * (64 * 32) / 256 == pytest.approx(RIGHT["10.1"])
    assert 8 * 13e9 * 260e9 / (512 * 120e12) / 86400 == pytest.approx(RIGHT["10.2"], rel=1e-3)
    from mgpu_utils.costs.scaling import critical_batch_steps
    assert (critical_batch_steps(1024, 2000, 1024) / critical_batch_steps(4096, 2000, 1024)
            == pytest.approx(RIGHT["10.6"]))
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    import torch.distributed as dist
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = torch.nn.Linear(2, 2)
        model.config = "the config"
        assert eval(RIGHT["10.3"], {"ddp": DDP(model)}) == "the config"
    finally:
        dist.destroy_process_group()
    import re
    from mgpu_utils.env import SCRIPTS_DIR
    loop = (SCRIPTS_DIR / "case_gan.py").read_text().split("for step in range(args.steps):")[1].split("params =")[0]
    assert len(re.findall(r"\bd\(", loop)) == RIGHT["10.4"]     # d(real), d(fake.detach()), d(fake)


def test_unknown_exercise_and_bad_types():
    with pytest.raises(KeyError, match="known"):
        exercises.check("99.9", 1)
    assert exercises.check("03.1", "three hundred", quiet=True) is False
    assert exercises.check("03.1", 360.5, quiet=True) is False
    assert exercises.check("03.1", " 360 ", quiet=True) is True


def test_quiz_and_coding_exercises_have_distinct_numbers():
    """A lesson's exercises are numbered once: a quiz question and a coding exercise never share a number
    (07.5 was both, the quiz's check("07.5") and check_script("07.5"))."""
    from mgpu_utils.grading.catalog import EXERCISES
    assert not set(exercises.EXERCISES) & set(EXERCISES)
