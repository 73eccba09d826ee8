"""A Hugging Face Hub on the loopback address, for the tests of the ``hf:`` path and for trying it by hand: olah (a
self-hosted Hub mirror, pinned, in a virtual environment of its own: it pins its own huggingface_hub) serving
local git repositories offline, behind a small proxy that records what every request sent (the token) and can
stop the whole server in the middle of a file's download.

- :func:`olah_cli`: olah's command in ``.hub/olah-venv``, installed there first where it is missing.
- :func:`commit_files`, :func:`build_repos`: git repositories laid out as olah serves them
  (``<mirrors>/models/<org>/<repo>``, ``<mirrors>/datasets/<org>/<repo>``), weights stored as Git LFS objects as
  on the Hub.
- :class:`HubMirror`: olah and the proxy, started and stopped; :attr:`HubMirror.endpoint` is what HF_ENDPOINT names.
- ``python -m posgen.testing.hub_mirror install``: olah into ``.hub/olah-venv`` (``make setup-hub``).
- ``python -m posgen.testing.hub_mirror serve``: the test repositories served until Ctrl-C (README "Models from
  the Hub").
- ``python -m posgen.testing.hub_mirror acquire SOURCE DEST``: posgen.models.acquire in a process of its own (the
  Hub client reads HF_ENDPOINT when it is imported), a ModelSourceError as its one line, as a workflow job says it.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

OLAH = "olah==0.5.4"
VENV = Path(__file__).resolve().parents[3] / ".hub" / "olah-venv"  # the checkout's, ignored by git
INSTALL_HINT = f"make setup-hub (or: python3 -m venv {VENV} && {VENV}/bin/pip install {OLAH})"
MODEL_REPO = "acme/tiny-llama"  # commits step0, step10 (tag v1), main; branches step0 and step10
DATASET_REPO = "acme/docs"  # the embedded corpus's documents as JSON lines, field "text"
LFS = (".safetensors", ".bin")  # stored as Git LFS objects, as the Hub stores weights


class OlahMissing(RuntimeError):
    """olah is not installed and could not be: the message says how to install it."""


def olah_cli(venv: Path = VENV, install: bool = True) -> Path:
    """olah's command in ``venv``, installed there first (pinned) where it is missing and ``install`` is set."""
    cli = Path(venv) / "bin" / "olah-cli"
    if cli.is_file():
        return cli
    if not install:
        raise OlahMissing(f"olah is not installed: {INSTALL_HINT}")
    from filelock import FileLock

    venv.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(venv) + ".lock"):
        if cli.is_file():
            return cli
        python = Path(venv) / "bin" / "python"
        steps = [
            [sys.executable, "-m", "venv", "--clear", str(venv)],
            [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--retries", "1", OLAH],
        ]
        for step in steps:
            proc = subprocess.run(step, capture_output=True, text=True, timeout=600)
            if proc.returncode != 0:
                shutil.rmtree(venv, ignore_errors=True)
                said = (proc.stderr.strip().splitlines() or ["no output"])[-1]
                raise OlahMissing(f"olah could not be installed ({said}): {INSTALL_HINT}")
    return cli


# ---------------------------------------------------------------------------------------- repositories


def _git(repo: Path, *args: str) -> str:
    identity = ["-c", "user.name=posgen-test", "-c", "user.email=posgen-test@localhost", "-c", "commit.gpgsign=false"]
    proc = subprocess.run(["git", "-C", str(repo), *identity, *args], capture_output=True, text=True, check=True)
    return proc.stdout.strip()


def commit_files(repo: Path, files: dict[str, bytes], message: str) -> str:
    """Commit ``files`` (name -> bytes) as the whole content of git repository ``repo`` (made where missing, branch
    main); weights as Git LFS pointers with their objects in ``.git/lfs/objects``. Returns the commit."""
    if not (repo / ".git").is_dir():
        repo.mkdir(parents=True, exist_ok=True)
        _git(repo, "init", "-q", "-b", "main")
    for old in _git(repo, "ls-files").splitlines():
        if old not in files:
            _git(repo, "rm", "-q", old)
    for name, data in files.items():
        path = repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if name.endswith(LFS):
            oid = hashlib.sha256(data).hexdigest()
            stored = repo / ".git" / "lfs" / "objects" / oid[:2] / oid[2:4] / oid
            stored.parent.mkdir(parents=True, exist_ok=True)
            stored.write_bytes(data)
            data = f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {len(data)}\n".encode()
        path.write_bytes(data)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "--allow-empty", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


def _files(folder: Path) -> dict[str, bytes]:
    """The files of checkpoint ``folder`` by name (not its hidden ones: a test fixture's marker)."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and not p.name.startswith(".")}


def _scaled(folder: Path, scale: float) -> dict[str, bytes]:
    """The files of checkpoint ``folder``, its weights multiplied by ``scale`` (another checkpoint step)."""
    from safetensors.torch import load_file, save

    files = _files(folder)
    weights = load_file(folder / "model.safetensors")
    files["model.safetensors"] = save({k: v * scale for k, v in weights.items()}, metadata={"format": "pt"})
    return files


def build_repos(mirrors: Path, tiny: Path) -> dict[str, str]:
    """The test Hub's repositories under ``mirrors``, from the tiny checkpoint folder ``tiny``:

    - ``acme/tiny-llama``: commits step0 and step10 (weights x2; tag v1), then main (a model card added); branches
      step0 and step10 (a checkpoint series);
    - ``acme/tiny-pickle``: its weights only as ``pytorch_model.bin``;
    - ``acme/tiny-custom``: config.json asks for the model's own code (auto_map, ``custom_llama.py``);
    - dataset ``acme/docs``: ``data/train.jsonl``, the embedded corpus's documents, field ``text``.

    Returns revision -> commit of ``acme/tiny-llama`` (step0, step10, v1, main)."""
    import torch
    from safetensors.torch import load_file

    from posgen.corpus import load_documents

    repo = mirrors / "models" / MODEL_REPO
    commits = {"step0": commit_files(repo, _scaled(tiny, 1.0), "step0")}
    commits["step10"] = commits["v1"] = commit_files(repo, _scaled(tiny, 2.0), "step10")
    _git(repo, "tag", "v1")
    card = b"---\nlicense: mit\n---\n# tiny-llama\n\nA tiny random Llama for posgen's tests.\n"
    commits["main"] = commit_files(repo, {**_scaled(tiny, 2.0), "README.md": card}, "model card")
    for step in ("step0", "step10"):
        _git(repo, "branch", step, commits[step])

    plain = {name: data for name, data in _files(tiny).items() if not name.endswith(".safetensors")}
    buffer = mirrors / "pickle.tmp"
    torch.save(load_file(tiny / "model.safetensors"), buffer)
    commit_files(
        mirrors / "models" / "acme" / "tiny-pickle", {**plain, "pytorch_model.bin": buffer.read_bytes()}, "bin"
    )
    buffer.unlink()

    config = json.loads((tiny / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "custom_llama.CustomLlamaForCausalLM"}
    code = b"from transformers import LlamaForCausalLM\n\n\nclass CustomLlamaForCausalLM(LlamaForCausalLM):\n    pass\n"
    custom = {**_scaled(tiny, 1.0), "config.json": json.dumps(config).encode(), "custom_llama.py": code}
    commit_files(mirrors / "models" / "acme" / "tiny-custom", custom, "custom code")

    lines = "".join(json.dumps({"text": text}) + "\n" for text in load_documents("embedded"))
    docs = {"README.md": b"---\nlicense: mit\n---\n# docs\n", "data/train.jsonl": lines.encode()}
    commit_files(mirrors / "datasets" / DATASET_REPO, docs, "documents")
    return commits


# ---------------------------------------------------------------------------------------- the server


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Seen:
    """A request the proxy forwarded: method, path and headers (names in lower case) as the client sent them."""

    method: str
    path: str
    headers: dict[str, str]


class HubMirror:
    """olah serving the git repositories under ``mirrors`` offline on 127.0.0.1, behind a recording proxy at
    :attr:`endpoint` (the same port across :meth:`stop` and :meth:`start`). ``folder`` holds olah's config, cache
    and log."""

    def __init__(self, cli: Path, mirrors: Path, folder: Path, port: int | None = None):
        self.cli, self.mirrors, self.folder = Path(cli), Path(mirrors), Path(folder)
        self.port = port or free_port()
        self.seen: list[Seen] = []
        self._process: subprocess.Popen | None = None
        self._proxy: ThreadingHTTPServer | None = None
        self._cut: tuple[str, int] | None = None
        self._lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.folder / "olah.log"

    def start(self, timeout: float = 60) -> HubMirror:
        if self._process is not None or self._proxy is not None:
            raise RuntimeError(f"the Hub mirror at {self.endpoint} is running already")
        self.folder.mkdir(parents=True, exist_ok=True)
        self.olah_port = free_port()
        here = f"127.0.0.1:{self.port}"  # olah's redirects name the proxy, so that every request passes it
        config = self.folder / "olah.toml"
        config.write_text(
            f'[basic]\nhost = "127.0.0.1"\nport = {self.olah_port}\nmirror-netloc = "{here}"\n'
            f'mirror-lfs-netloc = "{here}"\nmirrors-path = [{json.dumps(str(self.mirrors))}]\n'
            f"repos-path = {json.dumps(str(self.folder / 'cache'))}\n[accessibility]\noffline = true\n"
        )
        with open(self.log, "ab") as log:
            self._process = subprocess.Popen(
                [str(self.cli), "-c", str(config), "--log-path", str(self.folder / "logs")],
                cwd=self.folder,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while not _answers(self.olah_port):
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = self.log.read_text(errors="replace").strip().splitlines()[-5:]
                raise RuntimeError(f"olah did not start on 127.0.0.1:{self.olah_port}: {' | '.join(tail)}")
            time.sleep(0.2)
        try:
            self._proxy = ThreadingHTTPServer(("127.0.0.1", self.port), _Forward)
        except OSError:
            self.stop()  # olah goes with it
            raise
        self._proxy.daemon_threads = True
        self._proxy.mirror = self
        threading.Thread(target=self._proxy.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop olah and close the endpoint (a client then finds nothing listening)."""
        with self._lock:
            proxy, self._proxy = self._proxy, None
            process, self._process = self._process, None
        if proxy is not None:
            proxy.shutdown()
            proxy.server_close()
        if process is not None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def stop_during(self, suffix: str, after: int) -> None:
        """Stop the whole server once ``after`` bytes of the next GET of a path ending in ``suffix`` are sent."""
        self._cut = (suffix, after)

    def env(self, home: Path, **extra: str) -> dict[str, str]:
        """The environment of a Hub client of this server: HF_ENDPOINT, the Hub's cache and home in ``home`` (no
        token, no offline flag of the caller's), telemetry and progress bars off."""
        env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE")}
        return env | {
            "HF_ENDPOINT": self.endpoint,
            "HF_HOME": str(home),
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            **extra,
        }

    def __enter__(self) -> HubMirror:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade", "date", "server"}


class _Forward(BaseHTTPRequestHandler):
    """The proxy: each request recorded, forwarded to olah, its answer sent back whole (one request per
    connection); a GET that :meth:`HubMirror.stop_during` names is cut short and the server stopped."""

    protocol_version = "HTTP/1.0"

    def do_GET(self):
        self._forward()

    def do_HEAD(self):
        self._forward()

    def do_POST(self):
        self._forward()

    def log_message(self, *args) -> None:  # the access log is olah's
        pass

    def _forward(self) -> None:
        mirror: HubMirror = self.server.mirror
        mirror.seen.append(Seen(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) if self.command == "POST" else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP | {"host"}}
        upstream = http.client.HTTPConnection("127.0.0.1", mirror.olah_port, timeout=60)
        try:
            upstream.request(self.command, self.path, body=body, headers=headers)
            answer = upstream.getresponse()
            content = answer.read()
        except OSError:
            self.close_connection = True  # olah went away: the connection closes unanswered
            return
        finally:
            upstream.close()
        self.send_response(answer.status)
        for key, value in answer.getheaders():
            if key.lower() not in HOP_BY_HOP | ({"content-length"} if self.command != "HEAD" else set()):
                self.send_header(key, value)
        if self.command != "HEAD":
            self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        cut = mirror._cut
        if cut and self.command == "GET" and self.path.split("?")[0].endswith(cut[0]) and len(content) > cut[1]:
            mirror._cut = None
            self.wfile.write(content[: cut[1]])
            self.wfile.flush()
            mirror.stop()  # in the middle of the download: olah and the endpoint both gone
            self.close_connection = True
            return
        self.wfile.write(content)


# ---------------------------------------------------------------------------------------- the command line


def _acquire(args) -> int:
    from posgen.model_source import ModelSourceError
    from posgen.models import acquire

    try:
        manifest = acquire(
            args.source, args.dest, allow_pickle=args.allow_pickle, trust_remote_code=args.trust_remote_code
        )
    except ModelSourceError as err:
        print(f"ModelSourceError: {err}", file=sys.stderr)  # as a workflow job says it (workflow_scripts/_common)
        return 1
    print(json.dumps(manifest))
    return 0


def _serve(args) -> int:
    from posgen.testing.tiny import make_tiny

    folder = Path(args.folder).resolve()
    mirrors = folder / "mirrors"
    if not (mirrors / "models" / MODEL_REPO).is_dir():
        tiny = make_tiny(folder / "tiny-source")
        build_repos(mirrors, tiny)
    with HubMirror(olah_cli(), mirrors, folder / "server", port=args.port) as mirror:
        print(f"serving {MODEL_REPO} (branches main, step0, step10; tag v1) and dataset {DATASET_REPO}")
        print(f"export HF_ENDPOINT={mirror.endpoint}   # Ctrl-C stops the server", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m posgen.testing.hub_mirror", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("install", help=f"install {OLAH} into {VENV}")
    serve = commands.add_parser("serve", help="serve the test repositories on 127.0.0.1 until Ctrl-C")
    serve.add_argument("--port", type=int, default=8090)
    serve.add_argument("--folder", default=str(VENV.parent), help="where the repositories and olah's files go")
    get = commands.add_parser("acquire", help="posgen.models.acquire SOURCE into DEST")
    get.add_argument("source")
    get.add_argument("dest")
    get.add_argument("--allow-pickle", action="store_true")
    get.add_argument("--trust-remote-code", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "install":
        print(olah_cli())
        return 0
    return {"serve": _serve, "acquire": _acquire}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
