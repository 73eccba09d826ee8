"""Extraction on tiny random Llama and Gemma 3 checkpoints: self-check, store layout, capture transparency."""

import numpy as np
import pytest
import torch

from posgen import rope
from posgen.corpus import cut_windows, load_text
from posgen.llm.capture import BACKEND, Capture
from posgen.llm.extract import SelfCheckError, extract, verify_logits
from posgen.llm.options import ExtractOptions
from posgen.models import acquire, load_model
from posgen.store import open_dataset, read_rope, write_netcdf
from posgen.testing.tiny import tiny_job


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def extracted(request, tiny_source, tmp_path_factory):
    arch = request.param
    tmp = tmp_path_factory.mktemp(f"extract-{arch}")
    model_dir = tmp / "model"
    acquire(f"local:{tiny_source(arch)}", model_dir)
    _, tokenizer, _ = load_model(model_dir)
    write_netcdf(cut_windows(load_text("embedded"), tokenizer, 3, 40, 0, "embedded"), tmp / "windows.h5")
    out = {}
    for variant in ["trained", "random-seed0"]:
        extract(
            tiny_job(model_dir, tmp / "windows.h5", tmp / f"{variant}.h5", model=arch, variant=variant),
            ExtractOptions.defaults(ref_samples=[0, 2], ref_layers=[0, -1]),
        )
        out[variant] = open_dataset(tmp / f"{variant}.h5", lazy=False)
    return arch, model_dir, tmp, out


def test_store_has_named_dims_and_provenance(extracted):
    arch, _, _, out = extracted
    ds = out["trained"]
    assert set(ds.dims) == {
        "sample",
        "layer",
        "head",
        "kv_head",
        "token",
        "dim",
        "band",
        "ref_sample",
        "ref_layer",
        "query",
        "key",
    }
    assert ds.sizes["head"] == 4 and ds.sizes["kv_head"] == 2 and ds.sizes["dim"] == 16
    assert ds["kv_group"].values.tolist() == [0, 0, 1, 1]
    assert ds["ref_layer"].values.tolist() == [0, ds.sizes["layer"] - 1]
    for key in ["model_source", "weights_sha256", "torch_version", "transformers_version", "config_hash", "dtype"]:
        assert key in ds.attrs
    assert ds.attrs["init_seed"] == -1 and out["random-seed0"].attrs["init_seed"] == 0


def test_rerotated_store_reproduces_model_logits(extracted):
    """The self-check, redone independently from the file: rotate stored pre-RoPE q/k, compare."""
    _, _, _, out = extracted
    for ds in out.values():
        assert ds.attrs["self_check_max_rel_error"] <= 1e-4
        for rs in ds["ref_sample"].values:
            for layer in ds["ref_layer"].values:
                q = torch.from_numpy(ds["q"].sel(sample=rs, layer=layer).values)
                k = torch.from_numpy(ds["k"].sel(sample=rs, layer=layer).values)[ds["kv_group"].values]
                w = rope.logits(
                    q,
                    k,
                    torch.from_numpy(ds["inv_freq"].sel(layer=layer).values),
                    float(ds["scaling"].sel(layer=layer)),
                    float(ds["attention_scaling"].sel(layer=layer)),
                )
                ref = torch.from_numpy(ds["logits_ref"].sel(ref_sample=rs, ref_layer=layer).values)
                rel = torch.linalg.matrix_norm(w - ref) / torch.linalg.matrix_norm(ref)
                assert rel.max() <= 1e-4


def test_architecture_specific_rope_parameters(extracted):
    arch, _, _, out = extracted
    ds = out["trained"]
    inv = ds["inv_freq"].values
    # full rotary in the half layout: stored as is (identity permutation), every layer self-checked
    n_layers = ds.sizes["layer"]
    assert ds["rope_layout"].values.tolist() == ["half"] * n_layers
    assert ds["rotary_dims"].values.tolist() == [16] * n_layers
    np.testing.assert_array_equal(ds["dim_order"].values, np.tile(np.arange(16), (n_layers, 1)))
    assert np.isfinite(ds["self_check_rel_error"].values).all() and ds.attrs["self_check_tokens"] == 40
    assert ds.attrs["transparency_rel_error"] <= 1e-5 and ds.attrs["transparency_tokens"] == 40
    if arch == "gemma3":
        # local layers: window 16 and base 1e4; the global layer: no window and base 1e6
        assert ds["sliding_window"].values.tolist() == [16, 16, 0]
        np.testing.assert_allclose(inv[0, 1], 10000.0 ** (-2 / 16), rtol=1e-6)
        np.testing.assert_allclose(inv[2, 1], 1e6 ** (-2 / 16), rtol=1e-6)
        np.testing.assert_allclose(ds["scaling"].values, 16**-0.5)
        assert ds.attrs["capture_point"] == "q_norm/k_norm output"
    else:
        assert ds["sliding_window"].values.tolist() == [0, 0]
        np.testing.assert_allclose(inv[:, 1], 10000.0 ** (-2 / 16), rtol=1e-6)
        assert ds.attrs["capture_point"] == "q_proj/k_proj output"


def test_random_init_differs_from_trained_and_is_seeded(extracted):
    arch, model_dir, tmp, out = extracted
    assert not np.allclose(out["trained"]["q"].values, out["random-seed0"]["q"].values)
    np.testing.assert_array_equal(out["trained"]["token_id"].values, out["random-seed0"]["token_id"].values)
    extract(
        tiny_job(model_dir, tmp / "windows.h5", tmp / "again.h5", model=arch, variant="random-seed0"),
        ExtractOptions.defaults(),
    )
    np.testing.assert_array_equal(
        open_dataset(tmp / "again.h5", lazy=False)["q"].values, out["random-seed0"]["q"].values
    )


def test_self_check_names_layer_and_head_when_rope_is_wrong(extracted):
    _, _, _, out = extracted
    ds = out["trained"]
    layer = int(ds["ref_layer"][0])
    params = read_rope(ds)
    params.inv_freq[layer] *= 1.01
    refs = {layer: torch.from_numpy(ds["logits_ref"].isel(ref_sample=0, ref_layer=0).values)}
    with pytest.raises(SelfCheckError, match=rf"layer {layer} head 0: .*relative error"):
        verify_logits(ds["q"].isel(sample=0).values, ds["k"].isel(sample=0).values, params, refs, 1e-4)


def test_failed_extraction_leaves_no_output(extracted, monkeypatch):
    arch, model_dir, tmp, _ = extracted

    def broken(*args, **kwargs):
        raise SelfCheckError("self-check failed at layer 0 head 0 (injected)")

    monkeypatch.setattr("posgen.llm.extract.verify_logits", broken)
    with pytest.raises(SelfCheckError):
        extract(
            tiny_job(model_dir, tmp / "windows.h5", tmp / "broken.h5", model=arch, variant="trained"),
            ExtractOptions.defaults(),
        )
    assert not (tmp / "broken.h5").exists()
    assert not [p for p in tmp.iterdir() if p.name.endswith(".tmp")]


def test_capture_backend_leaves_model_outputs_unchanged(extracted):
    """Same logits as the stock SDPA and eager models: the causal mask (and window) survive the custom backend."""
    _, model_dir, _, _ = extracted
    ids = torch.randint(0, 400, (2, 40))
    outputs = {}
    for impl in ["sdpa", "eager", BACKEND]:
        model, _, _ = load_model(model_dir, attn_implementation=impl)
        with torch.inference_mode():
            outputs[impl] = model(input_ids=ids).logits
    torch.testing.assert_close(outputs[BACKEND], outputs["sdpa"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(outputs[BACKEND], outputs["eager"], rtol=1e-4, atol=1e-4)
    # and capturing does not perturb them either
    model, _, _ = load_model(model_dir, attn_implementation=BACKEND)
    with torch.inference_mode(), Capture(model, [0]) as cap:
        cap.reset(40, keep_logits=True)
        captured = model(input_ids=ids).logits
    torch.testing.assert_close(captured, outputs["sdpa"], rtol=1e-5, atol=1e-5)
    assert cap.q[0].shape == (2, 4, 40, 16) and cap.k[0].shape == (2, 2, 40, 16)
