"""The recorded paper-model shapes build the real architectures (checked by their published parameter counts)."""

import pytest

from posgen.shapes import PAPER_SHAPES, parameter_count, shape_config

# parameter counts the model cards publish (rounded to 10 M)
PUBLISHED_BILLIONS = {"llama-3.1-8b": 8.03, "mistral-7b": 7.24, "qwen2.5-7b": 7.62, "gemma-2-9b": 9.24}


@pytest.mark.parametrize("name", sorted(PAPER_SHAPES))
def test_paper_shape_has_the_published_parameter_count(name):
    assert parameter_count(shape_config(name)) / 1e9 == pytest.approx(PUBLISHED_BILLIONS[name], abs=0.006)


def test_truncated_shape_keeps_rope_scaling_and_layer_types():
    llama = shape_config("llama-3.1-8b", n_layers=2)
    assert llama.num_hidden_layers == 2
    assert llama.rope_parameters["rope_type"] == "llama3"
    assert llama.rope_parameters["rope_theta"] == 500000.0
    gemma = shape_config("gemma-2-9b", n_layers=3)
    assert gemma.layer_types == ["sliding_attention", "full_attention", "sliding_attention"]
    assert gemma.attn_logit_softcapping == 50.0
    with pytest.raises(KeyError, match="no recorded shape"):
        shape_config("llama-9000")
