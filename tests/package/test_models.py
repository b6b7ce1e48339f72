"""mgpu_utils.models: the capstone's TinyLlama, piece by piece against a reference written another way."""
import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from mgpu_utils.models import LlamaConfig, RMSNorm, pipeline_stage, rotary, tiny_llama


def tokens(b=2, s=16, seed=0):
    return torch.randint(0, 256, (b, s), generator=torch.Generator().manual_seed(seed))


def test_default_size_tied_weights_and_shapes():
    model = tiny_llama()
    assert sum(p.numel() for p in model.parameters()) == 164_416          # the docstring's number
    assert model.output.weight is model.tok_embeddings.weight              # tied: one tensor, listed once
    assert "output.weight" not in dict(model.named_parameters())
    assert model(tokens()).shape == (2, 16, 256)


def test_the_seed_decides_the_weights():
    a, b, c = tiny_llama(seed=0), tiny_llama(seed=0), tiny_llama(seed=1)
    for (n, p), q, r in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(p, q), n
        assert "norm" in n or not torch.equal(p, r), n                     # norms start at 1 whatever the seed


def test_causal_a_later_token_changes_no_earlier_logit():
    model, x = tiny_llama(), tokens()
    y = x.clone()
    y[:, 10] = (y[:, 10] + 1) % 256
    with torch.no_grad():
        a, b = model(x), model(y)
    assert_close(a[:, :10], b[:, :10])
    assert (a[:, 10:] - b[:, 10:]).abs().max() > 1e-4                      # ... and does change the later ones


def test_rmsnorm_matches_torch():
    norm, x = RMSNorm(8), torch.randn(3, 5, 8)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    assert_close(norm(x), F.rms_norm(x, (8,), norm.weight, eps=1e-5))


def test_rotary_is_a_complex_rotation_and_depends_on_relative_position():
    b, s, h, d = 1, 6, 2, 8
    x = torch.randn(b, s, h, d, dtype=torch.float64)
    inv = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    z = torch.complex(x[..., : d // 2], x[..., d // 2:]) * torch.polar(torch.ones(s, d // 2, dtype=torch.float64),
                                                                        torch.arange(s)[:, None] * inv)[None, :, None]
    assert_close(rotary(x), torch.cat([z.real, z.imag], -1))             # pair (i, i + d/2) times e^{i s theta_i}
    q, k = torch.randn(d), torch.randn(d)                                  # the same q and k at every position
    rq, rk = rotary(q.expand(1, s, 1, d).clone())[0, :, 0], rotary(k.expand(1, s, 1, d).clone())[0, :, 0]
    scores = rq @ rk.T                                                     # [query position, key position]
    assert_close(scores[3, 1], scores[5, 3])
    assert_close(scores[4, 4], scores[0, 0])
    assert (scores[3, 1] - scores[3, 2]).abs() > 1e-3


def test_grouped_query_attention_equals_multi_head_with_repeated_kv_heads():
    """Query head h reads kv head h // (heads / kv_heads): repeating wk, wv's head rows gives the same model."""
    gqa = tiny_llama(LlamaConfig(heads=4, kv_heads=2))
    mha = tiny_llama(LlamaConfig(heads=4, kv_heads=4))
    sd = gqa.state_dict()
    for name, t in list(sd.items()):
        if name.endswith(("wk.weight", "wv.weight")):
            sd[name] = t.view(2, 16, 64).repeat_interleave(2, 0).reshape(64, 64)
    mha.load_state_dict(sd)
    x = tokens()
    with torch.no_grad():
        assert_close(mha(x), gqa(x))


def test_bad_shapes_are_refused_with_the_rule():
    with pytest.raises(ValueError, match="divisible by kv_heads"):
        LlamaConfig(heads=4, kv_heads=3)
    with pytest.raises(ValueError, match="even head"):
        LlamaConfig(width=60, heads=4)


def test_mixture_of_experts_option():
    from mgpu_utils.parallel.experts import MoE

    with pytest.raises(ValueError, match="moe_layer=MoE"):
        tiny_llama(LlamaConfig(experts=4))
    model = tiny_llama(LlamaConfig(experts=4, top_k=2), moe_layer=MoE)
    x = tokens()
    F.cross_entropy(model(x).flatten(0, 1), x.flatten()).backward()
    block = model.layers["0"]
    assert block.feed_forward.routing["load"].sum().item() == 2 * 16 * 2        # every token to 2 experts
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("n", [1, 2, 4])
def test_pipeline_stages_chained_are_the_model(n):
    x, stages = tokens(), [pipeline_stage(tiny_llama(), s, n) for s in range(n)]
    h = x
    with torch.no_grad():
        for stage in stages:
            h = stage(h)
        assert_close(h, tiny_llama()(x))
    names = [k for m in stages for k, _ in m.named_parameters()]
    assert len(names) == len(set(names)) and ("output.weight" in names) == (n > 1)     # the tied copy, last stage
    with pytest.raises(ValueError, match="dividing the 4 blocks"):
        pipeline_stage(tiny_llama(), 0, 3)
