"""GGUF files from the Hugging Face Hub: ``--quickstart`` and ``--model REPO[:FILE]``.

Files land in (and are read from) the standard Hugging Face cache, so HF_HOME / HF_HUB_CACHE are
honoured and a file fetched by ``hf download`` is reused. ``huggingface_hub`` is imported only
here, never on the local-file cold path.

Offline (HF_HUB_OFFLINE=1, or the Hub unreachable) a cached file is used without any network
call; a missing one is a one-line error naming the ``hf download`` command that fetches it.
Every wait for the Hub to answer is bounded: a deadline on listing a repository and on the
file's metadata (asked without retries before the download: for a file not in the cache,
huggingface_hub retries a Hub that accepts connections but never answers for minutes), and
HF_HUB_ETAG_TIMEOUT / HF_HUB_DOWNLOAD_TIMEOUT (default 10 s) on each request. Behind an HTTP(S)
proxy (the standard variables) the direct connection probe is skipped: the proxy reaches the Hub.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from pathlib import Path
from typing import Any, Callable

from .errors import ReflexError, pip_install

# The one place the default model is named.
DEFAULT_REPO = "Qwen/Qwen3-0.6B-GGUF"
DEFAULT_FILE = "Qwen3-0.6B-Q8_0.gguf"

LIST_DEADLINE_S = 20.0
ASK_DEADLINE_S = 12.0  # the file's metadata, before a download
PREFERRED = ("q8_0", "q4_k_m")
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)


def parse_spec(spec: str) -> tuple[str, str | None]:
    """``"org/name[:file.gguf]"`` -> (repo, file or None)."""
    repo, _, fname = spec.partition(":")
    repo, fname = repo.strip(), fname.strip() or None
    if not re.fullmatch(r"[\w.\-]+/[\w.\-]+", repo):
        raise ReflexError(f"--model {spec!r}: expected a Hugging Face repository as ORG/NAME "
                          "(optionally ORG/NAME:FILE.gguf)")
    if fname is not None and not fname.lower().endswith(".gguf"):
        raise ReflexError(f"--model {spec!r}: {fname!r} is not a .gguf file")
    return repo, fname


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _cache_dir() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def hf_command() -> str:
    """How the user runs huggingface_hub's ``hf`` command from their shell: ``hf`` when it is on
    PATH, else the script installed next to this interpreter (a venv's bin/, not on PATH unless
    the venv is activated)."""
    import shlex
    import shutil

    beside = Path(sys.executable).parent / "hf"
    on_path = shutil.which("hf")
    if on_path and (not beside.is_file() or Path(on_path).resolve() == beside.resolve()):
        return "hf"
    if beside.is_file() and os.access(beside, os.X_OK):
        return shlex.quote(str(beside))
    return f"{shlex.quote(sys.executable)} -m huggingface_hub.cli.hf"


def download_command(repo: str, fname: str | None, revision: str | None) -> str:
    """The shell command that fetches ``repo``'s ``fname`` (None: its GGUF files), each word
    quoted as the shell needs it."""
    import shlex

    cmd = f"{hf_command()} download {shlex.quote(repo)}" + (
        f" {shlex.quote(fname)}" if fname else " --include '*.gguf'")
    return cmd + (f" --revision {shlex.quote(revision)}" if revision else "")


def _unreadable(e: OSError) -> ReflexError:
    return ReflexError(f"cannot read the Hugging Face cache ({_cache_dir()}): "
                       f"{e.strerror or e}{f': {e.filename}' if e.filename else ''}")


def _cached_snapshot(repo: str, revision: str | None) -> Path | None:
    """The cache's snapshot folder of ``repo`` at ``revision`` (a branch, tag or commit)."""
    root = _cache_dir() / ("models--" + repo.replace("/", "--"))
    rev = revision or "main"
    ref = root / "refs" / rev
    try:
        commit = ref.read_text().strip() if ref.is_file() else rev
        snap = root / "snapshots" / commit
        return snap if snap.is_dir() else None
    except OSError as e:
        raise _unreadable(e) from None


def _cached_ggufs(repo: str, revision: str | None) -> list[str]:
    snap = _cached_snapshot(repo, revision)
    if snap is None:
        return []
    try:
        return sorted(str(p.relative_to(snap)) for p in snap.rglob("*.gguf") if p.exists())
    except OSError as e:
        raise _unreadable(e) from None


def choose_file(files: list[str], repo: str) -> tuple[str, str | None]:
    """Pick the GGUF to run among a repository's files -> (file, notice or None)."""
    ggufs = [f for f in files if f.lower().endswith(".gguf")]
    if not ggufs:
        raise ReflexError(f"{repo} has no .gguf file")
    if len(ggufs) == 1:
        return ggufs[0], None
    whole = [f for f in ggufs if not _SPLIT.search(f)]
    for pref in PREFERRED:
        hits = [f for f in whole if pref in Path(f).name.lower()]
        if hits:
            pick = sorted(hits, key=len)[0]
            return pick, (f"notice: {repo} has {len(ggufs)} GGUF files; using {pick} "
                          f"(choose another with --model {repo}:FILE)")
    if any(pref in Path(f).name.lower() for f in ggufs for pref in PREFERRED):
        raise ReflexError(f"{repo}'s Q8_0 and Q4_K_M GGUFs are split files, which are not "
                          f"supported: download one's parts, merge them with llama-gguf-split "
                          f"--merge and run the merged file")
    listing = ", ".join(ggufs[:8]) + (" ..." if len(ggufs) > 8 else "")
    raise ReflexError(f"{repo} has {len(ggufs)} GGUF files and none is Q8_0 or Q4_K_M; "
                      f"name one with --model {repo}:FILE (files: {listing})")


def _refuse_split(repo: str, fname: str) -> None:
    m = _SPLIT.search(fname)
    if m:
        raise ReflexError(
            f"{repo}:{fname} is part {int(m.group(1))} of a {int(m.group(2))}-part split GGUF; "
            "split files are not supported: merge the parts with llama-gguf-split --merge and "
            "run the merged file, or choose a single-file quantization")


def _with_deadline(fn: Callable[[], Any], seconds: float, what: str) -> Any:
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised below
            box["error"] = e

    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(seconds)
    if th.is_alive():
        raise TimeoutError(f"{what} took longer than {seconds:.0f} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def _is_network_error(e: BaseException) -> bool:
    names = {c.__name__ for c in type(e).__mro__}
    return bool(names & {"ConnectionError", "ConnectError", "Timeout", "TimeoutError",
                         "TimeoutException", "OfflineModeIsEnabled", "NetworkError",
                         "ReadTimeout", "ConnectTimeout", "OSError"})


def _hub_reachable(seconds: float = 5.0) -> bool:
    """Can we open a TCP connection to the Hub's endpoint? (DNS and connect, bounded.)

    huggingface_hub retries a failing listing with back-off for ~20 s and logs each attempt; a
    quick probe first turns a dead network into an immediate fall-back to the cache."""
    import socket
    import urllib.request
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if urllib.request.getproxies():  # the proxy connects to the Hub, not us
        return True
    url = urlparse(constants.ENDPOINT)
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    try:
        _with_deadline(lambda: socket.create_connection((host, port), timeout=seconds).close(),
                       seconds + 1, f"connecting to {host}")
        return True
    except Exception:  # noqa: BLE001 - any failure means: not reachable now
        return False


def _ask_hub(repo: str, fname: str, revision: str | None) -> None:
    """The file's metadata from the Hub, one request without retries, within ASK_DEADLINE_S:
    raises what huggingface_hub raises for a missing repository, revision or file, TimeoutError
    when the Hub does not answer."""
    import huggingface_hub

    url = huggingface_hub.hf_hub_url(repo, fname, revision=revision)
    _with_deadline(lambda: huggingface_hub.get_hf_file_metadata(url),
                   ASK_DEADLINE_S, f"asking the Hub for {repo}:{fname}")


def resolve(spec: str | None, revision: str | None = None, quickstart: bool = False,
            log: Callable[[str], None] | None = None) -> str:
    """Local path of the GGUF named by ``--model spec`` (or the default model for --quickstart),
    downloading it into the Hugging Face cache if needed."""
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    if quickstart:
        repo, fname = DEFAULT_REPO, DEFAULT_FILE
    else:
        repo, fname = parse_spec(spec or "")
    os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", "10")
    os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", "10")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    try:
        import huggingface_hub
        from huggingface_hub import errors as hf_errors
    except ImportError as e:
        raise ReflexError(f"--model/--quickstart need huggingface_hub ({e}); "
                          f"{pip_install('huggingface_hub')}") from e

    from huggingface_hub.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # our errors are one line; no retry chatter
    offline = _offline()
    reachable = not offline and _hub_reachable()
    if fname is None:
        files: list[str] | None = None
        if reachable:
            try:
                files = _with_deadline(
                    lambda: huggingface_hub.HfApi().list_repo_files(repo, revision=revision),
                    LIST_DEADLINE_S, f"listing {repo} on the Hub")
            except hf_errors.RepositoryNotFoundError:
                raise ReflexError(f"no such repository on the Hugging Face Hub: {repo} (or it "
                                  f"is private/gated: log in with {hf_command()} auth login)"
                                  ) from None
            except hf_errors.RevisionNotFoundError:
                raise ReflexError(f"{repo} has no revision {revision!r}") from None
            except Exception as e:  # noqa: BLE001 - unreachable Hub: use the cache
                if not _is_network_error(e) and not isinstance(e, hf_errors.HfHubHTTPError):
                    raise
                files, reachable = None, False  # no more waits for it
        if files is None:
            files = _cached_ggufs(repo, revision)
            if not files:
                why = "offline (HF_HUB_OFFLINE=1)" if offline else "the Hub is unreachable"
                raise ReflexError(f"no GGUF of {repo} in the Hugging Face cache ({_cache_dir()}) "
                                  f"and {why}; download one with: "
                                  f"{download_command(repo, None, revision)}")
        fname, notice = choose_file(files, repo)
        if notice:
            log(notice)
    _refuse_split(repo, fname)

    def cached(why: str) -> str:
        try:
            return huggingface_hub.hf_hub_download(repo, fname, revision=revision,
                                                   local_files_only=True)
        except hf_errors.LocalEntryNotFoundError as e:  # (also an OSError)
            raise ReflexError(f"{repo}:{fname} is not in the Hugging Face cache "
                              f"({_cache_dir()}) and {why}; download it with: "
                              f"{download_command(repo, fname, revision)}") from e
        except OSError as e:
            raise _unreadable(e) from None

    if not reachable:
        return cached("HF_HUB_OFFLINE=1 forbids downloading" if offline
                      else "the Hub is unreachable")
    try:
        _ask_hub(repo, fname, revision)
        return huggingface_hub.hf_hub_download(repo, fname, revision=revision)
    except hf_errors.RepositoryNotFoundError:
        raise ReflexError(f"no such repository on the Hugging Face Hub: {repo} "
                          f"(or it is private/gated: log in with {hf_command()} auth login)") from None
    except hf_errors.RevisionNotFoundError:
        raise ReflexError(f"{repo} has no revision {revision!r}") from None
    except hf_errors.LocalEntryNotFoundError:  # (a subclass of EntryNotFoundError)
        return cached("the Hub is unreachable")
    except hf_errors.EntryNotFoundError:
        raise ReflexError(f"{repo} has no file {fname} (list its files on "
                          f"https://huggingface.co/{repo}/tree/{revision or 'main'})") from None
    except Exception as e:  # noqa: BLE001
        if _is_network_error(e) or isinstance(e, hf_errors.HfHubHTTPError):
            return cached(f"the download failed ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''})")
        raise
