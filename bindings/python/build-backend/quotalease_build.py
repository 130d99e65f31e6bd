"""The PEP 517 build backend of the quotalease sdist: maturin's, except that
with no cargo on PATH every hook stops with a message saying what to do.

maturin >= 1.9, finding no cargo, asks pip for `puccinialin` and downloads a
whole Rust toolchain into a temporary directory, unless
MATURIN_NO_INSTALL_RUST is set. A user who meant to install a prebuilt wheel
should learn that no wheel fits and that building needs Rust, not wait for a
toolchain. pyproject.toml names this module (`build-backend`, `backend-path`);
the sdist carries it (`[tool.maturin] include`).
"""

import importlib
import os
import shutil
import sys
from typing import Any

# maturin's hooks read it when called: none of them asks for or runs the download.
os.environ["MATURIN_NO_INSTALL_RUST"] = "1"

_maturin = importlib.import_module("maturin")

NO_CARGO = """
quotalease: building from source needs Rust's cargo on PATH, and there is none.
  pip builds the sdist when no quotalease wheel fits (the wheel is for CPython
  >= 3.11 on x86_64 Linux with glibc >= 2.17), or when told to (--no-binary).
  Either install the wheel, or install Rust >= 1.85 (https://rustup.rs or your
  distribution's cargo package) so that `cargo --version` works, and run pip again.
  This build does not download a Rust toolchain by itself.
"""


def _require_cargo() -> None:
    if shutil.which("cargo") is None:
        sys.stderr.write(NO_CARGO)
        sys.stderr.flush()
        raise SystemExit(1)


def get_requires_for_build_wheel(config_settings: Any = None) -> Any:
    _require_cargo()
    return _maturin.get_requires_for_build_wheel(config_settings)


def get_requires_for_build_editable(config_settings: Any = None) -> Any:
    _require_cargo()
    return _maturin.get_requires_for_build_editable(config_settings)


def get_requires_for_build_sdist(config_settings: Any = None) -> Any:
    _require_cargo()
    return _maturin.get_requires_for_build_sdist(config_settings)


def prepare_metadata_for_build_wheel(metadata_directory: str, config_settings: Any = None) -> Any:
    _require_cargo()
    return _maturin.prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def build_wheel(wheel_directory: str, config_settings: Any = None, metadata_directory: Any = None) -> Any:
    _require_cargo()
    return _maturin.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory: str, config_settings: Any = None, metadata_directory: Any = None) -> Any:
    _require_cargo()
    return _maturin.build_editable(wheel_directory, config_settings, metadata_directory)


def build_sdist(sdist_directory: str, config_settings: Any = None) -> Any:
    _require_cargo()
    return _maturin.build_sdist(sdist_directory, config_settings)


def prepare_metadata_for_build_editable(metadata_directory: str, config_settings: Any = None) -> Any:
    _require_cargo()
    return _maturin.prepare_metadata_for_build_editable(metadata_directory, config_settings)
