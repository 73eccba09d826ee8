"""Every decoder family on a tiny random checkpoint: canonical RoPE layout, transparency check, all-layer
self-check and decomposition; refused families with their one-line message."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import xarray as xr

from posgen import rope
from posgen.corpus import cut_windows, load_text
from posgen.decomposition import decompose_store
from posgen.decomposition.options import DecompositionOptions
from posgen.llm import families
from posgen.llm.extract import TransparencyError, extract
from posgen.llm.options import ExtractOptions
from posgen.models import acquire, load_model
from posgen.store import open_dataset, write_netcdf
from posgen.testing.tiny import corpus_tokenizer, make_tiny, tiny_job

# arch: (rope_layout per attention layer, rotary_dims per layer, model layer index of each)
SUPPORTED = {
    "llama": (["half"] * 2, [16, 16], [0, 1]),
    "llama-llama3": (["half"] * 2, [16, 16], [0, 1]),
    "llama-yarn": (["half"] * 2, [16, 16], [0, 1]),
    "mistral": (["half"] * 2, [16, 16], [0, 1]),
    "qwen2": (["half"] * 2, [16, 16], [0, 1]),
    "qwen3": (["half"] * 2, [16, 16], [0, 1]),
    "gemma2": (["half"] * 2, [16, 16], [0, 1]),
    "gemma3": (["half"] * 3, [16, 16, 16], [0, 1, 2]),
    "gemma4": (["half"] * 4, [16, 32, 16, 32], [0, 1, 2, 3]),  # 32-dim full-layer heads, 4 of 16 bands rotate
    "olmo2": (["half"] * 2, [16, 16], [0, 1]),
    "olmo3": (["half"] * 2, [16, 16], [0, 1]),
    "granite": (["half"] * 2, [16, 16], [0, 1]),
    "gpt-neox": (["half"] * 2, [4, 4], [0, 1]),  # partial rotary 0.25, fused per-head qkv
    "phi3": (["half"] * 2, [12, 12], [0, 1]),  # partial rotary 0.75, fused [q | k | v]
    "phi": (["half"] * 2, [8, 8], [0, 1]),
    "stablelm": (["half"] * 2, [4, 4], [0, 1]),
    "cohere": (["interleaved"] * 2, [16, 16], [0, 1]),
    "cohere2": (["interleaved", "none"], [16, 0], [0, 1]),  # NoPE on its full-attention layer
    "llama4": (["interleaved", "none"], [16, 0], [0, 1]),
    "smollm3": (["half", "none"], [16, 0], [0, 1]),
    "gpt-oss": (["half"] * 2, [16, 16], [0, 1]),  # attention sinks
    "qwen3-next": (["half"], [4], [1]),  # layer 0 is linear attention
    "qwen3.5": (["half"], [4], [1]),  # layer 0 is linear attention
    "ministral3": (["half"] * 2, [16, 16], [0, 1]),
    "glm": (["interleaved"] * 2, [8, 8], [0, 1]),  # interleaved pairs in the first half of each head
    "deepseek-v2": (["interleaved"] * 2, [8, 8], [0, 1]),  # MLA: the last 8 of 16 q/k dims rotated
    "deepseek-v3": (["interleaved"] * 2, [8, 8], [0, 1]),  # MLA, rotation returns the pairs half-split
}
# head size per layer where the layers differ (else every layer's is the store's dim); bands with a frequency
HEAD_DIMS = {"gemma4": [16, 32, 16, 32]}
ROTATING_BANDS = {"gemma4": [8, 4, 8, 4]}  # proportional RoPE: a quarter of the 32-dim heads rotates
REFUSED = {
    "gptj": "GPTJForCausalLM (gptj): not supported: attention computed outside transformers' AttentionInterface",
    "falcon": "FalconForCausalLM (falcon): not supported: attention computed outside transformers' AttentionInterface",
}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A shared tokenizer and a 2-window windows.h5 (40 tokens: longer than the 16-token sliding windows)."""
    tmp = tmp_path_factory.mktemp("families")
    tokenizer = corpus_tokenizer(512)
    write_netcdf(cut_windows(load_text("embedded"), tokenizer, 2, 40, 0, "embedded"), tmp / "windows.h5")
    return tmp, tokenizer


def _model(workspace, arch: str):
    tmp, tokenizer = workspace
    model_dir = tmp / arch / "model"
    if not model_dir.exists():
        acquire(f"local:{make_tiny(tmp / arch / 'src', arch, tokenizer=tokenizer)}", model_dir)
    return model_dir


@pytest.mark.parametrize("arch", list(SUPPORTED))
def test_family_passes_transparency_and_all_layer_self_check(workspace, arch):
    tmp, _ = workspace
    model_dir = _model(workspace, arch)
    qk = tmp / arch / "qk.h5"
    report = extract(
        tiny_job(model_dir, tmp / "windows.h5", qk, model=arch, variant="trained"),
        ExtractOptions.defaults(check_tokens=0),
    )
    ds = open_dataset(qk, lazy=False)
    layouts, rotary_dims, layer_index = SUPPORTED[arch]
    assert ds["rope_layout"].values.tolist() == layouts
    assert ds["rotary_dims"].values.tolist() == rotary_dims
    assert ds["layer_index"].values.tolist() == layer_index
    position = "last" if arch.startswith("deepseek") else "first"  # MLA heads are [nope | rope]
    assert ds["rotary_position"].values.tolist() == [position] * len(layouts)
    assert report["transparency_rel_error"] <= 1e-5 and ds.attrs["transparency_rel_error"] <= 1e-5
    # every layer checked on the whole window, none left NaN
    assert ds.attrs["self_check_tokens"] == 40
    errors = ds["self_check_rel_error"].values
    assert errors.shape == (len(layouts),) and np.isfinite(errors).all() and (errors <= 1e-4).all()
    # what downstream code relies on: the rotating bands first with inv_freq > 0, the rest exactly 0 (NoPE: all)
    inv = ds["inv_freq"].values
    head_dims = HEAD_DIMS.get(arch, [ds.sizes["dim"]] * len(layouts))
    assert ds["head_dims"].values.tolist() == head_dims
    for layer, r in enumerate(rotary_dims):
        bands = ROTATING_BANDS.get(arch, [d // 2 for d in rotary_dims])[layer]
        assert (inv[layer, :bands] > 0).all() and (inv[layer, bands:] == 0).all()
        if r == 0:
            assert ds["attention_scaling"].values[layer] == 1.0
        # dim_order is a permutation of the layer's head dims; -1 marks the dims a smaller head is padded with
        order = ds["dim_order"].values[layer]
        assert sorted(order[order >= 0].tolist()) == list(range(head_dims[layer]))
        assert (order < 0).sum() == ds.sizes["dim"] - head_dims[layer]
        assert not ds["q"].values[:, layer][..., order < 0].any() and not ds["k"].values[:, layer][..., order < 0].any()

    out = tmp / arch / "decomposition.nc"
    decompose_store(
        qk,
        out,
        DecompositionOptions.defaults(dummy_distances=[0, 20], dummy_distance=20, bound_samples=0, device="cpu"),
        progress=False,
    )
    dec = xr.open_dataset(out, engine="h5netcdf")
    assert dec.sizes["layer"] == len(layouts)
    assert np.isfinite(dec["r"].sel({"method": "B"}).values).all()


def test_gemma4_shared_layers_store_the_keys_they_attend_with(workspace):
    """Gemma 4's last layers have no key projection: they attend with the keys of the last earlier layer of their
    type, and the capture stores those keys for them (the self-check above holds them to the model's logits)."""
    tmp, _ = workspace
    _model(workspace, "gemma4")
    qk = tmp / "gemma4" / "qk.h5"
    if not qk.exists():
        test_family_passes_transparency_and_all_layer_self_check(workspace, "gemma4")
    k = open_dataset(qk, lazy=False)["k"].values  # (sample, layer, kv_head, token, dim)
    np.testing.assert_array_equal(k[:, 2], k[:, 0])
    np.testing.assert_array_equal(k[:, 3], k[:, 1])
    assert np.abs(k[:, 1] - k[:, 0]).max() > 0.1


def test_key_head_counts_that_differ_by_layer_are_refused_in_one_line(workspace):
    """Gemma 4 with ``attention_k_eq_v`` may give its full layers fewer key heads: the store has one ``kv_head``."""
    import transformers as tf

    from posgen.llm.capture import Capture
    from posgen.testing.tiny import tiny_family_config

    kwargs = tiny_family_config("gemma4", workspace[1]).to_dict()
    del kwargs["per_layer_config"]  # rebuilt from global_head_dim and num_global_key_value_heads
    kwargs |= {"global_head_dim": 32, "attention_k_eq_v": True, "num_global_key_value_heads": 1}
    config = tf.Gemma4TextConfig(**kwargs)
    model = tf.AutoModelForCausalLM.from_config(config)
    with pytest.raises(families.UnsupportedModelError) as err:
        Capture(model)
    assert str(err.value) == "gemma4_text: not supported: the number of key/value heads differs across layers ([1, 2])"


@pytest.mark.parametrize("arch", list(REFUSED))
def test_unsupported_family_is_refused_in_one_line_before_extraction(workspace, arch):
    tmp, _ = workspace
    model_dir = _model(workspace, arch)
    with pytest.raises(families.UnsupportedModelError) as err:
        extract(
            tiny_job(model_dir, tmp / "windows.h5", tmp / arch / "qk.h5", model=arch, variant="trained"),
            ExtractOptions.defaults(),
        )
    message = str(err.value)
    assert message.startswith(REFUSED[arch]) and "\n" not in message
    assert not (tmp / arch / "qk.h5").exists()


def test_dropped_attention_sinks_are_caught_by_the_transparency_check(workspace, monkeypatch):
    """A capture that runs SDPA where the model needs its eager attention (GPT-OSS sinks) changes the model."""
    tmp, _ = workspace
    model_dir = _model(workspace, "gpt-oss")
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def drops_sinks(module):
        def forward(module, query, key, value, attention_mask, s_aux=None, **kwargs):
            return sdpa_attention_forward(module, query, key, value, attention_mask.bool().logical_not(), **kwargs)

        return forward

    monkeypatch.setattr("posgen.llm.capture.eager_forward", drops_sinks)
    with pytest.raises(TransparencyError, match=r"^transparency check failed for GptOssForCausalLM: .* by \d"):
        extract(
            tiny_job(model_dir, tmp / "windows.h5", tmp / "broken.h5", model="gpt-oss", variant="trained"),
            ExtractOptions.defaults(),
        )
    assert not (tmp / "broken.h5").exists()


def test_sdpa_backend_refuses_sinks_instead_of_dropping_them(workspace):
    from posgen.llm.capture import BACKEND, Capture

    model, _, _ = load_model(_model(workspace, "gpt-oss"), attn_implementation=BACKEND)
    with torch.inference_mode(), Capture(model) as cap, pytest.raises(RuntimeError, match="s_aux"):
        cap.reset(8)
        model(input_ids=torch.arange(8)[None])


@pytest.mark.parametrize("arch", ["llama", "gemma2", "gpt-oss"])
def test_plain_backend_loads_sdpa_soft_capped_and_sink_families_and_matches_the_capturing_one(workspace, arch):
    """The benches' plain forward pass: SDPA where it can, eager for soft-capping (Gemma-2) and sinks (GPT-OSS),
    which SDPA refuses or drops; its logits are the capturing backend's."""
    from posgen.llm.capture import load_capturing

    model_dir = _model(workspace, arch)
    plain, _, _ = load_model(model_dir, attn_implementation=families.plain_backend)
    assert plain.config._attn_implementation == ("sdpa" if arch == "llama" else "eager")
    captured, _, _ = load_capturing(model_dir)
    ids = torch.arange(3, 27)[None]
    with torch.inference_mode():
        expected = captured(input_ids=ids).logits
        torch.testing.assert_close(plain(input_ids=ids).logits, expected, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------------------------------
# The canonical layout itself


def test_layout_permutations():
    assert families.make_layout(8, 8, "half", "first").identity
    assert families.make_layout(8, 8, "interleaved", "first").dim_order.tolist() == [0, 2, 4, 6, 1, 3, 5, 7]
    # rotated (0, 2), (1, 3); unrotated 4..7 paired (4, 6), (5, 7)
    assert families.make_layout(8, 4, "half", "first").dim_order.tolist() == [0, 1, 4, 5, 2, 3, 6, 7]
    # MLA-style: the last 4 dims rotated in interleaved pairs (4, 5), (6, 7)
    assert families.make_layout(8, 4, "interleaved", "last").dim_order.tolist() == [4, 6, 0, 1, 5, 7, 2, 3]
    assert families.make_layout(8, 0, "none", "first").identity


def _interleaved_rope(x, positions, inv_freq):
    """GPT-J style reference: pairs (2i, 2i+1) of the first 2 len(inv_freq) dims turn by p * inv_freq[i]."""
    out = x.clone()
    theta = positions[:, None].float() * inv_freq[None, :]  # (T, r/2)
    even, odd = x[..., 0 : 2 * len(inv_freq) : 2], x[..., 1 : 2 * len(inv_freq) : 2]
    out[..., 0 : 2 * len(inv_freq) : 2] = even * theta.cos() - odd * theta.sin()
    out[..., 1 : 2 * len(inv_freq) : 2] = odd * theta.cos() + even * theta.sin()
    return out


def test_canonical_rotation_reproduces_interleaved_partial_rope_and_detection_finds_it():
    g = torch.Generator().manual_seed(0)
    T, d = 12, 8
    inv_freq = 10000.0 ** (-torch.arange(2, dtype=torch.float32) / 2)  # r = 4 of 8 dims
    positions = torch.arange(T)
    q, k = torch.randn(3, T, d, generator=g), torch.randn(3, T, d, generator=g)
    q_rot, k_rot = _interleaved_rope(q, positions, inv_freq), _interleaved_rope(k, positions, inv_freq)
    layout, err = families.detect_layout(q, q_rot, k, k_rot, positions, inv_freq.numpy(), 1.0, 1e-5, "toy layer 0")
    assert (layout.rope_layout, layout.rotary_dims, layout.rotary_position) == ("interleaved", 4, "first")
    assert err < 1e-6
    # logits from canonical q/k with the zero-padded table equal the model's
    inv_c = torch.from_numpy(layout.canonical_inv_freq(inv_freq.numpy()))
    w = rope.logits(families.to_canonical(q, layout), families.to_canonical(k, layout), inv_c, 1.0)
    torch.testing.assert_close(w, q_rot @ k_rot.transpose(-1, -2), rtol=1e-5, atol=1e-5)


def test_unknown_rotation_is_refused_with_one_line():
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 10, 8, generator=g), torch.randn(2, 10, 8, generator=g)
    scrambled_q, scrambled_k = q.flip(-1) * 2, k.flip(-1) * 2  # not a rotation of any known layout
    inv = np.array([1.0, 0.1, 0.01, 0.001], dtype=np.float32)
    with pytest.raises(families.UnsupportedModelError, match=r"^Toy layer 3: no known RoPE layout .* error"):
        families.detect_layout(q, scrambled_q, k, scrambled_k, torch.arange(10), inv, 1.0, 1e-4, "Toy layer 3")


def test_identity_layout_is_skipped_not_applied():
    x = torch.randn(2, 5, 8)
    assert families.to_canonical(x, families.make_layout(8, 8, "half", "first")) is x


@pytest.mark.parametrize("arch", ["cohere", "gpt-neox", "smollm3", "deepseek-v3", "gemma4"])
def test_capped_backend_caps_distances_in_the_canonical_layout(workspace, arch):
    """Interleaved, partial-rotary, NoPE and MLA layers: attention weights under a distance cap C equal the softmax of
    s (R_min(i-j,C) q_i).k_j computed from the stored (canonical) q/k and frequencies."""
    from posgen.llm.capture import CAPPED_BACKEND, Capture, capped_distances, capped_logits, forward_pass

    model, _, _ = load_model(_model(workspace, arch), attn_implementation=CAPPED_BACKEND)
    T, C = 24, 5
    ids = torch.randint(3, 200, (2, T), generator=torch.Generator().manual_seed(1))
    with Capture(model) as recorder:
        forward_pass(model, recorder, ids.numpy())
        params = recorder.rope()
        with capped_distances(model, C, params.inv_freq), torch.inference_mode():
            recorder.reset(T)
            out = model(input_ids=ids, output_attentions=True)
    pos = torch.arange(T)
    for layer, weights in enumerate(out.attentions):
        w = capped_logits(
            recorder.q[layer],
            recorder.k[layer][:, params.kv_group],
            pos,
            torch.as_tensor(params.inv_freq[layer]),
            float(params.scaling[layer]),
            float(params.attention_scaling[layer]),
            distance_cap=C,
        )  # (2, H, T, T)
        mask = rope.causal_mask(T, int(params.sliding_window[layer]))
        expected = torch.softmax(w.masked_fill(~mask, float("-inf")), -1)
        torch.testing.assert_close(weights, expected, rtol=1e-4, atol=1e-6)
