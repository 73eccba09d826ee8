"""Random-init weights (posgen.models.init_weights): each tensor drawn once on the meta-built model, the same
distribution and the same buffers as transformers' ``from_config``, and reproducible from the seed."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from posgen.models import init_weights
from posgen.testing.tiny import ARCHITECTURES, corpus_tokenizer, tiny_family_config


@pytest.fixture(scope="module")
def tokenizer():
    return corpus_tokenizer(512)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_each_tensor_is_drawn_like_from_config(arch, tokenizer):
    config = tiny_family_config(arch, tokenizer)
    torch.manual_seed(0)
    reference = AutoModelForCausalLM.from_config(config)
    fresh, again = init_weights(config, 0), init_weights(config, 0)
    other = init_weights(config, 1)
    expected, got, repeat, reseeded = (m.state_dict() for m in (reference, fresh, again, other))
    assert expected.keys() == got.keys()
    drawn = 0
    for name, want in expected.items():
        want, have = want.float(), got[name].float()
        assert torch.equal(have, repeat[name].float()), f"{name}: not reproducible from the seed"
        if want.std() == 0 or want.numel() < 512:  # constants (norms, biases) and small tensors: exactly equal
            assert torch.equal(have, want) or want.std() > 0, name
            continue
        drawn += 1
        # two draws' means differ by ~std sqrt(2 / n), their stds by ~std sqrt(1 / n): 10 % or 5 standard errors
        n = want.numel()
        assert abs(float(have.std() - want.std())) < max(0.1, 5 * n**-0.5) * float(want.std()), (
            f"{name}: std {have.std()} vs {want.std()}"
        )
        assert abs(float(have.mean() - want.mean())) < max(0.1, 5 * (2 / n) ** 0.5) * float(want.std()), name
        assert not torch.equal(have, reseeded[name].float()), f"{name}: another seed drew the same tensor"
    assert drawn >= 4
    for (name, want), (_, have) in zip(reference.named_buffers(), fresh.named_buffers(), strict=True):
        assert torch.allclose(want.float(), have.float(), equal_nan=True), f"buffer {name}"
    if config.tie_word_embeddings:
        assert fresh.get_output_embeddings().weight is fresh.get_input_embeddings().weight


def test_garbage_storage_is_overwritten(tokenizer):
    """to_empty leaves whatever was in memory; every parameter and buffer must be drawn or computed after it."""
    config = tiny_family_config("llama", tokenizer)
    torch.manual_seed(0)
    reference = AutoModelForCausalLM.from_config(config)
    filler = [torch.full((1 << 20,), float("nan")) for _ in range(8)]  # freed below: likely reused storage
    del filler
    model = init_weights(config, 0)
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        assert torch.isfinite(tensor).all(), name
    norms = [p for n, p in model.named_parameters() if n.endswith("norm.weight")]
    assert norms and all(torch.equal(p, torch.ones_like(p)) for p in norms)
    assert torch.equal(model.model.rotary_emb.inv_freq, reference.model.rotary_emb.inv_freq)
