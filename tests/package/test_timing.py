"""mgpu_utils.timing: LoadWatch, the quiet-machine precondition of the lessons' timing claims (issue 29); the
matmul arithmetic and time_fn of lesson 01.

LoadWatch with real processes, not only patched numbers: a busy loop that is not this process's descendant is "other load",
a busy child is this job's own work; the core count is patched to simulate `taskset -c 0`.
"""
import subprocess
import sys
import time

import pytest

from mgpu_utils import timing
from mgpu_utils.timing import LoadWatch, matmul_flops, matmul_intensity, time_fn

SPIN = [sys.executable, "-c", "import time\nt = time.time() + {s}\nwhile time.time() < t: pass"]


def _spin(seconds: float, own: bool):
    """A process busy for ``seconds``: our child, or (own=False) reparented away from us by a double fork."""
    cmd = [a.format(s=seconds) for a in SPIN]
    if own:
        return subprocess.Popen(cmd)
    subprocess.run(["sh", "-c", " ".join(f"'{a}'" for a in cmd) + " >/dev/null 2>&1 &"], check=True)
    return None


def test_a_busy_process_of_someone_else_is_other_load(capsys, starts_processes):
    if timing.usable_cores() < 2:
        pytest.skip("SKIPPED: needs 2 usable cores to tell one busy core from a full machine")
    _spin(2.5, own=False)
    time.sleep(0.3)
    with LoadWatch(cores=1) as machine:
        time.sleep(1.5)
    assert machine.other_cores > 0.6, machine.other_cores
    assert not machine.quiet and "other processes used" in machine.why_not()
    assert machine.claim(False, "a claim that would fail") is False      # printed, not raised
    out = capsys.readouterr().out
    assert out.startswith("not asserted (busy machine: others used") and "a claim that would fail" in out


def test_the_jobs_own_children_are_not_other_load(starts_processes):
    """A busy child counts as the job's own CPU time, so it adds nothing to other_cores (which is the machine's
    busy time minus the job's). Compared with the child's own CPU time as the kernel reports it when it is
    reaped, not with another window: other processes' load may change between two windows (a test run beside
    this one made the earlier, window-against-window version fail once), the child's CPU time cannot."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with LoadWatch(cores=1) as working:
        own0 = working._own0
        _spin(1.5, own=True).wait()
        own1 = working._own_cpu_s()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    child_cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    assert child_cpu > 0.1, child_cpu                       # it did spin (even on a shared core)
    # by construction: the job's CPU time over the window includes all of the child's (plus our own)
    assert own1 - own0 >= 0.95 * child_cpu, (own1 - own0, child_cpu)


def test_quiet_claims_are_asserted(monkeypatch, capsys):
    busy = iter([100.0, 102.0])                     # the machine: 2 core-seconds in the window
    own = iter([10.0, 11.9])                        # ours: 1.9 of them
    monkeypatch.setattr(timing, "_machine_busy_s", lambda: next(busy))
    monkeypatch.setattr(timing, "_tree_cpu_s", lambda: next(own))
    monkeypatch.setattr(timing, "usable_cores", lambda: 2)
    with LoadWatch(cores=2) as machine:
        time.sleep(1.0)
    assert machine.quiet and machine.other_cores == pytest.approx(0.1, abs=0.02)
    assert machine.claim(True, "2 ranks are faster than 1") is True
    assert capsys.readouterr().out.startswith("checked (quiet machine): ")
    with pytest.raises(AssertionError, match="not shown by this run, on a quiet machine"):
        machine.claim(False, "2 ranks are faster than 1")
    # a reason the caller measured (lesson 05: a stalled action) wins over a quiet average
    assert machine.claim(False, "bubble on the formula", unless="rank 0's forward 5 stalled") is False
    assert capsys.readouterr().out == "not asserted (rank 0's forward 5 stalled): bubble on the formula\n"


def test_too_few_usable_cores_is_not_quiet(monkeypatch, capsys):
    """`taskset -c 0 make course`: one usable core, a 2-core claim is reported, not failed."""
    monkeypatch.setattr(timing.os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert timing.usable_cores() == 1
    with LoadWatch(cores=2) as machine:
        pass
    assert machine.why_not() == "this process may use 1 core(s) and the claim needs 2"
    assert machine.claim(False, "speed-up") is False and "(1 usable core(s), the claim needs 2): speed-up" in capsys.readouterr().out


def test_unmeasurable_load_is_said(monkeypatch):
    monkeypatch.setattr(timing, "_tree_cpu_s", lambda: None)      # e.g. macOS: no children's CPU times
    monkeypatch.setattr(timing, "usable_cores", lambda: 8)
    with LoadWatch() as machine:
        pass
    assert machine.other_cores is None and "cannot be measured" in machine.why_not()


def test_misuse_is_explained():
    with pytest.raises(ValueError, match="at least 1"):
        LoadWatch(cores=0)
    with pytest.raises(RuntimeError, match="with LoadWatch"):
        LoadWatch().quiet


def test_start_and_stop_span_cells_and_own_process_counts_children_as_others(starts_processes):
    if timing.usable_cores() < 2:
        pytest.skip("SKIPPED: needs 2 usable cores")
    machine = LoadWatch(own="process").start()
    _spin(1.5, own=True).wait()                      # our child: not this process's own work
    machine.stop()
    assert machine.other_cores > 0.6, machine.other_cores
    with pytest.raises(ValueError, match="own must be"):
        LoadWatch(own="mine")


def test_a_claim_waits_for_the_courses_own_template_to_finish_importing(monkeypatch):
    """course.start() imports PyTorch in a template process in the background: a LoadWatch started meanwhile
    waits for it, so the course's own start-up is not measured as other processes' load (lesson 01)."""
    from mgpu_utils.launch import warm

    calls = []

    class Importing:                                  # a template still importing PyTorch
        _ready = None

        def alive(self):
            return True

        def wait_ready(self, timeout):
            calls.append(timeout)
            self._ready = {"ready": True}

    monkeypatch.setattr(warm, "_TEMPLATE", Importing())
    timing.LoadWatch().start().stop()
    assert len(calls) == 1
    timing.LoadWatch().start().stop()                 # ready now: nothing to wait for
    assert len(calls) == 1


def test_ranks_that_did_not_get_their_cores_make_a_quiet_machine_not_count():
    """A quiet run measured a 2-rank speed-up of 1.14 (quiet runs: 1.6-1.8), with 0.04 other cores on this
    machine: its cores were busy with work it cannot see. The ranks' own CPU share shows it (0.65 with one
    busy core; 1.0 quiet), and then the claim is not asserted."""
    from mgpu_utils.timing import MIN_CPU_SHARE, LoadWatch

    w = LoadWatch()
    w.wall_s, w.other_cores, w.usable_cores = 10.0, 0.04, 2
    assert w.why_not() is None
    w.ranks_got(None).ranks_got(0.99).ranks_got([0.6, None, 0.97])
    assert w.cpu_share == 0.6 and "got 60% of a core" in w.why_not()
    assert not w.claim(False, "a claim the run does not show")       # not asserted: says why
    w.cpu_share = MIN_CPU_SHARE + 0.01
    assert w.why_not() is None


def test_conv_autotune_times_restores_the_flag_and_times_both_settings():
    """Lesson 01, section 7 runs it on a GPU only; here on the CPU (the flag changes nothing there), for
    the shape of the result and the flag put back, even after an error."""
    import torch
    from mgpu_utils.timing import conv_autotune_times
    before = torch.backends.cudnn.benchmark
    out = conv_autotune_times("cpu", iters=2, shape=(2, 4, 8, 8))
    assert set(out) == {False, True} and all(t["first_s"] > 0 and t["median_s"] > 0 for t in out.values())
    assert torch.backends.cudnn.benchmark == before
    with pytest.raises(RuntimeError):
        conv_autotune_times("cpu", iters=1, shape=(2, 4, 1, 0))       # a width of 0 fails inside the conv
    assert torch.backends.cudnn.benchmark == before


def test_intensity_and_flops_by_hand():
    assert matmul_flops(10) == 2000
    assert matmul_intensity(1024, 4) == pytest.approx(2 * 1024 / 12)     # 2n / (3 b)
    assert matmul_intensity(3072, 2) == 1024


def test_time_fn_measures_and_refuses_bad_input():
    import torch
    out = time_fn(lambda: torch.randn(64, 64) @ torch.randn(64, 64), "cpu", iters=3)
    assert 0 < out["best_s"] <= out["median_s"] and len(out["all_s"]) == 3
    with pytest.raises(ValueError):
        time_fn(lambda: None, iters=0)
