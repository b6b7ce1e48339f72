"""Unit tests of mgpu_utils.dist (no processes started)."""
import json

import pytest

from mgpu_utils.dist import (RESULT_MARKER, DistEnv, choose_backend, emit_result, get_dist_env,
                             parse_result)


def test_env_without_torchrun_is_world_size_1():
    assert get_dist_env({}) == DistEnv(0, 0, 1, 1, False)


def test_env_from_torchrun_variables():
    env = get_dist_env({"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"})
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size, env.under_torchrun) == (5, 1, 8, 4, True)


@pytest.mark.parametrize("bad", [{"RANK": "4", "WORLD_SIZE": "4"}, {"RANK": "x", "WORLD_SIZE": "2"},
                                 {"RANK": "0"}])
def test_env_inconsistent_is_refused(bad):
    with pytest.raises(ValueError):
        get_dist_env(bad)


@pytest.mark.parametrize("ranks,gpus,expected", [(4, 0, "gloo"), (4, 1, "gloo"), (4, 3, "gloo"),
                                                 (4, 4, "nccl"), (2, 8, "nccl"), (1, 1, "nccl")])
def test_backend_follows_gpus(ranks, gpus, expected):
    backend, reason = choose_backend(ranks, num_gpus=gpus, forced=None)
    assert backend == expected and reason


def test_forced_backend(monkeypatch):
    assert choose_backend(4, num_gpus=0, forced="gloo")[0] == "gloo"
    with pytest.raises(ValueError, match="one GPU per rank"):
        choose_backend(2, num_gpus=1, forced="nccl")
    with pytest.raises(ValueError, match="gloo' or 'nccl"):
        choose_backend(2, num_gpus=0, forced="mpi")
    monkeypatch.setenv("MGPU_BACKEND", "gloo")
    assert choose_backend(2, num_gpus=2)[0] == "gloo"


def test_result_roundtrip(capsys, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    emit_result({"a": 1, "b": [1.5]})
    out = capsys.readouterr().out
    assert out.startswith(RESULT_MARKER)
    assert parse_result("noise\n" + out + "more noise\n") == {"a": 1, "b": [1.5]}
    emit_result({"a": 2}, rank=1)                       # only rank 0 prints
    assert capsys.readouterr().out == ""
    assert parse_result("nothing here") is None
    assert parse_result(RESULT_MARKER + json.dumps({"x": 1}) + "\n" + RESULT_MARKER + '{"x": 2}') == {"x": 2}
