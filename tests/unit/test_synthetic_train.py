"""The classifier trainer (posgen.synthetic.train): batches planned on the host, steps that read nothing back,
seeds trained as one batched ensemble with the results each would get alone, and mixed precision."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from posgen.schedule import warmup_cosine
from posgen.synthetic.ensemble import Ensemble
from posgen.synthetic.model import Classifier, batch_tokens
from posgen.synthetic.pe import PES
from posgen.synthetic.tasks import TEST, TRAIN, make_task
from posgen.synthetic.train import (
    accuracy,
    batch_plan,
    load_split,
    train,
    train_ensemble,
    used_lengths,
)

OPTIONS = {
    "vocab_size": 16,
    "test_fraction": 0.3,
    "distance": {"n_samples": 300, "max_side": 4, "max_middle": 6},
    "count": {"n_samples": 400, "seq_len": 12, "n_triggers": 3, "max_count": 6},
}
SIZES = dict(vocab_size=16, n_layers=2, n_heads=4, d_model=16, d_ff=32, rope_heads=1)
TRAINING = dict(batch_size=32, lr=3e-3, weight_decay=1e-5, warmup_fraction=0.1, betas=(0.9, 0.98))


def classifier(pe: str, seed: int, n_classes: int, max_len: int, dropout=0.0, faithful=False) -> Classifier:
    torch.manual_seed(seed)
    return Classifier(pe=pe, n_classes=n_classes, max_len=max_len, dropout=dropout, faithful=faithful, **SIZES)


def splits(task="distance"):
    data = make_task(task, OPTIONS, 0)
    sizes = (int(data.attrs["n_classes"]), int(data.sizes["token"]))
    return load_split(data, TRAIN, "cpu"), load_split(data, TEST, "cpu"), sizes


def test_batch_plan_widths_are_each_batchs_longest_sequence():
    (tokens, _), _, _ = splits()
    lengths = used_lengths(tokens)
    assert np.array_equal(lengths, [int(np.flatnonzero(row.numpy())[-1]) + 1 for row in tokens])
    perms = torch.stack([torch.randperm(len(tokens), generator=torch.Generator().manual_seed(s)) for s in (0, 1)])
    plan = batch_plan(perms, lengths, 32)
    assert [(a, b) for a, b, _ in plan] == [(a, min(a + 32, len(tokens))) for a in range(0, len(tokens), 32)]
    for first, last, width in plan:
        # the widest of what batch_tokens keeps for each member's batch
        assert width == max(batch_tokens(tokens[perms[m, first:last]], False).shape[1] for m in range(2))
    assert all(width == 0 for _, _, width in batch_plan(perms, None, 32))  # faithful: full width


class HostRead(AssertionError):
    pass


@pytest.mark.parametrize("pe", sorted(PES))
@pytest.mark.parametrize("members", [1, 2])
def test_a_step_reads_nothing_back_to_the_host(pe, members, monkeypatch):
    (tokens, labels), _, (n_classes, max_len) = splits()
    models = [classifier(pe, seed, n_classes, max_len, dropout=0.1) for seed in range(members)]
    ensemble = Ensemble(models)
    ensemble.train()
    optimizer = torch.optim.AdamW(ensemble.params.values(), lr=1e-3, fused=True)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: warmup_cosine(step, 10, 2))
    x = torch.stack([tokens[:16]] * members)  # (E, B, T)
    y = torch.stack([labels[:16]] * members)

    def refuse(*args, **kwargs):
        raise HostRead("a tensor was read back to the host inside the step")

    for method in ("item", "__float__", "__int__", "__bool__", "tolist"):
        monkeypatch.setattr(torch.Tensor, method, refuse)
    loss, correct = ensemble.step(x, y, optimizer, schedule)
    monkeypatch.undo()
    assert loss.shape == correct.shape == (members,)
    assert torch.isfinite(loss).all()
    with pytest.raises(HostRead):  # the patch does catch a read
        monkeypatch.setattr(torch.Tensor, "__float__", refuse)
        float(loss[0])


@pytest.mark.parametrize("pe", ["rope", "learned", "t5", "decoupled"])
def test_each_ensemble_member_trains_as_it_would_alone(pe):
    """Same initialisation, same data order, no dropout: the ensemble's member equals the lone training up to
    the rounding of batched products (and the wider pad trim, which the mask makes exact in arithmetic)."""
    train_set, test_set, (n_classes, max_len) = splits()
    seeds = [3, 5]
    alone = []
    for seed in seeds:
        model = classifier(pe, seed, n_classes, max_len)
        curves = train(model, train_set, test_set, epochs=2, seed=seed, **TRAINING)
        alone.append((model, curves))
    together = [classifier(pe, seed, n_classes, max_len) for seed in seeds]
    curves = train_ensemble(together, seeds, train_set, test_set, epochs=2, **TRAINING)
    for (model, lone), member, joint in zip(alone, together, curves, strict=True):
        for (name, want), (_, got) in zip(model.state_dict().items(), member.state_dict().items(), strict=True):
            if name.endswith("key.bias"):
                # softmax ignores q . b_k (the same for every key): its exact gradient is 0, and Adam turns the
                # rounding left in its place into full-size steps, differently in any two runs
                continue
            torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-3, msg=name)
        torch.testing.assert_close(member.eval()(test_set[0]), model.eval()(test_set[0]), atol=1e-4, rtol=1e-3)
        np.testing.assert_allclose(joint["train_loss"], lone["train_loss"], rtol=1e-4)
        assert joint["members"] == 2 and lone["members"] == 1
    # the members did not train as one model: their weights differ
    assert not torch.allclose(together[0].head.weight, together[1].head.weight)
    # the member modules hold their current weights (views of the ensemble's stacks), and save as themselves
    state = together[0].state_dict()
    assert all(v.untyped_storage().nbytes() > v.numel() * v.element_size() for v in state.values() if v.numel() > 4)


@pytest.mark.parametrize("faithful", [False, True])
def test_written_out_attention_trains_to_sdpas_bits(faithful):
    """With dropout on a CPU a training step writes attention out (posgen.synthetic.model.written_out_attention);
    every PE, from one seed, trained on padded batches with SDPA throughout instead: the same weights, bit for bit
    (the same operations in the same order, the same dropout draws)."""
    (tokens, labels), _, (n_classes, max_len) = splits()
    x, y = tokens[:32], labels[:32]  # clean: pads masked as keys; faithful: pads attended
    for pe in sorted(PES):
        states = []
        for attention in ("auto", "sdpa"):
            model = classifier(pe, 0, n_classes, max_len, dropout=0.1, faithful=faithful).use_attention(attention)
            optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, fused=True)
            torch.manual_seed(1)  # the dropout draws
            for _ in range(3):
                loss = torch.nn.functional.cross_entropy(model(batch_tokens(x, faithful)), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            states.append(model.state_dict())
        auto, sdpa = states
        assert all(torch.equal(auto[name], sdpa[name]) for name in auto), pe
        assert not torch.equal(auto["head.weight"], classifier(pe, 0, n_classes, max_len).state_dict()["head.weight"])
    with pytest.raises(ValueError, match="attention: 'flash'"):
        model.use_attention("flash")


def test_written_out_attention_is_what_a_cpu_training_step_runs(monkeypatch):
    """The written-out form runs exactly when dropout is on and the device is a CPU (so evaluation keeps SDPA)."""
    import posgen.synthetic.model as model_module

    calls = []
    written = model_module.written_out_attention
    monkeypatch.setattr(model_module, "written_out_attention", lambda *a: calls.append(a[-1]) or written(*a))
    (tokens, _), _, (n_classes, max_len) = splits()
    model = classifier("rope", 0, n_classes, max_len, dropout=0.1)
    model.train()(tokens[:8])
    assert calls == [0.1, 0.1]  # both layers
    model.eval()(tokens[:8])
    assert calls == [0.1, 0.1]  # evaluation: SDPA
    classifier("rope", 0, n_classes, max_len, dropout=0.0).train()(tokens[:8])
    assert calls == [0.1, 0.1]  # no dropout: SDPA


def test_bfloat16_training_matches_float32_accuracy():
    """Stated margin: 5 points of test accuracy on a small count task both precisions learn (same seed, same
    data order); bfloat16 autocasts the forward pass only, weights and optimiser stay float32."""
    train_set, test_set, (n_classes, max_len) = splits("count")
    results = {}
    for precision in ("float32", "bfloat16"):
        model = classifier("nope", 0, n_classes, max_len)
        train(model, train_set, test_set, epochs=12, seed=0, precision=precision, **TRAINING)
        assert all(p.dtype == torch.float32 for p in model.parameters())
        results[precision] = accuracy(model, *test_set)
    chance = 1 / n_classes
    assert results["float32"] > 3 * chance, results  # the task is learned, so the comparison means something
    assert abs(results["bfloat16"] - results["float32"]) <= 0.05, results


def test_unknown_precision_names_the_key():
    train_set, test_set, (n_classes, max_len) = splits()
    with pytest.raises(ValueError, match="synthetic.train.precision"):
        train(
            classifier("nope", 0, n_classes, max_len),
            train_set,
            test_set,
            epochs=1,
            seed=0,
            precision="fp8",
            **TRAINING,
        )


def test_steps_and_epochs_count_as_before():
    train_set, test_set, (n_classes, max_len) = splits()
    seen = []
    model = classifier("nope", 0, n_classes, max_len)
    curves = train(
        model,
        train_set,
        test_set,
        epochs=2,
        seed=0,
        snapshot_steps=[0, 3, 10**6],
        snapshot=lambda m: seen.append(m.training) or len(seen),
        **TRAINING,
    )
    assert len(curves["train_loss"]) == 2 and sorted(curves["snapshots"]) == [0, 3, 10**6]
    assert curves["lr_factor"][-1] == warmup_cosine(
        2 * math.ceil(len(train_set[1]) / 32) - 1, 2 * math.ceil(len(train_set[1]) / 32), 1
    )


def test_a_compiled_step_trains_as_the_eager_one():
    """torch.compile of one classifier (issue 52 item 5, the benches' compiled rate): same initialisation and data
    order, no dropout, two epochs: the weights and the curves of eager training up to the compiler's reordering of
    float32 sums. An ensemble refuses it with one line."""
    train_set, test_set, (n_classes, max_len) = splits()
    eager, compiled = (classifier("rope", 3, n_classes, max_len) for _ in range(2))
    lone = train(eager, train_set, test_set, epochs=2, seed=3, **TRAINING)
    fused = train(compiled, train_set, test_set, epochs=2, seed=3, compiled=True, **TRAINING)
    for (name, want), (_, got) in zip(eager.state_dict().items(), compiled.state_dict().items(), strict=True):
        if name.endswith("key.bias"):  # its exact gradient is 0: Adam scales rounding to full steps (see above)
            continue
        torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-3, msg=name)
    np.testing.assert_allclose(fused["train_loss"], lone["train_loss"], rtol=1e-4)
    two = [classifier("rope", seed, n_classes, max_len) for seed in (0, 1)]
    with pytest.raises(ValueError, match="one classifier at a time"):
        Ensemble(two, compiled=True)
