"""Exercises 04.4 to 04.6's graders (mgpu_utils.grading.coding.collectives), round 2 of issue 55: rings written
as students write them (isend/irecv pairs, P2POp lists in either order, blocking calls ordered by parity, the
ring turned the other way, a 2-D view instead of a list of chunks) pass; wrong ones get the hint that names the
mistake made. 04.4 and 04.5 are graded in one launch per list at 3 ranks; 04.6 (a script) one launch per file."""
import re

import pytest

from helpers import wrong
from mgpu_utils.grading.runner import grade, grade_many

# 04.4 ---------------------------------------------------------------------------------------------------------
OPS_044 = ("        ops = [dist.P2POp(dist.isend, out[send_index], right), dist.P2POp(dist.irecv, out[recv_index], "
           "left)]\n        for work in dist.batch_isend_irecv(ops):\n            work.wait()\n")
INDICES_044 = ("        send_index = (rank - step) % world          "
               "# own tensor first, then the one received last step\n"
               "        recv_index = (rank - step - 1) % world\n")
OUT_044 = "    out = [torch.empty_like(x) for _ in range(world)]\n    out[rank] = x.clone()\n"

RIGHT_044 = {   # name: (text of the solution, replaced by)
    "isend and irecv, then both waited": (
        OPS_044, "        send = dist.isend(out[send_index], right)\n        recv = dist.irecv(out[recv_index], left)\n"
                 "        send.wait()\n        recv.wait()\n"),
    "the receive listed first for batch_isend_irecv": (
        OPS_044, "        ops = [dist.P2POp(dist.irecv, out[recv_index], left), "
                 "dist.P2POp(dist.isend, out[send_index], right)]\n"
                 "        for work in dist.batch_isend_irecv(ops):\n            work.wait()\n"),
    "blocking calls, even ranks send first and odd ranks receive first": (
        OPS_044, "        if rank % 2 == 0:\n            dist.send(out[send_index], right)\n"
                 "            dist.recv(out[recv_index], left)\n        else:\n"
                 "            dist.recv(out[recv_index], left)\n            dist.send(out[send_index], right)\n"),
    "the ring turned the other way (send left, receive from the right)": (
        [INDICES_044, OPS_044],
        ["        send_index = (rank + step) % world\n        recv_index = (rank + step + 1) % world\n",
         "        ops = [dist.P2POp(dist.isend, out[send_index], left), dist.P2POp(dist.irecv, out[recv_index], "
         "right)]\n        for work in dist.batch_isend_irecv(ops):\n            work.wait()\n"]),
    "views of one buffer (unbind), own row copied in": (
        OUT_044, "    out = list(torch.empty((world,) + x.shape, dtype=x.dtype).unbind(0))\n    out[rank].copy_(x)\n"),
    "a new tensor received each step, then put in its slot": (
        [OUT_044, OPS_044],
        ["    out = [None] * world\n    out[rank] = x.clone()\n",
         "        got = torch.empty_like(x)\n"
         "        ops = [dist.P2POp(dist.isend, out[send_index], right), dist.P2POp(dist.irecv, got, left)]\n"
         "        for work in dist.batch_isend_irecv(ops):\n            work.wait()\n        out[recv_index] = got\n"]),
}

WRONG_044 = {   # name: (text of the solution, replaced by, the hint it must get at 3 ranks)
    "one receive buffer for every step": (
        [OUT_044, OPS_044],
        ["    out = [None] * world\n    out[rank] = x.clone()\n    got = torch.empty_like(x)\n",
         "        ops = [dist.P2POp(dist.isend, out[send_index], right), dist.P2POp(dist.irecv, got, left)]\n"
         "        for work in dist.batch_isend_irecv(ops):\n            work.wait()\n        out[recv_index] = got\n"],
        r"rank 0: the entries for ranks 1 and 2 are one and the same tensor \(world size 3, length 1\).* a buffer "
        r"reused for every receive"),
    "the list made with [t] * world": (
        "    out = [torch.empty_like(x) for _ in range(world)]\n", "    out = [torch.empty_like(x)] * world\n",
        r"rank 0: the entries for ranks 1 and 2 are one and the same tensor \(world size 3, length 1\): \[t\] \* W"),
    "its own slot never filled": (
        "    out[rank] = x.clone()\n", "",
        r"rank 0: its own entry, out\[0\], was never written \(world size 3, length 1\)"),
    "one step short": (
        "    for step in range(world - 1):\n", "    for step in range(world - 2):\n",
        r"rank 0: the entry for rank 1 was never written \(world size 3, length 1\)"),
    "the entries stacked into one tensor": (
        "    return out\n", "    return torch.stack(out)\n",
        r"rank 0: returned Tensor, expected a list of 3 tensors"),
}

# 04.5 ---------------------------------------------------------------------------------------------------------
OPS_045 = ("        ops = [dist.P2POp(dist.isend, chunks[send_index], right), dist.P2POp(dist.irecv, incoming, left)]\n"
           "        for work in dist.batch_isend_irecv(ops):\n            work.wait()\n")
INDICES_045 = ("        send_index = (rank - step - 1) % world       "
               "# ends, after W - 1 steps, with chunk `rank` complete\n"
               "        recv_index = (rank - step - 2) % world\n")
ADD_045 = "        chunks[recv_index] += incoming\n"
RETURN_045 = "    return chunks[rank]\n"

RIGHT_045 = {
    "isend and irecv, then both waited": (
        OPS_045, "        send = dist.isend(chunks[send_index], right)\n        recv = dist.irecv(incoming, left)\n"
                 "        send.wait()\n        recv.wait()\n"),
    "a 2-D view of a copy of x instead of a list of chunks": (
        "    chunks = [c.clone() for c in x.chunk(world)]\n", "    chunks = x.clone().view(world, -1)\n"),
    "the ring turned the other way (send left, receive from the right)": (
        [INDICES_045, OPS_045],
        ["        send_index = (rank + step + 1) % world\n        recv_index = (rank + step + 2) % world\n",
         "        ops = [dist.P2POp(dist.isend, chunks[send_index], left), dist.P2POp(dist.irecv, incoming, right)]\n"
         "        for work in dist.batch_isend_irecv(ops):\n            work.wait()\n"]),
    "a fresh incoming tensor each step, added with torch.add(out=)": (
        [OPS_045, ADD_045],
        ["        incoming = torch.empty_like(chunks[0])\n" + OPS_045,
         "        torch.add(chunks[recv_index], incoming, out=chunks[recv_index])\n"]),
    "blocking calls, even ranks send first and odd ranks receive first": (
        OPS_045, "        if rank % 2 == 0:\n            dist.send(chunks[send_index], right)\n"
                 "            dist.recv(incoming, left)\n        else:\n"
                 "            dist.recv(incoming, left)\n            dist.send(chunks[send_index], right)\n"),
}

WRONG_045 = {
    "the mean instead of the sum": (
        RETURN_045, "    return chunks[rank] / world\n",
        r"rank 0: returned the mean over the 3 ranks of chunk 0, not their sum"),
    "the whole tensor returned": (
        RETURN_045, "    return torch.cat(chunks)\n",
        r"rank 0: returned torch.Size\(\[3\]\), expected torch.Size\(\[1\]\)"),
    "the incoming partial sum added to the chunk just sent": (
        ADD_045, "        chunks[send_index] += incoming\n",
        r"rank 0: returned its own share of chunk 0, unchanged \(world size 3\): nothing from the other ranks"),
    "the chunk after this rank's returned": (
        RETURN_045, "    return chunks[(rank + 1) % world]\n",
        r"rank 0: returned chunk 1 summed over ranks \[0, 2\] only, where reduce-scatter gives chunk 0 summed over "
        r"all 3 \(world size 3, chunks of 1\)"),
}

# 04.6 ---------------------------------------------------------------------------------------------------------
ALL_REDUCE = "dist.all_reduce(t)  "

RIGHT_046 = {
    "an explicit ReduceOp.SUM": (ALL_REDUCE, "dist.all_reduce(t, op=dist.ReduceOp.SUM)  "),
    "a reduce to rank 0, then a broadcast from it, on every rank": (
        ALL_REDUCE, "dist.reduce(t, dst=0)\n        dist.broadcast(t, src=0)  "),
    "every rank's t gathered, then summed": (
        ALL_REDUCE, "parts = [t.clone() for _ in range(ctx.world_size)]\n        dist.all_gather(parts, t)\n"
                    "        t = sum(parts)  "),
}

WRONG_046 = {
    "the maximum instead of the sum": (
        ALL_REDUCE, "dist.all_reduce(t, op=dist.ReduceOp.MAX)  ",
        r"rank 0 ends with .*, the element-wise maximum over the ranks, not their sum .* and so does every rank"),
    "the mean instead of the sum": (
        ALL_REDUCE, "dist.all_reduce(t)\n        t /= ctx.world_size  ",
        r"rank 0 ends with .*, the mean over the 2 ranks, not their sum .* and so does every rank"),
}


def _cases(tmp_path, exercise_id, table):
    out = []
    for k, (name, (old, new, *_)) in enumerate(table.items()):
        folder = tmp_path / f"{exercise_id}_{k}"
        folder.mkdir()
        out.append((exercise_id, wrong(folder, exercise_id, old, new)))
    return out


RINGS = {"04.4": (RIGHT_044, WRONG_044), "04.5": (RIGHT_045, WRONG_045)}


def test_right_rings_pass(tmp_path, starts_processes):
    cases, names = [], []
    for exercise_id, (right, _) in RINGS.items():
        cases += _cases(tmp_path, exercise_id, right)
        names += [f"{exercise_id} {n}" for n in right]
    hints = grade_many(cases, 3)
    assert hints == [None] * len(cases), {n: h for n, h in zip(names, hints) if h}


def test_wrong_rings_get_their_hints(tmp_path, starts_processes):
    cases, wants = [], []
    for exercise_id, (_, bad) in RINGS.items():
        cases += _cases(tmp_path, exercise_id, bad)
        wants += [(f"{exercise_id} {n}", want) for n, (*_, want) in bad.items()]
    hints = grade_many(cases, 3)
    failed = {name: hint for (name, want), hint in zip(wants, hints) if not (hint and re.search(want, hint))}
    assert not failed, failed


@pytest.mark.parametrize("name", list(RIGHT_046) + list(WRONG_046))
def test_the_hang_fixed_other_ways(name, tmp_path, starts_processes):
    """04.6 runs as a script (one launch each, at 2 ranks): right fixes pass, wrong ones get their hints."""
    old, new, *want = {**RIGHT_046, **WRONG_046}[name]
    passed, hint = grade("04.6", wrong(tmp_path, "04.6", old, new), world_sizes=(2,))
    if name in RIGHT_046:
        assert passed, hint
    else:
        assert not passed and re.search(want[0], hint), hint


#: Right and wrong variants per exercise in this file (test_runner.py counts them against issue 55's bar).
COUNTS = {"04.4": (len(RIGHT_044), len(WRONG_044)), "04.5": (len(RIGHT_045), len(WRONG_045)),
          "04.6": (len(RIGHT_046), len(WRONG_046))}
