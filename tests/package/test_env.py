"""mgpu_utils.env: the course's tiers, the ranks per launch, the machine report, the GPUs a kernel cell may use."""
import pytest

from mgpu_utils.env import course_tier, cpu_vector_extensions, default_nproc, machine_report


@pytest.mark.parametrize("gpus,tier,backend", [(0, "cpu", "gloo"), (1, "single-gpu", "gloo"),
                                               (8, "multi-gpu", "nccl"), (2, "multi-gpu", "gloo")])
def test_course_tier(gpus, tier, backend):
    t = course_tier(4, num_gpus=gpus)
    assert (t["tier"], t["backend"]) == (tier, backend) and t["reason"]


def test_course_tier_refuses_zero():
    with pytest.raises(ValueError):
        course_tier(0, num_gpus=0)


def test_default_nproc(monkeypatch):
    monkeypatch.delenv("MGPU_NPROC", raising=False)
    assert default_nproc() == 4
    monkeypatch.setenv("MGPU_NPROC", "2")
    assert default_nproc() == 2
    monkeypatch.setenv("MGPU_NPROC", "0")
    with pytest.raises(ValueError):
        default_nproc()


def test_machine_report_fields():
    r = machine_report()
    assert r["cpu_cores_logical"] >= 1 and r["memory_gb"] > 0 and isinstance(r["gpus"], list)


def test_cpu_vector_extensions_is_a_list():
    assert isinstance(cpu_vector_extensions(), list)


@pytest.mark.parametrize("asked,gpus,cores,want", [
    (4, 0, 1, 2),     # Colab: one physical core; the data-parallel cases still need 2 ranks (issue 31, item 4)
    (4, 0, 2, 2), (4, 0, 8, 4), (4, 1, 2, 2),     # CPU ranks: one per core, at most asked
    (8, 8, 1, 8), (4, 8, 1, 4),                    # one GPU per rank: what was asked
    (1, 0, 4, 2)])
def test_ranks_per_launch_follow_the_cores_the_process_may_use(asked, gpus, cores, want):
    from mgpu_utils.env import cpu_ranks
    assert cpu_ranks(asked, gpus, cores) == want


def test_one_usable_cpu_is_one_physical_core(monkeypatch):
    """`taskset -c 0`, Slurm's --cpus-per-task=1: the machine's physical cores do not count, the usable do."""
    from mgpu_utils import env, timing
    monkeypatch.setattr(timing, "usable_cores", lambda: 1)
    assert env.usable_physical_cores() == 1


def test_a_gpu_the_build_cannot_run_leaves_the_kernel_cells_on_cpu(monkeypatch):
    """Issue 31 (misleading on GPUs): on a V100 with the cu130 wheel torch.cuda.is_available() is True but
    every kernel fails with "no kernel image"; the lessons' single-process cells take the course's own check."""
    from mgpu_utils import env
    monkeypatch.setattr(env, "gpu_status", lambda: (1, 0, "GPU 0 (Tesla V100) is older than this build"))
    assert env.usable_gpus() == 0 and env.kernel_device().type == "cpu"
    monkeypatch.setattr(env, "gpu_status", lambda: (2, 2, ""))
    assert env.usable_gpus() == 2 and str(env.kernel_device()) == "cuda:0"
