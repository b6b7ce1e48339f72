"""mgpu_utils.compat: the 2.14 names on 2.14, the older names where only those exist (Colab's torch)."""
import pytest
import torch
import torch.distributed as dist

from mgpu_utils import compat


def test_new_names_are_used_when_present(monkeypatch):
    calls = []
    monkeypatch.setattr(dist, "all_gather_single", lambda o, i, group=None, async_op=False: calls.append("ag"),
                        raising=False)
    monkeypatch.setattr(dist, "reduce_scatter_single",
                        lambda o, i, op=None, group=None, async_op=False: calls.append("rs"), raising=False)
    compat.all_gather_single(torch.empty(2), torch.empty(1))
    compat.reduce_scatter_single(torch.empty(1), torch.empty(2))
    assert calls == ["ag", "rs"]


def test_old_names_are_used_on_older_torch(monkeypatch):
    """Simulate torch 2.12 or older: no *_single names, only all_gather_into_tensor / reduce_scatter_tensor."""
    calls = []
    monkeypatch.delattr(dist, "all_gather_single", raising=False)
    monkeypatch.delattr(dist, "reduce_scatter_single", raising=False)
    monkeypatch.setattr(dist, "all_gather_into_tensor",
                        lambda o, i, group=None, async_op=False: calls.append(("ag", o.numel(), i.numel(), async_op)))
    monkeypatch.setattr(dist, "reduce_scatter_tensor",
                        lambda o, i, op=None, group=None, async_op=False: calls.append(("rs", o.numel(), i.numel(), op)))
    compat.all_gather_single(torch.empty(4), torch.empty(2), async_op=True)
    compat.reduce_scatter_single(torch.empty(2), torch.empty(4), op=dist.ReduceOp.MAX)
    assert calls == [("ag", 4, 2, True), ("rs", 2, 4, dist.ReduceOp.MAX)]


def test_neither_name_is_a_clear_error(monkeypatch):
    for name in ("all_gather_single", "all_gather_into_tensor"):
        monkeypatch.delattr(dist, name, raising=False)
    with pytest.raises(RuntimeError, match="neither all_gather_single nor all_gather_into_tensor"):
        compat.all_gather_single(torch.empty(2), torch.empty(1))


@pytest.mark.parametrize("version,ok", [("2.14.1+cu130", True), ("2.13.0+cpu", True), ("2.15.0a0+git", True),
                                        ("2.12.1+cu126", True), ("2.11.0", True), ("2.10.0+cu128", True),
                                        ("2.9.1", False), ("1.13.1", False)])
def test_oldest_torch(monkeypatch, version, ok):
    """The floor is 2.10: the suite and every notebook pass on 2.10.0, 2.9.1 fails (docs/testing.md)."""
    monkeypatch.setattr(torch, "__version__", version)
    if ok:
        compat.check_torch_version()
    else:
        with pytest.raises(RuntimeError, match=r"torch >= 2\.10, found .*pip install"):
            compat.check_torch_version()


def test_wrappers_on_a_real_group_of_one(gloo_group_of_one):
    """World size 1 over gloo: gather and reduce-scatter are copies, through whichever name torch has."""
    x = torch.arange(3.0)
    out = torch.empty(3)
    compat.all_gather_single(out, x)
    torch.testing.assert_close(out, x)
    rs = torch.empty(3)
    compat.reduce_scatter_single(rs, x.clone())
    torch.testing.assert_close(rs, x)


def test_launch_refuses_a_too_old_torch_before_starting_anything(monkeypatch, starts_processes):
    from mgpu_utils.launch.launcher import launch
    monkeypatch.setattr(torch, "__version__", "2.4.1")
    with pytest.raises(RuntimeError, match=r"needs torch >= 2\.10, found 2\.4\.1"):
        launch("hello_dist.py", nproc=2)
