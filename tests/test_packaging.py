"""The package metadata: pyproject.toml as the installed setuptools reads it."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_pyproject_applies_without_deprecation_warnings() -> None:
    """setuptools applies pyproject.toml without a warning (a TOML-table ``license`` warns on
    every build step), the licence is an SPDX expression and its files exist."""
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    cwd = os.getcwd()
    os.chdir(REPO)  # setuptools resolves license-files and the readme from the project folder
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            dist = apply_configuration(Distribution(), REPO / "pyproject.toml")
    finally:
        os.chdir(cwd)
    assert dist.metadata.license_expression == "Apache-2.0"
    files = dist.metadata.license_files
    assert files and all((REPO / f).is_file() for f in files)
    assert "Apache License" in (REPO / "LICENSE").read_text()
