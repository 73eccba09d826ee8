"""The Hugging Face Hub side of model acquisition (``hf:<org>/<repo>[@<revision>]``, posgen.models): the download
into the Hub cache, each failure as one line naming the source and the Hub it tried, and the check of every
acquired file against the hash the Hub lists for the resolved commit.

The Hub is ``HF_ENDPOINT`` where it is set (a site mirror: compute nodes without internet), else the public Hub;
``HF_TOKEN`` is sent to it (gated models) and written nowhere; ``HF_HUB_OFFLINE=1`` acquires from the Hub cache
alone (README "Models from the Hub").
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from posgen.model_source import ModelSourceError

# the HTTP clients' own errors (a refused connection, a response cut short) share no base class with OSError
TRANSPORT_MODULES = {"httpx", "httpx2", "httpcore", "httpcore2", "requests", "urllib3"}


def download(spec: str, patterns: list[str]) -> tuple[Path, dict | None]:
    """The files of ``<org>/<repo>[@<revision>]`` that match ``patterns``, downloaded into (or found in) the Hub
    cache: the snapshot folder (named by the resolved commit) and the hashes the Hub lists for the commit's files
    (:func:`listed_hashes`). Every failure is a :class:`ModelSourceError` of one line."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    repo, _, revision = spec.partition("@")
    token = os.environ.get("HF_TOKEN")
    try:
        path = snapshot_download(repo, revision=revision or None, allow_patterns=patterns, token=token)
    except (RepositoryNotFoundError, RevisionNotFoundError):
        raise ModelSourceError(not_found(spec, token)) from None
    except LocalEntryNotFoundError as err:
        raise ModelSourceError(unreachable(spec, err)) from None
    except HfHubHTTPError as err:
        status = getattr(err.response, "status_code", "?")
        raise ModelSourceError(
            f"hf:{spec}: the Hub at {endpoint()} answered HTTP {status} ({first_line(err)})"
        ) from None
    except Exception as err:
        if not is_transport_error(err):
            raise
        raise ModelSourceError(
            f"hf:{spec}: the download from {endpoint()} broke off ({type(err).__name__}: {first_line(err)}); "
            "run it again: the Hub cache resumes it and every file's hash is checked"
        ) from None
    return Path(path), listed_hashes(repo, Path(path).name, token)


def endpoint() -> str:
    """The Hub the client talks to: HF_ENDPOINT (a site mirror), else the public Hub."""
    from huggingface_hub import constants

    return constants.ENDPOINT


def first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [""])[0]


def is_transport_error(err: BaseException) -> bool:
    """A failed connection or a response cut short: OSError, or an error of the HTTP client's own."""
    modules = {klass.__module__.split(".")[0] for klass in type(err).__mro__}
    return isinstance(err, OSError) or bool(modules & TRANSPORT_MODULES)


def not_found(spec: str, token: str | None) -> str:
    """The one line of a repository or revision the Hub does not serve: the revision is named as what is missing
    when the repository answers (with its branches and tags), else the repository (or its gate)."""
    from huggingface_hub import HfApi

    repo, _, revision = spec.partition("@")
    if revision:
        try:
            refs = HfApi().list_repo_refs(repo, token=token)
        except Exception:  # noqa: BLE001 - any failure here means the repository itself does not answer
            refs = None
        if refs is not None:
            have = "; ".join(
                f"{kind}: {_some(sorted(ref.name for ref in of_kind))}"
                for kind, of_kind in (("branches", refs.branches), ("tags", refs.tags))
                if of_kind
            )
            return (
                f"hf:{spec}: no revision {revision!r} in {repo} at {endpoint()} (not a branch, tag or commit of it; "
                f"{have or 'it has no branches'})"
            )
    return f"hf:{spec}: repository {repo} not found at {endpoint()}, or gated (set HF_TOKEN for gated models)"


def _some(names: list[str], most: int = 8) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def unreachable(spec: str, err: BaseException) -> str:
    """The one line of a Hub that cannot be reached (or may not be: HF_HUB_OFFLINE) with no cached copy."""
    from huggingface_hub import constants

    offline = os.environ.get("HF_HUB_OFFLINE", "0")
    where = "HF_ENDPOINT" if os.environ.get("HF_ENDPOINT") else "HF_ENDPOINT unset: the public Hub"
    first = "acquire it first where the Hub can be reached: snakemake get_model"
    if constants.is_offline_mode():
        return (
            f"hf:{spec}: no cached copy in {constants.HF_HUB_CACHE} and HF_HUB_OFFLINE={offline} forbids the "
            f"download from {endpoint()} ({where}); {first}"
        )
    return (
        f"hf:{spec}: cannot reach the Hub at {endpoint()} ({where}) and no cached copy exists (HF_HUB_OFFLINE="
        f"{offline}; {type(err).__name__}); check HF_ENDPOINT, or {first}"
    )


def listed_hashes(repo: str, commit: str, token: str | None) -> dict[str, tuple[str, str]] | None:
    """The hash the Hub lists for each file of ``repo`` at ``commit``, by path: ("sha256", ...) of a Git LFS file
    (the weights), ("git-sha1", ...) of a file kept in git; None where the listing fails (offline, or a mirror
    without the tree API): the manifest then records ``hub_checked: false``."""
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    try:
        entries = list(HfApi().list_repo_tree(repo, revision=commit, recursive=True, token=token))
    except Exception:  # noqa: BLE001 - no listing is no check, recorded as such
        return None
    return {
        e.path: ("sha256", e.lfs.sha256) if e.lfs else ("git-sha1", e.blob_id)
        for e in entries
        if isinstance(e, RepoFile)
    }


def git_blob_sha1(path: Path) -> str:
    """The id git (and the Hub) gives a file's content: sha1 of ``blob <size>``, a NUL byte and the bytes."""
    data = Path(path).read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def check_download(source: str, folder: Path, hashes: dict, listed: dict | None) -> bool:
    """Every acquired file of ``folder`` (its sha256 in ``hashes``) against the hash the Hub lists for it: a
    download damaged in the Hub cache (a resumed transfer, a disk fault) stops in one line naming the cache folder
    to delete. False where the Hub's hashes could not be listed."""
    if listed is None:
        return False
    for name, digest in hashes.items():
        kind, recorded = listed.get(name, (None, None))
        if kind is None:
            continue
        actual = digest if kind == "sha256" else git_blob_sha1(folder / name)
        if actual != recorded:
            raise ModelSourceError(
                f"{source}: {name} from {endpoint()} has {kind} {actual[:12]}..., the Hub lists {recorded[:12]}... "
                f"(damaged in the Hub cache): delete {cache_folder(source)} and run again"
            )
    return True


def cache_folder(source: str) -> Path:
    """The Hub cache's folder of the repository of ``source``."""
    from huggingface_hub import constants

    repo = source.partition(":")[2].partition("@")[0]
    return Path(constants.HF_HUB_CACHE) / f"models--{repo.replace('/', '--')}"
