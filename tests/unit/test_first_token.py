"""The first-token control (posgen.llm.first_token): what the model sees at position 0, and nothing else."""

from __future__ import annotations

import pytest
import torch

from posgen.llm.first_token import first_token_replaced, mean_embedding
from posgen.testing.tiny import corpus_tokenizer, tiny_family_config


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_the_first_token_sees_the_mean_embedding_and_the_rest_is_unchanged(arch):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_family_config(arch, corpus_tokenizer(512))).eval()
    embed = model.get_input_embeddings()
    n_vocab = embed.weight.shape[0]
    # the mean through the module (Gemma scales its embedding by sqrt(hidden)): an explicit average
    expected = embed(torch.arange(n_vocab)[None])[0].double().mean(0)
    torch.testing.assert_close(mean_embedding(embed, n_vocab), expected)
    ids = torch.randint(0, n_vocab, (1, 12))
    seen = {}

    def first_layer_input(_module, args, kwargs):  # the residual stream entering layer 0
        seen["x"] = args[0] if args else kwargs["hidden_states"]

    handle = model.model.layers[0].register_forward_pre_hook(first_layer_input, with_kwargs=True)
    with torch.no_grad():
        model(input_ids=ids)
        plain = seen["x"].clone()
        with first_token_replaced(model, "mean-embedding"):
            model(input_ids=ids)
            controlled = seen["x"].clone()
        model(input_ids=ids)
        after = seen["x"].clone()
    handle.remove()
    torch.testing.assert_close(controlled[0, 0].double(), expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(controlled[0, 1:], plain[0, 1:])  # every later input embedding unchanged
    torch.testing.assert_close(after, plain)  # the hook is gone on leaving
    with pytest.raises(ValueError, match=r"models\[\]\.first_token: 'zero'"):
        with first_token_replaced(model, "zero"):
            pass
