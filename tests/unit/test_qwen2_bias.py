"""Qwen2's q/k/v projections carry a bias (large in the released models: |k bias| up to ~145 in
Qwen2.5-Coder-0.5B). A random init leaves it zero, so the families test would pass even if the capture dropped
it: here a tiny Qwen2 gets large random biases, and the stored pre-RoPE q/k must include them (compared with the
projection computed by hand) while the all-layer self-check holds them to the model's own logits."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from posgen.corpus import cut_windows, load_text
from posgen.llm.extract import extract
from posgen.llm.options import ExtractOptions
from posgen.models import acquire, load_model
from posgen.store import open_dataset, write_netcdf
from posgen.testing.tiny import corpus_tokenizer, tiny_family_config, tiny_job


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    """A tiny Qwen2 (2 layers, 4 q / 2 kv heads, head dim 16) with q/k/v biases of scale 2, extracted."""
    from transformers import AutoModelForCausalLM

    tmp = tmp_path_factory.mktemp("qwen2-bias")
    tokenizer = corpus_tokenizer(512)
    config = tiny_family_config("qwen2", tokenizer)
    assert config.model_type == "qwen2"
    torch.manual_seed(7)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                param.mul_(8.0)  # attention far from uniform, as make_tiny does
            if name.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias")):
                assert not param.any()  # the default init: zero, hence this test
                param.normal_(0.0, 2.0)
    model.save_pretrained(tmp / "src")
    tokenizer.save_pretrained(tmp / "src")
    acquire(f"local:{tmp / 'src'}", tmp / "model")
    write_netcdf(cut_windows(load_text("embedded"), tokenizer, 2, 32, 0, "embedded"), tmp / "windows.h5")
    report = extract(
        tiny_job(tmp / "model", tmp / "windows.h5", tmp / "qk.h5", model="qwen2", variant="trained"),
        ExtractOptions.defaults(check_tokens=0),
    )
    return tmp, report, open_dataset(tmp / "qk.h5", lazy=False)


def test_stored_q_and_k_are_the_biased_projections_before_rope(qwen2):
    tmp, _, ds = qwen2
    model, _, _ = load_model(tmp / "model")
    attn = model.model.layers[0].self_attn
    assert attn.q_proj.bias.abs().max() > 1 and attn.k_proj.bias.abs().max() > 1
    assert ds["rope_layout"].values.tolist() == ["half", "half"]
    assert ds["dim_order"].values[0].tolist() == list(range(16))  # half layout: stored dims are the model's
    ids = torch.from_numpy(open_dataset(tmp / "windows.h5", lazy=False)["token_id"].values)
    with torch.no_grad():
        x = model.model.layers[0].input_layernorm(model.model.embed_tokens(ids))  # layer 0's attention input
        q = attn.q_proj(x).unflatten(-1, (4, 16)).transpose(1, 2)  # (sample, head, token, dim), bias included
        k = attn.k_proj(x).unflatten(-1, (2, 16)).transpose(1, 2)
        q_no_bias = (x @ attn.q_proj.weight.T).unflatten(-1, (4, 16)).transpose(1, 2)
    stored_q = torch.from_numpy(ds["q"].values[:, 0])
    stored_k = torch.from_numpy(ds["k"].values[:, 0])
    assert stored_q.shape == q.shape and stored_k.shape == k.shape
    torch.testing.assert_close(stored_q, q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(stored_k, k, rtol=1e-5, atol=1e-5)
    assert (stored_q - q_no_bias).abs().max() > 1  # the bias is in what was stored, and it matters


def test_biased_qwen2_passes_transparency_and_the_all_layer_self_check(qwen2):
    _, report, ds = qwen2
    assert report["transparency_rel_error"] <= 1e-5
    assert ds.attrs["self_check_tokens"] == 32
    errors = ds["self_check_rel_error"].values
    assert errors.shape == (2,) and np.isfinite(errors).all() and (errors <= 1e-4).all()
    assert ds.attrs["architecture"] == "Qwen2ForCausalLM"
